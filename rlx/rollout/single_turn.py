"""The single-turn producer: each step, draw prompts from the prompt source (rlx/data/sources.py), sample G
completions per prompt through the generator, score them with the reward components, and (DAPO's dynamic sampling)
keep drawing until enough groups have informative (non-tied) rewards; the source then observes every group's
verdicts. It hands the policy-gradient and PPO loops a `Batch` around one `Rollout`
(rlx/rollout/types.py); the episode producer (rollout/episodes.py) is its multi-turn counterpart.

The core every single-turn mode shares (the synchronous producer here, partial rollouts in rlx/rollout/partial.py,
both wrapped alike by pipeline mode and by rank-0 sampling): rows sampled through the Generator protocol
(fresh, or continued from their tokens: `Continuation`), `scored_round` (the reward components on a draw's rows,
the verdict read from the accuracy component), the seed stages of one `StagePipeline` (`stage_context`),
`observe_source` (the source learns from the verdicts), `round_metrics`, `round_batch` (the step's Batch, its
sampling context from the stages' behaviour rows, the counts in its metrics) and `single_turn_records` (the
samples files). `ScoredDraw` is the record of one scored draw (rlx/rollout/stages/base.py); a draw is one take of
prompts from the source (dynamic sampling makes several a step), not a token-budget round of partial rollouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlx.algorithms.advantages import zero_std_group_fraction
from rlx.algorithms.grouping import dense_ids, fixed_groups
from rlx.algorithms.ngrpo import DROP_STRATEGIES
from rlx.algorithms.shaping import correct_from_accuracy
from rlx.data.sources import PromptSource
from rlx.engines.generator import Draw, Generator, sample_rollout
from rlx.engines.records import Rollout
from rlx.engines.sampling import sample_seed
from rlx.rewards import RewardComponent, TrainerState, compute_rewards, token_lists
from rlx.rollout.prompts import format_prompts
from rlx.rollout.stages import ScoredDraw, StageContext, StagePipeline
from rlx.rollout.types import Batch, HintedContext, PromptRows, SameContext
from rlx.runtime.parallel import gather, global_sum, shard


def tied_group_fraction(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Fraction of the groups (keyed by id) whose rewards all tie (DROP_STRATEGIES["tied"])."""
    tied = DROP_STRATEGIES["tied"](rewards, torch.zeros_like(rewards, dtype=torch.bool), groups)
    index, count = dense_ids(groups)
    per_group = torch.zeros(count, dtype=torch.bool).index_fill_(0, index[tied], True)
    return per_group.double().mean().item() if count else 0.0


@dataclass(frozen=True)
class SingleTurnSettings:
    """How the single-turn producers draw and score a step's groups: `group_size` completions for each of
    `prompts_per_step` prompts, each with `min_new_tokens`..`max_new_tokens` new tokens and sampled with seed
    sample_seed(seed, step, i); the prompt format (chat template, system prompt, completion template); the
    reward failure rule (reward.on_error), the component read as accuracy and the run's step count (the reward
    functions' `trainer_state.max_steps`); DAPO's dynamic sampling, with at most `max_draws` draws of prompts
    (algorithm.max_sample_batches)."""

    group_size: int
    prompts_per_step: int
    max_new_tokens: int
    min_new_tokens: int
    seed: int
    use_chat_template: bool
    system_prompt: str | None
    on_error: str
    accuracy_key: str
    total_steps: int
    dynamic_sampling: bool = False
    max_draws: int = 1
    completion_template: str | None = None


def sample_batch(generator: Generator, tokenizer, source: PromptSource, rewards: list[RewardComponent],
                 settings: SingleTurnSettings, *, step: int, acc=None, stages: StagePipeline | None = None) -> Batch:
    """Generate and score `settings.prompts_per_step` groups. With dynamic sampling, drop the groups of the drop
    strategy (stages.drop: tied groups by default, DAPO) and draw the missing number of prompts again, for at most
    `settings.max_draws` draws; if still short, fill with dropped groups (zero advantage under group baselines
    when tied) so the batch size stays fixed. Completion i drawn at this step is sampled with seed
    sample_seed(seed, step, i). `generator` samples through the generator protocol (engines/generator.py:
    HFGenerator on the policy, or the vLLM engine; its temperature / top-p / top-k are rollout's), the one-turn
    case of the multi-turn rollouts: prompts are tokenized once and the Rollout is built from the sampled ids.
    With several processes (acc), every process draws the same prompts, generates and scores its own shard, and
    the rewards are gathered; with dynamic sampling, the seed stages, a prompt source other than the stream or the
    temperature schedule, rank 0 alone calls this without `acc` for the global batch and broadcasts it
    (rlx/rollout/rank_zero.py), so they see every group of the step as one process does. `stages`
    (rlx/rollout/stages/): the seed ideas' group stages, run on each draw after scoring (verifier noise, replay,
    hints, group reward shaping); groups are keyed by id (Batch.groups), so a group may grow (hinted re-samples).
    After the stages the source observes every group drawn (`observe_source`)."""
    stages = stages if stages is not None and stages.active else None
    parts, drawn_groups = draws_of_step(generator, tokenizer, source, rewards, settings, step=step, acc=acc,
                                        stages=stages)
    stage_metrics = stages.after_step(parts, step) if stages is not None else {}
    stage_metrics.update(observe_source(source, parts))
    drawn = merge_draws(parts, tokenizer.pad_token_id)
    group_size, accuracy_key = settings.group_size, settings.accuracy_key
    rewards_all, per_component, errors, correct = drawn.rewards, drawn.components, drawn.errors, drawn.correct
    local = slice(0, rewards_all.numel())
    if acc is not None and acc.num_processes > 1:  # the global batch, in global sample order
        local = slice(acc.process_index * rewards_all.numel(), (acc.process_index + 1) * rewards_all.numel())
        rewards_all = gather(acc, rewards_all)  # (N,)
        per_component = {name: gather(acc, values) for name, values in per_component.items()}
        correct = gather(acc, correct.long()).bool()
        errors = int(global_sum(acc, errors))
    groups_all = (drawn.groups if rewards_all.numel() == drawn.groups.numel()
                  else fixed_groups(rewards_all.numel(), group_size))
    drawn_metrics = round_metrics(drawn, rewards_all, per_component, errors, groups_all, accuracy_key, group_size, acc)
    drawn_metrics.update(stage_metrics)
    filled = None
    if settings.dynamic_sampling:
        drawn, filled, dropped_groups = keep_informative(drawn, stages, settings.prompts_per_step)
        rewards_all, correct, groups_all = drawn.rewards, drawn.correct, drawn.groups
        local = slice(0, rewards_all.numel())
        drawn_metrics["sampling/dropped_groups"] = dropped_groups
    return round_batch(drawn, group_size, drawn_metrics, scored=(rewards_all, groups_all, correct), local=local,
                       prompts_drawn=drawn_groups, draws=len(parts), filled_groups=filled)


def draws_of_step(generator: Generator, tokenizer, source: PromptSource, rewards: list[RewardComponent],
                  settings: SingleTurnSettings, *, step: int, acc,
                  stages: StagePipeline | None) -> tuple[list[ScoredDraw], int]:
    """The draws of one step (one without dynamic sampling; with it, draws until enough groups are informative or
    `settings.max_draws` is reached), each scored and passed through the active `stages`. Returns the draws and
    the number of prompts drawn."""
    s = settings
    wanted, group_size = s.prompts_per_step, s.group_size
    schedule = stages.schedule(step, s.max_new_tokens) if stages is not None else None
    parts: list[ScoredDraw] = []
    kept_groups, draws, drawn_samples, drawn_groups = 0, 0, 0, 0

    score = round_scorer(rewards, s, step)
    context = stage_context(generator, tokenizer, score, s, step, schedule)
    draw = Draw(samples_per_prompt=group_size, max_new_tokens=s.max_new_tokens, min_new_tokens=s.min_new_tokens,
                schedule=schedule)
    while True:
        rows = source.take(wanted - kept_groups if s.dynamic_sampling else wanted)
        mine = shard(len(rows), acc) if acc is not None else slice(0, len(rows))
        rows = rows[mine]
        prompts = format_prompts(tokenizer, rows, s.use_chat_template, s.system_prompt)
        first = drawn_samples + mine.start * group_size  # global index of this shard's first sample
        rollout = sample_rollout(generator, tokenizer, prompts, draw,
                                 [sample_seed(s.seed, step, first + i) for i in range(len(prompts) * group_size)])
        groups = drawn_groups + torch.arange(len(rows)).repeat_interleave(group_size)  # (n,) ids unique over the step
        part = scored_round(score, rollout, [row for row in rows for _ in range(group_size)],
                            [p for p in prompts for _ in range(group_size)], groups, s.accuracy_key)
        if stages is not None:
            part = stages.after_scoring(part, context, first)
        parts.append(part)
        drawn_samples += len(rows) * group_size
        drawn_groups += len(rows)
        draws += 1
        if not s.dynamic_sampling:
            break
        dropped = (stages.dropped(part) if stages is not None
                   else DROP_STRATEGIES["tied"](part.rewards, part.correct, groups))
        kept_groups += torch.unique(part.groups[~dropped]).numel()
        if kept_groups >= wanted or draws >= s.max_draws:
            break
    return parts, drawn_groups


def observe_source(source: PromptSource, parts: list[ScoredDraw]) -> dict:
    """The source observes the step's draws: the data row of every group, in the order drawn, with the verdicts of
    its own samples as first drawn (first_correct, hinted re-samples apart). Returns the source's metrics."""
    rows, verdicts = [], []
    for part in parts:
        plain = torch.nonzero(~part.hinted).flatten()
        groups, correct = part.groups[plain], part.first_correct[plain]
        for g in torch.unique_consecutive(groups).tolist():
            members = groups == g
            rows.append(part.rows[int(plain[members][0])])
            verdicts.append(correct[members])
    return source.observe(rows, verdicts)


def scored_round(score, rollout: Rollout, rows: list[dict], prompts: list[str], groups: torch.Tensor,
                 accuracy_key: str) -> ScoredDraw:
    """A draw's rows scored (`score`: round_scorer's), the verdict training sees read from the accuracy component
    (before the stages: verifier noise, replay and hints change it there); every row sampled from its own prompt."""
    total, per_component, errors = score(prompts, rollout, rows)  # (n,)
    correct = correct_from_accuracy(per_component[accuracy_key])
    return ScoredDraw(rollout, total, per_component, rows, prompts, groups, correct, correct.clone(), SameContext(),
                 torch.zeros(len(rows), dtype=torch.bool), errors)


def round_batch(drawn: ScoredDraw, group_size: int, metrics: dict, *, scored: tuple | None = None,
                local: slice | None = None, prompts_drawn: int, draws: int = 1,
                filled_groups: int | None = None) -> Batch:
    """The step's Batch of the draws merged in `drawn` (after their stages): rows trained in the context they were
    sampled in (HintedContext when a stage re-sampled some from another prompt), `scored` = (rewards, groups,
    correct) over the global batch where they differ from the draw's (several processes), this process's rows
    `local`, and the counts in its metrics: train/prompts_drawn, train/sample_rounds (the draws of prompts), and
    with dynamic sampling train/filled_groups (dropped groups taken to fill the batch)."""
    rewards, groups, correct = scored if scored is not None else (drawn.rewards, drawn.groups, drawn.correct)
    counts = {"train/prompts_drawn": prompts_drawn, "train/sample_rounds": draws}
    if filled_groups is not None:
        counts["train/filled_groups"] = filled_groups
    return Batch(drawn.rollout, rewards, group_size, groups, correct, PromptRows(drawn.rows, drawn.prompts),
                 drawn.context, local if local is not None else slice(0, rewards.numel()), {**metrics, **counts},
                 components=drawn.components)


def single_turn_records(batch: Batch, samples: list[dict], count: int, *, version: bool = False) -> list[dict]:
    """The samples file rows of this process's first `count` samples (the main process's are the first): prompt,
    completion, reward, the loop's per-sample figures, the answer, and (`version`) the row's oldest policy version."""
    source = batch.source
    rollout, start = batch.rollout, batch.local.start or 0
    return [
        {"prompt": source.prompts[i], "completion": rollout.texts[i], "reward": batch.rewards[start + i].item(),
         **samples[i], "answer": source.rows[i].get("answer"),
         # what `rlx view` shows beside each completion: its group, verdict, length, budget cut and components
         "group": int(batch.groups[start + i]), "length": int(rollout.completion_mask[i].sum()),
         "truncated": bool(rollout.truncated[i]),
         **({"correct": bool(batch.correct[start + i])} if batch.correct.numel() else {}),
         "components": {name: _number(values[i]) for name, values in batch.components.items()},
         **({"version": int(rollout.versions[i])} if version else {})}
        for i in range(min(count, len(source.prompts)))
    ]


def _number(value) -> float | None:
    """A component's value for a samples file: None where the component did not apply (NaN)."""
    value = float(value)
    return value if math.isfinite(value) else None


def round_scorer(rewards: list[RewardComponent], settings: SingleTurnSettings, step: int):
    """score(prompts, rollout, rows) -> (total (n,), components {name: (n,)}, errors): the reward components on
    the rows of `step` (what the stages call to score the rows they add)."""
    s = settings

    def score(prompts: list[str], rollout: Rollout, rows: list[dict]):
        return compute_rewards(rewards, prompts, rollout.texts, rows, s.on_error, system_prompt=s.system_prompt,
                               completion_ids=token_lists(rollout.completion_ids, rollout.completion_mask),
                               state=TrainerState(global_step=step, max_steps=s.total_steps))  # (n,)

    return score


def stage_context(generator, tokenizer, score, settings: SingleTurnSettings, step: int,
                  schedule: list[float] | None = None) -> StageContext:
    """What the stages may call at `step` (the single-turn and the partial producer alike)."""
    s = settings
    return StageContext(generator, tokenizer, score, step, s.seed, s.group_size, s.max_new_tokens, s.min_new_tokens,
                        s.use_chat_template, s.system_prompt, s.completion_template, schedule)


def round_metrics(drawn: ScoredDraw, rewards, per_component: dict, errors: int, groups, accuracy_key: str,
                  group_size: int, acc=None) -> dict:
    """outcome_metrics of a step's rows after the stages: reward/* and completions/* describe the policy's own
    samples (hinted re-samples apart), train/frac_zero_std_groups what trains."""
    if drawn.hinted.any():
        plain = torch.nonzero(~drawn.hinted).flatten()
        metrics = outcome_metrics(rewards[plain], {k: v[plain] for k, v in per_component.items()}, errors,
                                  drawn.rollout.select(plain), accuracy_key, group_size, acc, groups=groups[plain])
        metrics["train/frac_zero_std_groups"] = tied_group_fraction(rewards, groups)  # what trains
        return metrics
    return outcome_metrics(rewards, per_component, errors, drawn.rollout, accuracy_key, group_size, acc, groups=groups)


def merge_draws(parts: list[ScoredDraw], pad: int) -> ScoredDraw:
    """One ScoredDraw of a step's draws, in order (the rows as sampled where a draw has a hinted context)."""
    hinted = any(isinstance(p.context, HintedContext) for p in parts)
    return ScoredDraw(Rollout.cat([p.rollout for p in parts], pad), torch.cat([p.rewards for p in parts]),
                 {name: torch.cat([p.components[name] for p in parts]) for name in parts[0].components},
                 [r for p in parts for r in p.rows], [q for p in parts for q in p.prompts],
                 torch.cat([p.groups for p in parts]), torch.cat([p.correct for p in parts]),
                 torch.cat([p.first_correct for p in parts]),
                 HintedContext(Rollout.cat([p.behaviour for p in parts], pad)) if hinted else SameContext(),
                 torch.cat([p.hinted for p in parts]), sum(p.errors for p in parts))


def keep_informative(drawn: ScoredDraw, stages: StagePipeline | None, wanted: int) -> tuple[ScoredDraw, int, int]:
    """Dynamic sampling's choice: the first `wanted` groups the drop strategy keeps, filled up with dropped ones
    when short. Returns the chosen rows, the number of groups filled and the number of groups dropped."""
    dropped = (stages.dropped(drawn) if stages is not None
               else DROP_STRATEGIES["tied"](drawn.rewards, drawn.correct, drawn.groups))  # (n,)
    order = torch.unique_consecutive(drawn.groups)  # group ids in order of appearance
    is_dropped = torch.tensor([bool(dropped[drawn.groups == g][0]) for g in order.tolist()], dtype=torch.bool)
    informative = order[~is_dropped][:wanted]
    filled = wanted - len(informative)
    chosen = torch.cat([informative, order[is_dropped][:filled]])  # (wanted,) group ids
    index = torch.cat([torch.nonzero(drawn.groups == g).flatten() for g in chosen.tolist()])  # the groups' rows
    return drawn.select(index), filled, int(is_dropped.sum())


def outcome_metrics(rewards, per_component, errors, rollout, accuracy_key, group_size, acc=None, groups=None) -> dict:
    """reward/*, completions/* and train/frac_zero_std_groups over the samples drawn (all processes); groups (N,):
    the group ids when they are keyed by id (else G adjacent samples per group)."""
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
        "train/frac_zero_std_groups": (zero_std_group_fraction(rewards, group_size) if groups is None
                                       else tied_group_fraction(rewards, groups)),
    }
    for name, values in per_component.items():
        present = values[~torch.isnan(values)]
        metrics[f"reward/{name}"] = present.mean().item() if present.numel() else None
        metrics[f"reward/{name}_std"] = present.std().item() if present.numel() > 1 else None
    return metrics


class SingleTurnProducer:
    """Prompts from `source`, G samples each through `generator`, scored by `rewards` (sample_batch); a Producer
    (rlx/rollout/producers.py) of PromptRows batches."""

    def __init__(self, generator, tokenizer, source: PromptSource, rewards: list[RewardComponent],
                 settings: SingleTurnSettings, *, acc=None, stages: StagePipeline | None = None):
        self.generator, self.tokenizer, self.source, self.rewards = generator, tokenizer, source, rewards
        self.group_size = settings.group_size
        self.settings = settings
        self.acc = acc
        self.stages = stages  # the seed ideas' group stages (rlx/rollout/stages/), or None

    @property
    def loss_width(self) -> int:
        """The longest completion a row can hold (Dr. GRPO's constant normaliser)."""
        return int(self.settings.max_new_tokens)

    def checkpointed(self) -> dict:
        """The prompt source's state (the position in the shuffled prompts, the difficulty-aware sampler's pass rates
        and generator, a curriculum's own), and the seed stages' state (replay buffer, LASER-D targets) when they
        keep one."""
        return {"data": self.source, **(self.stages.checkpointed() if self.stages is not None else {})}

    def produce(self, step: int) -> Batch:
        return sample_batch(self.generator, self.tokenizer, self.source, self.rewards, self.settings, step=step,
                            acc=self.acc, stages=self.stages)

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        return single_turn_records(batch, samples, count)
