"""The single-turn producer: each step, draw prompts, sample G completions per prompt through the generator,
score them with the reward components, and (DAPO's dynamic sampling) keep drawing until enough groups have
informative (non-tied) rewards. It hands the policy-gradient and PPO loops a `Batch` around one `Rollout`
(rlx/rollout/types.py); the episode producer (rollout/episodes.py) is its multi-turn counterpart.
"""

from __future__ import annotations

import torch

from rlx.algorithms.advantages import tied_groups, zero_std_group_fraction
from rlx.data.tasks import PromptStream
from rlx.rewards import RewardComponent, TrainerState, compute_rewards, token_lists
from rlx.rollout.generator import Generator, sample_rollout
from rlx.rollout.prompts import format_prompts
from rlx.rollout.sampling import sample_seed
from rlx.rollout.types import Batch, Rollout
from rlx.runtime.parallel import gather, global_sum, shard


def sample_batch(generator: Generator, tokenizer, stream: PromptStream, rewards: list[RewardComponent], group_size: int, *,
                 step: int, prompts_per_step: int, max_new_tokens: int, min_new_tokens: int, seed: int,
                 use_chat_template: bool, system_prompt: str | None, on_error: str, accuracy_key: str, total_steps: int,
                 dynamic_sampling: bool, max_rounds: int, acc=None) -> Batch:
    """Generate and score `prompts_per_step` groups. With dynamic sampling, drop tied groups and draw
    the missing number of prompts again, for at most `max_rounds` rounds; if still short, fill with
    tied groups (zero advantage under group baselines) so the batch size stays fixed.
    Completion i drawn at this step is sampled with seed sample_seed(seed, step, i). `generator` samples
    through the generator protocol (rollout/generator.py: HFGenerator on the policy, or the vLLM engine;
    its temperature / top-p / top-k are rollout's), the one-turn case of the multi-turn rollouts: prompts
    are tokenized once and the Rollout is built from the sampled ids. With several processes (acc), every process
    draws the same prompts, generates and scores its own shard, and the rewards are gathered
    (dynamic sampling is single-process; train.py refuses the combination)."""
    wanted = prompts_per_step
    rollouts, all_rows, all_prompts, totals, components, errors = [], [], [], [], [], 0
    kept_groups, rounds = 0, 0
    while True:
        rows = stream.take(wanted - kept_groups if dynamic_sampling else wanted)
        mine = shard(len(rows), acc) if acc is not None else slice(0, len(rows))
        rows = rows[mine]
        prompts = format_prompts(tokenizer, rows, use_chat_template, system_prompt)
        first = sum(t.numel() for t in totals) + mine.start * group_size  # global index of this shard's first sample
        rollout = sample_rollout(
            generator, tokenizer, prompts, samples_per_prompt=group_size, max_new_tokens=max_new_tokens,
            seeds=[sample_seed(seed, step, first + i) for i in range(len(prompts) * group_size)],
            min_new_tokens=min_new_tokens,
        )
        sample_rows = [row for row in rows for _ in range(group_size)]
        if any(c.name == "overlong" for c in rewards):
            sample_rows = [dict(row, completion_tokens=int(n)) for row, n in zip(sample_rows, rollout.lengths)]
        sample_prompts = [p for p in prompts for _ in range(group_size)]
        total, per_component, round_errors = compute_rewards(
            rewards, sample_prompts, rollout.texts, sample_rows, on_error, system_prompt=system_prompt,
            completion_ids=token_lists(rollout.completion_ids, rollout.completion_mask),
            state=TrainerState(global_step=step, max_steps=total_steps))  # (n,)
        rollouts.append(rollout)
        all_rows += sample_rows
        all_prompts += sample_prompts
        totals.append(total)
        components.append(per_component)
        errors += round_errors
        rounds += 1
        if not dynamic_sampling:
            break
        kept_groups += int((~tied_groups(total, group_size)).sum())
        if kept_groups >= wanted or rounds >= max_rounds:
            break
    rollout = Rollout.cat(rollouts, tokenizer.pad_token_id)
    rewards_all = torch.cat(totals)  # (N_drawn,) this process
    per_component = {name: torch.cat([c[name] for c in components]) for name in components[0]}
    local = slice(0, rewards_all.numel())
    if acc is not None and acc.num_processes > 1:  # the global batch, in global sample order
        local = slice(acc.process_index * rewards_all.numel(), (acc.process_index + 1) * rewards_all.numel())
        rewards_all = gather(acc, rewards_all)  # (N,)
        per_component = {name: gather(acc, values) for name, values in per_component.items()}
        errors = int(global_sum(acc, errors))
    drawn_metrics = outcome_metrics(rewards_all, per_component, errors, rollout, accuracy_key, group_size, acc)
    filled = 0
    if dynamic_sampling:
        tied = tied_groups(rewards_all, group_size)  # (groups drawn,)
        informative = torch.nonzero(~tied).flatten()[:wanted]
        filled = wanted - len(informative)
        groups = torch.cat([informative, torch.nonzero(tied).flatten()[:filled]])  # (wanted,)
        index = (groups.unsqueeze(1) * group_size + torch.arange(group_size)).flatten()  # (wanted * G,)
        rollout = rollout.select(index)
        rewards_all = rewards_all[index]
        local = slice(0, rewards_all.numel())
        all_rows = [all_rows[i] for i in index.tolist()]
        all_prompts = [all_prompts[i] for i in index.tolist()]
    prompts_drawn = sum(len(t) for t in totals) // group_size
    return Batch(rollout, rewards_all, group_size, local, drawn_metrics, rows=all_rows, prompts=all_prompts,
                 prompts_drawn=prompts_drawn, rounds=rounds, filled_groups=filled)


def outcome_metrics(rewards, per_component, errors, rollout, accuracy_key, group_size, acc=None) -> dict:
    """reward/*, completions/* and train/frac_zero_std_groups over the samples drawn (all processes)."""
    n = rewards.numel()
    lengths = rollout.lengths.float()
    truncated = rollout.truncated.float()
    if acc is not None and acc.num_processes > 1:
        lengths, truncated = gather(acc, lengths), gather(acc, truncated)
    metrics = {
        "reward/total": rewards.mean().item(),
        "reward/total_std": rewards.std().item() if n > 1 else 0.0,
        "reward/accuracy": torch.nan_to_num(per_component[accuracy_key], nan=0.0).mean().item(),
        "reward/errors": errors,
        "completions/mean_length": lengths.mean().item(),
        "completions/max_length": lengths.max().item(),
        "completions/truncated_frac": truncated.mean().item(),
        "train/frac_zero_std_groups": zero_std_group_fraction(rewards, group_size),
    }
    for name, values in per_component.items():
        present = values[~torch.isnan(values)]
        metrics[f"reward/{name}"] = present.mean().item() if present.numel() else None
        metrics[f"reward/{name}_std"] = present.std().item() if present.numel() > 1 else None
    return metrics


class SingleTurnProducer:
    """Prompts from `stream`, G samples each through `generator`, scored by `rewards` (sample_batch)."""

    kind = "single_turn"

    def __init__(self, generator, tokenizer, stream: PromptStream, rewards: list[RewardComponent], *, group_size: int,
                 prompts_per_step: int, max_new_tokens: int, min_new_tokens: int, seed: int, use_chat_template: bool,
                 system_prompt: str | None, on_error: str, accuracy_key: str, total_steps: int, dynamic_sampling: bool,
                 max_rounds: int, acc=None):
        self.generator, self.tokenizer, self.stream, self.rewards = generator, tokenizer, stream, rewards
        self.group_size = group_size
        self.settings = dict(prompts_per_step=prompts_per_step, max_new_tokens=max_new_tokens,
                             min_new_tokens=min_new_tokens, seed=seed, use_chat_template=use_chat_template,
                             system_prompt=system_prompt, on_error=on_error, accuracy_key=accuracy_key,
                             total_steps=total_steps, dynamic_sampling=dynamic_sampling, max_rounds=max_rounds)
        self.acc = acc

    @property
    def loss_width(self) -> int:
        """The longest completion a row can hold (Dr. GRPO's constant normaliser)."""
        return int(self.settings["max_new_tokens"])

    def checkpointed(self) -> dict:
        return {"data": self.stream}  # the position in the shuffled prompts

    def produce(self, step: int) -> Batch:
        return sample_batch(self.generator, self.tokenizer, self.stream, self.rewards, self.group_size, step=step,
                            acc=self.acc, **self.settings)

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        """The samples file rows of this process's first `count` samples (the main process's are the first)."""
        return [
            {"prompt": batch.prompts[i], "completion": batch.rollout.texts[i], "reward": batch.rewards[i].item(),
             **samples[i], "answer": batch.rows[i].get("answer")}
            for i in range(min(count, len(batch.prompts)))
        ]
