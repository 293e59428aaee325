"""One step's batch for the outcome-reward loops (policy gradient and PPO): draw prompts, sample G
completions per prompt through a generator, score them with the reward components, and (DAPO's dynamic
sampling) keep drawing until enough groups have informative (non-tied) rewards.

Shared by rlx/loops/policy_gradient.py and rlx/loops/ppo.py, so that no loop imports another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlx.algorithms.advantages import tied_groups, zero_std_group_fraction
from rlx.data.tasks import PromptStream
from rlx.rewards import RewardComponent, TrainerState, compute_rewards, token_lists
from rlx.rollout.generator import Generator, sample_rollout
from rlx.rollout.hf import Rollout
from rlx.rollout.prompts import format_prompts
from rlx.rollout.sampling import sample_seed
from rlx.runtime.parallel import gather, global_sum, shard


def _pad_to(tensor: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    missing = width - tensor.shape[1]
    if missing == 0:
        return tensor
    pad = torch.full((tensor.shape[0], missing), value, dtype=tensor.dtype)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)


def cat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Concatenate rollouts along the sample axis (prompts stay left-padded, completions right-padded)."""
    if len(parts) == 1:
        return parts[0]
    p_width = max(r.prompt_ids.shape[1] for r in parts)
    c_width = max(r.completion_ids.shape[1] for r in parts)
    return Rollout(
        torch.cat([_pad_to(r.prompt_ids, p_width, pad_id, left=True) for r in parts]),  # (N, P)
        torch.cat([_pad_to(r.prompt_mask, p_width, 0, left=True) for r in parts]),  # (N, P)
        torch.cat([_pad_to(r.completion_ids, c_width, pad_id, left=False) for r in parts]),  # (N, C)
        torch.cat([_pad_to(r.completion_mask, c_width, 0, left=False) for r in parts]),  # (N, C)
        torch.cat([r.truncated for r in parts]),
        [t for r in parts for t in r.texts],
        torch.cat([_pad_to(r.logprobs, c_width, 0, left=False) for r in parts])  # (N, C)
        if all(r.logprobs is not None for r in parts) else None,
    )


def select_rollout(rollout: Rollout, index: torch.Tensor) -> Rollout:
    return Rollout(
        rollout.prompt_ids[index], rollout.prompt_mask[index], rollout.completion_ids[index],
        rollout.completion_mask[index], rollout.truncated[index], [rollout.texts[i] for i in index.tolist()],
        rollout.logprobs[index] if rollout.logprobs is not None else None,
    )


@dataclass
class Batch:
    """One step's training samples: G adjacent completions per prompt."""

    rows: list[dict]              # (n,) data row of each sample of this process
    prompts: list[str]            # (n,) formatted prompt of each sample of this process
    rollout: Rollout              # this process's n samples
    rewards: torch.Tensor         # (N,) weighted total reward of the GLOBAL batch, in global sample order
    drawn_metrics: dict           # reward/* and completions/* over every sample drawn this step
    prompts_drawn: int            # prompts generated for this step (more than the batch with dynamic sampling)
    rounds: int                   # generation rounds
    filled_groups: int            # tied groups kept to fill the batch when dynamic sampling ran out of rounds
    local: slice = field(default_factory=lambda: slice(None))  # this process's samples in the global batch


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
    rollout = cat_rollouts(rollouts, tokenizer.pad_token_id)
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
        rollout = select_rollout(rollout, index)
        rewards_all = rewards_all[index]
        local = slice(0, rewards_all.numel())
        all_rows = [all_rows[i] for i in index.tolist()]
        all_prompts = [all_prompts[i] for i in index.tolist()]
    prompts_drawn = sum(len(t) for t in totals) // group_size
    return Batch(all_rows, all_prompts, rollout, rewards_all, drawn_metrics, prompts_drawn, rounds, filled, local)


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


def sample_records(batch: Batch, advantages: torch.Tensor, count: int) -> list[dict]:
    return [
        {"prompt": batch.prompts[i], "completion": batch.rollout.texts[i], "reward": batch.rewards[i].item(),
         "advantage": advantages[i].item(), "answer": batch.rows[i].get("answer")}
        for i in range(min(count, len(batch.prompts)))
    ]
