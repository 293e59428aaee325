"""What every stage of the single-turn producer shares: the draw it works on (`ScoredDraw`), what it may call
(`StageContext`), the settings it is built from (`StageSettings`), the `Stage` protocol and the `STAGES` registry.

A stage is one behaviour of the producer with the whole draw in view (gymnasium's wrappers in spirit): it owns
its state and its counters, and returns its own metrics once per step. An entry of STAGES is
`fn(settings: StageSettings) -> Stage | None` (a Stage subclass is one): None when its knobs leave it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.engines.records import Rollout
from rlx.registry import Registry, publish
from rlx.rollout.types import HintedContext, SameContext

# name -> fn(StageSettings) -> Stage | None; the built-in ones (rlx/rollout/stages/__init__.py ORDER) switch on by
# their own knobs, a user's by naming it in algorithm.stages (docs/extending/stages.md)
STAGES = publish("stage", Registry("producer stage"))


@dataclass(frozen=True, eq=False)
class ScoredDraw:
    """One draw of the single-turn producer, scored (n rows, the samples of a group adjacent). Complete at
    construction and frozen: a stage that changes it returns a new one (dataclasses.replace).

    rollout: the training rows (the plain prompt + the completion; a hinted row's prompt too);
    rewards (n,) total reward; components {name: (n,)} each component's score of what the policy sampled;
    rows / prompts: the data row and the rendered plain prompt of each sample; groups (n,) long: group ids,
    unique over the step; correct (n,) bool: the verdict training sees (after verifier noise; replayed rows:
    the stored one); first_correct (n,): that verdict on the samples as drawn (before replay and hints), what the
    prompt source observes; context: SameContext when every row was sampled from its own prompt, else
    HintedContext with the rows as sampled (hinted rows: the hinted prompt); hinted (n,) bool: the rows a stage
    re-sampled with a hint; errors: reward functions that failed (reward.on_error=zero)."""

    rollout: Rollout
    rewards: torch.Tensor
    components: dict
    rows: list[dict]
    prompts: list[str]
    groups: torch.Tensor
    correct: torch.Tensor
    first_correct: torch.Tensor
    context: SameContext | HintedContext
    hinted: torch.Tensor
    errors: int

    @property
    def behaviour(self) -> Rollout:
        """The rows as sampled: the context's where a stage re-sampled some from another prompt, else the rollout."""
        return self.context.rollout if isinstance(self.context, HintedContext) else self.rollout

    def select(self, index: torch.Tensor) -> ScoredDraw:
        take = [self.rows[i] for i in index.tolist()], [self.prompts[i] for i in index.tolist()]
        context = (HintedContext(self.context.rollout.select(index)) if isinstance(self.context, HintedContext)
                   else SameContext())
        components = {k: v[index] for k, v in self.components.items()}
        return ScoredDraw(self.rollout.select(index), self.rewards[index], components, take[0], take[1],
                          self.groups[index], self.correct[index], self.first_correct[index], context,
                          self.hinted[index], self.errors)


@dataclass
class StageContext:
    """What a stage may call: the generator, tokenizer and scorer of the producer, and the step's seeds.
    score(prompts, rollout, rows) -> (total (n,), components {name: (n,)}, errors)."""

    generator: object
    tokenizer: object
    score: object
    step: int
    seed: int
    group_size: int
    max_new_tokens: int
    min_new_tokens: int
    use_chat_template: bool
    system_prompt: str | None
    completion_template: str | None
    schedule: list[float] | None = None


@dataclass(frozen=True)
class StageSettings:
    """What a stage is built from: the typed algorithm and rollout settings (algorithm.*, rollout.*), the reward
    component read as accuracy and its weight in the total reward, and the completions per prompt."""

    algo: object
    roll: object
    accuracy_key: str
    accuracy_weight: float
    group_size: int


class Stage:
    """One behaviour of the producer. Every hook is optional (these defaults do nothing):

    phase: "verdict" for a stage that changes what the verifier reports (it runs before the draw's
    first_correct is recorded), "group" (default) for one that works on the scored groups;
    schedule(step, max_new_tokens): the step's per-position sampling temperatures, or None;
    after_scoring(part, ctx, first_index) -> ScoredDraw: one draw, after scoring (first_index: the global index of
    its first sample, the sampling seeds' counter; under partial rollouts 0, the draw being the groups the step
    finished, some begun at earlier steps and seeded then);
    after_step(parts, step) -> dict: the step's draws are made; update state, return this stage's metrics for the
    step (and reset its counters);
    checkpointed() -> dict: {name: object with state_dict/load_state_dict} saved with the run, restored on resume;
    describe() -> str: the builder's log line."""

    name = "stage"
    phase = "group"

    def schedule(self, step: int, max_new_tokens: int) -> list[float] | None:
        return None

    def after_scoring(self, part: ScoredDraw, ctx: StageContext, first_index: int) -> ScoredDraw:
        return part

    def after_step(self, parts: list[ScoredDraw], step: int) -> dict:
        return {}

    def checkpointed(self) -> dict:
        return {}

    def describe(self) -> str:
        return self.name


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, 0 when nothing was counted."""
    return numerator / denominator if denominator else 0.0


def mean_logprobs(rollout: Rollout) -> torch.Tensor | None:
    """(N,) mean sampler log-prob over each row's sampled tokens (None without sampler log-probs)."""
    if rollout.logprobs is None:
        return None
    mask = rollout.loss_mask.double()
    return (rollout.logprobs.double() * mask).sum(1) / mask.sum(1).clamp(min=1)
