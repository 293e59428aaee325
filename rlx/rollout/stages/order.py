"""The stages of one run composed in their fixed order (rlx/rollout/stages/__init__.py ORDER, then the user's
algorithm.stages in their listed order), and dynamic sampling's drop strategy."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlx.algorithms.ngrpo import DROP_STRATEGIES
from rlx.errors import UserError
from rlx.rollout.stages.base import STAGES, ScoredDraw, Stage, StageContext, StageSettings

# the built-in stages, in the order each draw goes through them; each switches on by its own knobs
ORDER = ("verifier_noise", "replay", "hints", "shaping", "temperature_schedule")


def build_stages(settings: StageSettings, extra: list[str] = ()) -> list[Stage]:
    """The stages that are on: the built-in ones in ORDER whose knobs switch them on, then each STAGES entry
    named in `extra` (algorithm.stages), in its order."""
    taken = [name for name in extra if name in ORDER]
    if taken:
        raise UserError(f"algorithm.stages={list(extra)}: {', '.join(taken)} is a built-in stage, switched on by its "
                        "own knobs (docs/extending/stages.md); list only your own stages there")
    built = [STAGES[name](settings) for name in (*ORDER, *extra)]
    return [stage for stage in built if stage is not None]


class StagePipeline:
    """The active stages (`stages`, in order) and the drop strategy of algorithm.dynamic_sampling_drop;
    `active` is False when every stage is off and the drop strategy is DAPO's (tied)."""

    def __init__(self, stages: list[Stage], drop: str = "tied"):
        self.stages, self.drop = list(stages), drop

    def describe(self) -> list[str]:
        """The stages switched on, for the builder's log line."""
        return [stage.describe() for stage in self.stages] + ([f"drop {self.drop}"] if self.drop != "tied" else [])

    @property
    def active(self) -> bool:
        return bool(self.describe())

    def checkpointed(self) -> dict:
        """{name: state} of every stage that keeps some (replay buffer, LASER-D targets), for Checkpointer.restore."""
        return {name: state for stage in self.stages for name, state in stage.checkpointed().items()}

    def schedule(self, step: int, max_new_tokens: int) -> list[float] | None:
        """The step's per-position sampling temperatures (the first stage that sets a schedule), or None."""
        for stage in self.stages:
            taus = stage.schedule(step, max_new_tokens)
            if taus is not None:
                return taus
        return None

    def after_scoring(self, part: ScoredDraw, ctx: StageContext, first_index: int) -> ScoredDraw:
        """One draw through the stages: the verdict stages (verifier noise), then the draw's first_correct is
        recorded (the verdict on the samples as drawn), then the group stages; `first_index`: the global index of
        the draw's first sample (the sampling seeds' counter)."""
        for stage in self.stages:
            if stage.phase == "verdict":
                part = stage.after_scoring(part, ctx, first_index)
        part = replace(part, first_correct=part.correct.clone())
        for stage in self.stages:
            if stage.phase != "verdict":
                part = stage.after_scoring(part, ctx, first_index)
        return part

    def dropped(self, part: ScoredDraw) -> torch.Tensor:
        """(n,) bool: the samples of the groups dynamic sampling drops
        (DROP_STRATEGIES[algorithm.dynamic_sampling_drop])."""
        return DROP_STRATEGIES[self.drop](part.rewards, part.correct, part.groups)

    def after_step(self, parts: list[ScoredDraw], step: int) -> dict:
        """Every stage's end of step (LASER-D's update); the step's metrics, each stage's own."""
        metrics = {}
        for stage in self.stages:
            metrics.update(stage.after_step(parts, step))
        return metrics
