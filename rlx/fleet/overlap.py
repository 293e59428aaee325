"""Rounds that overlap across steps on a fleet (rollout.server.overlap_steps): while the last rounds of step s finish on
the servers that hold its weight version v(s), servers that have nothing of step s left to do are moved to v(s+1)
and draw the rounds of step s+1's fresh groups there. `StepOverlap` is the fleet's speculative lane
(rlx/engines/lane.py); the producer hands it the next step's groups as `AheadWork` and decides what of it to keep
(rlx/rollout/pool.py says why a segment drawn early is the one the step would draw, and how the rows drawn past the
step's last round are cut back). Which server drew what, and when, changes; the rows and the rounds.jsonl lines do
not (beyond their information-only fields).

The lane of step s+1 (`AheadLane`) is speculative throughout: when one of its servers is lost, or the servers of
v(s) are all lost and step s needs one back (the publisher keeps v(s) loadable), its drawn segments are dropped and
step s+1 draws them in its own rounds, as without overlap.

How many servers the lane gets: at each round of step s, the servers of v(s) beyond ceil(rows due / per-server
concurrency), never the last one, and only idle ones; they stay at v(s+1) (the next step's publish skips them).
The lane draws at most what its servers take at once (per-server concurrency each), the rows with the fewest
rounds first; when step s ends, a call of the lane still in flight is not waited for: its answer is dropped.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from rlx.engines.lane import AheadWork
from rlx.errors import NoServerAtVersion, RolloutServerError

log = logging.getLogger("rlx")


def rows_answered(generator) -> Callable[[], dict[str, int]]:
    """Rows each server of `generator` (a ServerGenerator) has answered so far, by address: rounds.jsonl's
    information-only `served` (read when a line is written)."""
    return lambda: {m.url: m.answered for m in generator.client.members}


class VersionView:
    """A ServerGenerator seen through one weight version: rows go only to the servers that hold it."""

    def __init__(self, generator, version: int):
        self.generator, self.version = generator, version

    def generate_ids(self, prompts, **kwargs):
        return self.generator.generate_at(self.version, prompts, **kwargs)


class AheadLane:
    """A thread that draws `work` (step `work.step`'s fresh groups) segment by segment at weight `version`, on the
    servers the generator `view` routes to. Each call takes at most `capacity()` rows (what the lane's servers take
    at once). A call draws into a copy of the groups, committed only if the lane was not stopped meanwhile: stop()
    waits for `prepare()` (run first in the thread: moving servers to the version), never for a call in flight,
    whose answer is dropped (the step draws those segments itself)."""

    def __init__(self, work: AheadWork, view, version: int, prepare: Callable[[], None] = lambda: None,
                 capacity: Callable[[], int] = lambda: 1 << 30):
        self.work, self.view, self.version, self.step = work, view, version, work.step
        self.prepare, self.capacity = prepare, capacity
        self.rounds, self.error = 0, None
        self._stop, self._prepared, self._lock = threading.Event(), threading.Event(), threading.Lock()
        self.thread = threading.Thread(target=self._run, name="rlx-rollout-ahead", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            try:
                self.prepare()
            finally:
                self._prepared.set()
            while not self._stop.is_set():
                drawn = self.work.draw(self.view, max(1, self.capacity()))
                if drawn is None:
                    return
                with self._lock:
                    if self._stop.is_set():
                        return
                    self.work.commit(drawn)
                    self.rounds += 1
        except Exception as exc:  # noqa: BLE001 - a server's failure: the work is dropped and the step draws the rows
            with self._lock:  # itself; anything else is raised by finish(); after stop() nothing matters any more
                if not self._stop.is_set():
                    self.error = exc

    def stop(self) -> None:
        """No call of the lane changes its groups after this returns."""
        self._prepared.wait()
        with self._lock:
            self._stop.set()


class StepOverlap:
    """rollout.server.overlap_steps for a partial-rollout producer in pipeline mode (a SpeculativeLane): `generator`
    (a ServerGenerator whose publisher holds two versions), `weights(step)`: (version, model) of the weights step
    `step` samples with once the trainer has published them, else None (never waits); `per_server`: requests in
    flight on one server."""

    def __init__(self, generator, weights: Callable[[int], tuple[int, object] | None], per_server: int):
        self.generator, self.weights, self.per_server = generator, weights, max(1, int(per_server))
        self.lane: AheadLane | None = None
        self.lent = 0  # servers moved to the next step's version during this step (a metric)
        self.joining: list[threading.Thread] = []  # moves of servers that join a running lane

    def lend(self, work: Callable[[], AheadWork | None], step: int, rows_due: int) -> None:
        """At a round of step `step` with `rows_due` rows to draw: start (or widen) the lane of step+1's fresh
        groups (`work()`, asked for first at every round; None: none to draw ahead) on the servers this step can
        spare."""
        ahead = work()
        if ahead is None:
            return
        current = self.generator.version
        holding = sum(m.live and m.version == current for m in self.generator.client.members)
        spare = holding - max(1, math.ceil(rows_due / self.per_server))
        if self.lane is None:
            self._start(ahead, step, current, spare)
        elif self.lane.version != current and spare >= 1 and self.lane.thread.is_alive():
            members = self.generator.client.reserve(current, spare)  # more servers join the lane's version
            if members:
                self.lent += len(members)
                joining = threading.Thread(target=self._join, args=(members, self.lane.version), daemon=True)
                joining.start()
                self.joining.append(joining)

    def _start(self, ahead: AheadWork, step: int, current: int, spare: int) -> None:
        """The lane of step+1, once its weights are published: on every server when they are this step's (version
        `current`), else on `spare` idle servers moved to them."""
        ready = self.weights(step + 1)
        if ready is None:
            return
        version, model = ready
        capacity = lambda: self.per_server * sum(m.live and m.version == version  # noqa: E731
                                                 for m in self.generator.client.members)
        view = VersionView(self.generator, version)
        if version == current:  # the same weights: every server serves both steps' rounds
            self.lane = AheadLane(ahead, view, version, capacity=capacity)
            return
        members = self.generator.client.reserve(current, spare) if spare >= 1 else []
        if not members:
            return
        self.lent += len(members)
        self.lane = AheadLane(ahead, view, version, prepare=lambda: self.generator.move_ahead(model, version, members),
                              capacity=capacity)

    def _join(self, members: list, version: int) -> None:
        try:
            self.generator.move(None, version, members)
        except RolloutServerError as exc:
            log.warning("rollout.server.overlap_steps: a server could not be moved to version %d: %s", version, exc)

    def finish(self) -> None:
        """End the lane (after its round in flight). A lane that failed has its work dropped (logged once)."""
        self._end()

    def _end(self) -> AheadLane | None:
        """finish(), returning the lane that ran (None: none)."""
        lane, self.lane = self.lane, None
        for joining in self.joining:
            joining.join()
        self.joining = []
        if lane is None:
            return None
        lane.stop()
        if lane.error is not None and not isinstance(lane.error, RolloutServerError):
            raise lane.error
        if lane.error is not None:
            log.warning("rollout.server.overlap_steps: the rounds drawn ahead for step %d were dropped (%s); the step "
                        "draws them itself", lane.step, lane.error)
            lane.work.drop()
        return lane

    def reclaim(self, error: BaseException) -> bool:
        """The servers of the current version were all lost (NoServerAtVersion): drop the lane's work and move every
        server back; any other error stands."""
        if not isinstance(error, NoServerAtVersion):
            return False
        lane = self._end()
        if lane is not None and lane.error is None:
            lane.work.drop()
        self.generator.reclaim()
        return True

    def metrics(self) -> dict[str, float]:
        lent, self.lent = self.lent, 0
        return {"rollout/overlap_servers_lent": float(lent)}
