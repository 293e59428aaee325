"""A speculative lane: engines that can spare capacity while a step finishes draw the next step's rounds ahead.

The producer of partial rollouts with token-budget rounds (rlx/rollout/partial.py) gets a lane when it is built and
calls it at every round; it never asks which lane it holds. The fleet's lane (rlx/fleet/overlap.py, for
rollout.server.overlap_steps) moves idle servers to the next step's weights and draws there; every other engine has
`NoLane`, which draws nothing. The lane never sees the producer's groups: it draws through `AheadWork`, which the
producer hands it, and whatever it drew is only a proposal the producer may cut back (rlx/rollout/pool.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rlx.engines.generator import Generator


class AheadWork(Protocol):
    """The next step's fresh groups as a lane sees them: rows to draw, one segment at a time, into copies."""

    step: int  # the step whose groups these are

    def draw(self, generator: Generator, rows: int) -> object | None:
        """One segment for at most `rows` unfinished rows (those with the fewest rounds first) drawn through
        `generator` into a copy of the groups, returned; the groups themselves are unchanged. None: no row is left."""
        ...

    def commit(self, drawn: object) -> None:
        """The copy `draw` returned becomes the groups."""
        ...

    def drop(self) -> None:
        """Every group back to as drawn, before any token (the lane's work is lost; the step draws it itself)."""
        ...


class SpeculativeLane(Protocol):
    """Draws the next step's rounds while this step's last rounds finish (rollout.server.overlap_steps)."""

    def lend(self, work: Callable[[], AheadWork | None], step: int, rows_due: int) -> None:
        """At a round of step `step` with `rows_due` rows to draw: start (or widen) the lane on what the engine can
        spare. `work()`: the next step's groups (None past the last step); a lane that draws asks for it at every
        call, so the prompts are taken at the same point of every run, whether or not capacity was spared."""
        ...

    def finish(self) -> None:
        """The step's rounds are over: stop the lane (a call in flight is not waited for; its answer is dropped)."""
        ...

    def reclaim(self, error: BaseException) -> bool:
        """A round of this step failed with `error` before any row was applied: True when the lane took back what
        it held and the round can be drawn again (the step's engines were all lent), False to let `error` stand."""
        ...

    def metrics(self) -> dict[str, float]:
        """The lane's figures for the step's metrics row (read after finish)."""
        ...


class NoLane:
    """The lane of engines that have nothing to spare: draws nothing, reclaims nothing, reports nothing."""

    def lend(self, work: Callable[[], AheadWork | None], step: int, rows_due: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def reclaim(self, error: BaseException) -> bool:
        return False

    def metrics(self) -> dict[str, float]:
        return {}


NO_LANE = NoLane()  # the default where a lane is a parameter (stateless: one is enough)
