"""Rounds that overlap across steps (rollout.server.overlap_steps): while the last rounds of step s finish on the
servers that hold its weight version v(s), servers that have nothing of step s left to do are moved to v(s+1) and
start the rounds of step s+1's fresh groups there.

Why it keeps the run's rows, rewards and weights (bitwise in strict mode): a row's segment of round r depends only
on the row (prompt, seed, tokens so far), the budget S and the weights that draw it, so drawing it early at v(s+1)
on a server that holds v(s+1) gives what step s+1's round r would draw. What step s+1 cannot know early is where it
stops: after the round in which prompts_per_step groups have finished, counted over the whole pool, rows carried
from step s included. So every drawn segment is recorded with its round (`marks`: the row's token count at the
step's start and after each of its rounds), step s+1 evaluates its rounds in order exactly as without overlap, and
the rows drawn past its last round are cut back to it (`settle`): their extra tokens are the cost of speculating,
never part of a batch. Which server drew what, and when, changes; the rounds.jsonl lines do not (beyond the
information-only fields).

The lane of step s+1 (`AheadLane`) is speculative throughout: when one of its servers is lost, or the servers of
v(s) are all lost and step s needs one back (the publisher keeps v(s) loadable), its drawn segments are dropped and
step s+1 draws them in its own rounds, as without overlap.

How many servers the lane gets: at each round of step s, the servers of v(s) beyond ceil(rows due / per-server
concurrency), never the last one, and only idle ones; they stay at v(s+1) (the next step's publish skips them).
The lane draws at most what its servers take at once (per-server concurrency each), the rows with the fewest
rounds first; when step s ends, a call of the lane still in flight is not waited for: its answer is dropped.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections.abc import Callable

from rlx.errors import RolloutServerError

log = logging.getLogger("rlx")


def start_marks(group: dict, step: int) -> None:
    """Begin the round record of `group` for `step` (unless it was begun, by a lane that drew ahead for it)."""
    if group.get("marks_step") != step:
        group["marks"] = [[len(ids)] for ids in group["ids"]]
        group["marks_step"] = step


def rounds_done(group: dict, row: int) -> int:
    """Rounds of the current step that have advanced `row` (the round it finished in counts)."""
    return len(group["marks"][row]) - 1


def finished_by(group: dict, row: int, round_: int) -> bool:
    """Whether `row` had finished by the end of round `round_` (-1: before the step's first round)."""
    return bool(group["finished"][row]) and rounds_done(group, row) <= round_ + 1


def groups_completed(pool: list[dict], round_: int) -> int:
    """Groups whose every row had finished by the end of round `round_`."""
    return sum(all(finished_by(g, r, round_) for r in range(len(g["ids"]))) for g in pool)


def round_tokens(pool: list[dict], round_: int) -> tuple[int, int]:
    """(tokens drawn in round `round_` over the pool's rows, rows whose segment of that round is drawn)."""
    tokens = rows = 0
    for g in pool:
        for marks in g["marks"]:
            if len(marks) - 1 > round_:
                tokens += marks[round_ + 1] - marks[round_]
                rows += 1
    return tokens, rows


def settle(pool: list[dict], last_round: int) -> int:
    """Cut every row drawn past round `last_round` back to its tokens after that round (it was unfinished then),
    a group left with no token back to no first step; returns the tokens dropped."""
    dropped = 0
    for g in pool:
        for r, marks in enumerate(g["marks"]):
            if len(marks) - 1 <= last_round + 1:
                continue
            keep = marks[last_round + 1]
            dropped += len(g["ids"][r]) - keep
            g["ids"][r], g["logprobs"][r] = g["ids"][r][:keep], g["logprobs"][r][:keep]
            if "token_versions" in g:
                g["token_versions"][r] = g["token_versions"][r][:keep]
            if keep == 0:
                g["versions"][r] = None
            g["finished"][r] = g["stopped"][r] = False
            del marks[last_round + 2:]
        if not any(g["ids"]):  # nothing drawn for it after all: its first tokens come at a later step
            g["first_step"] = None
    return dropped


def fresh_copy(group: dict) -> dict:
    """`group` as drawn, before any token (a lane's work dropped, or a checkpoint of it)."""
    rows = len(group["seeds"])
    return {**{k: v for k, v in group.items() if k not in ("marks", "marks_step", "token_versions")},
            "ids": [[] for _ in range(rows)], "logprobs": [[] for _ in range(rows)], "versions": [None] * rows,
            "finished": [False] * rows, "stopped": [False] * rows, "first_step": None}


class VersionView:
    """A ServerGenerator seen through one weight version: rows go only to the servers that hold it."""

    def __init__(self, generator, version: int):
        self.generator, self.version, self.client = generator, version, generator.client

    def generate_ids(self, prompts, **kwargs):
        return self.generator.generate_ids(prompts, **kwargs, version=self.version)


class AheadLane:
    """A thread that advances `groups` (step `step`'s fresh groups) segment by segment at weight `version`, on the
    servers the generator `view` routes to, recording each row's rounds (marks); `advance(view, groups, rows,
    step)` draws one segment for `rows` ((group, row) pairs) and appends their marks. Each call takes at most
    `capacity()` rows (what the lane's servers take at once), those with the fewest rounds first. A call draws
    into a copy of the groups, which replaces them only if the lane was not stopped meanwhile: stop() waits for
    `prepare()` (run first in the thread: moving servers to the version), never for a call in flight, whose
    answer is dropped (the step draws those segments itself)."""

    def __init__(self, groups: list[dict], view, version: int, step: int, advance: Callable,
                 prepare: Callable[[], None] = lambda: None, capacity: Callable[[], int] = lambda: 1 << 30):
        self.groups, self.view, self.version, self.step = groups, view, version, step
        self.advance, self.prepare, self.capacity = advance, prepare, capacity
        self.rounds, self.error = 0, None
        self._stop, self._prepared, self._lock = threading.Event(), threading.Event(), threading.Lock()
        for group in groups:
            start_marks(group, step)
        self.thread = threading.Thread(target=self._run, name="rlx-rollout-ahead", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            try:
                self.prepare()
            finally:
                self._prepared.set()
            while not self._stop.is_set():
                rows = sorted(((g, r) for g, group in enumerate(self.groups) for r in range(len(group["ids"]))
                               if not group["finished"][r]), key=lambda x: (rounds_done(self.groups[x[0]], x[1]), x))
                if not rows:
                    return
                work = copy.deepcopy(self.groups)
                self.advance(self.view, work, rows[: max(1, self.capacity())], self.step)
                with self._lock:
                    if self._stop.is_set():
                        return
                    for group, drawn in zip(self.groups, work):
                        group.clear()
                        group.update(drawn)
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
    """rollout.server.overlap_steps for a partial-rollout producer in pipeline mode: `generator` (a ServerGenerator
    whose publisher holds two versions), `weights(step)`: (version, model) of the weights step `step` samples with
    once the trainer has published them, else None (never waits); `per_server`: requests in flight on one server."""

    def __init__(self, generator, weights: Callable[[int], tuple[int, object] | None], per_server: int):
        self.generator, self.weights, self.per_server = generator, weights, max(1, int(per_server))
        self.lane: AheadLane | None = None
        self.lent = 0  # servers moved to the next step's version during this step (a metric)
        self.joining: list[threading.Thread] = []  # moves of servers that join a running lane

    def lend(self, groups: list[dict] | None, step: int, rows_due: int, advance: Callable) -> None:
        """At a round of step `step` with `rows_due` rows to draw: start (or widen) the lane of step+1's fresh
        `groups` (None: none to draw ahead) on the servers this step can spare."""
        if groups is None:
            return
        current = self.generator.version
        holding = sum(m.live and m.version == current for m in self.generator.client.members)
        spare = holding - max(1, math.ceil(rows_due / self.per_server))
        if self.lane is None:
            ready = self.weights(step + 1)
            if ready is None:
                return
            version, model = ready
            capacity = lambda: self.per_server * sum(m.live and m.version == version  # noqa: E731
                                                     for m in self.generator.client.members)
            if version == current:  # the same weights: every server serves both steps' rounds
                self.lane = AheadLane(groups, VersionView(self.generator, version), version, step + 1, advance,
                                      capacity=capacity)
                return
            members = self.generator.client.reserve(current, spare) if spare >= 1 else []
            if not members:
                return
            self.lent += len(members)
            self.lane = AheadLane(groups, VersionView(self.generator, version), version, step + 1, advance,
                                  prepare=lambda: self.generator.move_ahead(model, version, members), capacity=capacity)
        elif self.lane.version != current and spare >= 1 and self.lane.thread.is_alive():
            members = self.generator.client.reserve(current, spare)  # more servers join the lane's version
            if members:
                self.lent += len(members)
                joining = threading.Thread(target=self._join, args=(members, self.lane.version), daemon=True)
                joining.start()
                self.joining.append(joining)

    def _join(self, members: list, version: int) -> None:
        try:
            self.generator.move(None, version, members)
        except RolloutServerError as exc:
            log.warning("rollout.server.overlap_steps: a server could not be moved to version %d: %s", version, exc)

    def finish(self) -> AheadLane | None:
        """End the lane (after its round in flight); the lane, with what it drew (None: no lane ran). A lane that
        failed has its work dropped (logged once)."""
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
            for i, group in enumerate(lane.groups):
                lane.groups[i] = fresh_copy(group)
        return lane

    def reclaim(self) -> None:
        """The servers of the current version were all lost: drop the lane's work and move every server back."""
        lane = self.finish()
        if lane is not None and lane.error is None:
            for i, group in enumerate(lane.groups):
                lane.groups[i] = fresh_copy(group)
        self.generator.reclaim()

    def step_metrics(self) -> dict[str, float]:
        lent, self.lent = self.lent, 0
        return {"rollout/overlap_servers_lent": float(lent)}
