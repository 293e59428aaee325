"""The one step record a producer hands the update, `Batch`: the Rollout (rlx.engines.records), and the rewards,
group keys and verdicts over the global batch, with explicit variants where a producer differs: where the rows
come from (`PromptRows` | `EpisodeRows`) and the context they were sampled in (`SameContext` | `HintedContext`).
It is complete at construction (no field means something by being None) and frozen: a stage that changes one
builds a new one (dataclasses.replace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlx.engines.records import Episode, Rollout


@dataclass(frozen=True, eq=False)
class PromptRows:
    """Where single-turn rows come from: the data row and the rendered prompt of each of this process's rows."""

    rows: list[dict]
    prompts: list[str]


@dataclass(frozen=True, eq=False)
class EpisodeRows:
    """Where episode rows come from: every episode of the global batch, in global order, and row_episode (n,)
    long: the episode (index into `episodes`, minus the process's first one) of each of this process's rows;
    a harness session's fork rows share their episode."""

    episodes: list[Episode]
    row_episode: torch.Tensor


@dataclass(frozen=True, eq=False)
class SameContext:
    """Every row was sampled from the prompt it trains on: the old log-probs are taken on Batch.rollout."""


@dataclass(frozen=True, eq=False)
class HintedContext:
    """Some rows were sampled from another prompt (a hint in the user message, algorithm.hints placement=prompt):
    `rollout` holds every row with the prompt it was sampled from, for the old log-probs (rows as Batch.rollout)."""

    rollout: Rollout


@dataclass(frozen=True, eq=False)
class Batch:
    """One step's training rows from a producer: the Rollout of this process's rows, and what the credit rule
    needs over the GLOBAL batch (all processes, in global row order). Every field is set at construction and
    never assigned after (a changed batch is a new one: dataclasses.replace).

    rewards (N,) the outcome reward of each global row (single-turn: the weighted total; episodes: the return);
    group_size: rows per group (G adjacent rows share a prompt or an environment seed); groups (N,) long: the
    group key of each global row, what keyed estimators group by (fixed groups, row // group_size, unless a
    stage regrouped the rows: hinted re-samples join their group); correct (N,) bool: the verdict training sees
    (the accuracy component after verifier noise; a replayed row: the stored one), or an empty (0,) when the
    producer has no verifier (episodes: `no_verdicts`); source: PromptRows (single-turn) or EpisodeRows
    (episodes, the harness); context: SameContext, or HintedContext with the rows as sampled; local: this
    process's rows within the global batch; metrics: reward/*, completions/* or env/* over everything drawn
    this step, and the producer's counts (single-turn: train/prompts_drawn, train/sample_rounds, with dynamic
    sampling train/filled_groups)."""

    rollout: Rollout
    rewards: torch.Tensor
    group_size: int
    groups: torch.Tensor
    correct: torch.Tensor
    source: PromptRows | EpisodeRows
    context: SameContext | HintedContext = field(default_factory=SameContext)
    local: slice = field(default_factory=lambda: slice(None))
    metrics: dict = field(default_factory=dict)
    components: dict = field(default_factory=dict)  # reward component -> (n,) of this process's rows (single-turn)

    def __post_init__(self):
        n = self.rewards.shape[0]
        if self.groups.shape != (n,) or self.correct.shape not in ((n,), (0,)):
            raise ValueError(f"Batch: {n} rewards, groups {tuple(self.groups.shape)}, correct "
                             f"{tuple(self.correct.shape)} (want ({n},); correct may be (0,): no verifier)")

    @property
    def sampled_in(self) -> Rollout:
        """The rows with the context each was sampled in: what the old (proximal) log-probs are taken on."""
        return self.context.rollout if isinstance(self.context, HintedContext) else self.rollout


def no_verdicts() -> torch.Tensor:
    """Batch.correct of a producer without a verifier (episodes): an empty (0,) bool tensor."""
    return torch.zeros(0, dtype=torch.bool)
