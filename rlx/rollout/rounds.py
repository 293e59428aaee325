"""How the producer of partial rollouts (rlx/rollout/partial.py) generates a step: every unfinished row of the pool
goes on from its tokens until prompts_per_step groups have finished. Three modes, one chosen when the producer is
built (`generation_mode`):

- `OneCall` (rollout.segment_tokens = 0): one generate call that stops at the token step in which enough groups
  finished (rollout=hf stops early).
- `ByRound` (rollout.segment_tokens = S): token-budget rounds. Round r advances every row unfinished at its start by
  at most S tokens, at the round's version; rounds end after the first in which prompts_per_step groups have
  finished (counted round by round, rlx/rollout/pool.py), each a line of rounds.jsonl. With a speculative lane
  (rlx/engines/lane.py, rollout.server.overlap_steps) the next step's fresh groups are lent to it at every round
  (`AheadGroups`); rows the lane drew ahead have their segment of round r recorded already, and rows drawn past
  the step's last round are cut back to it.
- `InOneCall` (rounds, a generator that decodes the rows as one batch: rollout=hf): all of a step's rounds in one
  call that stops at the end of the round in which enough groups finished. Every round is at the step's version,
  so the rows are those drawn round by round (without the prompt and prefix encoded again each round); the
  journal's lines are made from the rows' lengths. Rows beyond one batch go round by round.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from rlx.engines.generator import Continuation
from rlx.engines.lane import AheadWork, NoLane, SpeculativeLane
from rlx.engines.records import Generation
from rlx.errors import RolloutServerError
from rlx.rollout.pool import GroupInFlight, groups_completed, groups_done, round_tokens, settle, unfinished


@dataclass(frozen=True)
class StepTarget:
    """What a step's generation aims at: `groups` finished groups (prompts_per_step), rows of at least
    `min_new_tokens` and at most `max_new_tokens` tokens."""

    groups: int
    max_new_tokens: int
    min_new_tokens: int


@dataclass
class Rounds:
    """Token-budget rounds of partial rollouts (rollout.segment_tokens): every unfinished row advances at most
    `segment_tokens` tokens per round (0: off, one call per step); `journal`: the run's rounds.jsonl, one line
    per round (step, round, version, rows advanced, tokens, groups completed, and, as information only, `served()`:
    rows answered per server so far), written by the main process (None: not written); `lane`: draws the next step's
    rounds ahead (rollout.server.overlap_steps; NoLane: none)."""

    segment_tokens: int = 0
    journal: Path | None = None
    served: Callable[[], dict[str, int]] = dict
    lane: SpeculativeLane = field(default_factory=NoLane)
    _cut_from: int | None = None  # a resumed run drops the lines of steps it redoes, once

    def write(self, step: int, number: int, version: int, counts: tuple[int, int], completed: int,
              drawn_ahead: int | None = None) -> None:
        """The line of round `number` of `step`: `counts` (rows unfinished at its start, tokens drawn), `completed`
        groups by its end; `drawn_ahead` (information only, with a lane): rows whose segment a lane drew earlier."""
        if self.journal is None:
            return
        advanced, tokens = counts
        line = {"step": step, "round": number, "version": version, "rows_advanced": advanced, "tokens": tokens,
                "groups_completed": completed, "served": self.served()}
        if drawn_ahead is not None:
            line["drawn_ahead"] = drawn_ahead
        self.record(line)

    def record(self, line: dict) -> None:
        if self.journal is None:
            return
        if self._cut_from is None:
            self._cut_from = int(line["step"])
            if self.journal.is_file():  # a resumed run: the steps after its checkpoint are done again
                kept = [x for x in self.journal.read_text().splitlines() if json.loads(x)["step"] < self._cut_from]
                self.journal.write_text("".join(f"{x}\n" for x in kept))
        with open(self.journal, "a") as out:
            out.write(json.dumps(line) + "\n")


def version_of(generator) -> int:
    """The version stamped on what `generator` draws (a fleet holds none before its first publish: 0)."""
    return int(generator.version or 0)


def advance_rows(generator, pool: list[GroupInFlight], rows: list[tuple[int, int]], continuation: Continuation,
                 step: int, target: StepTarget) -> int:
    """Continue `rows` ((group position, row) of `pool`) on `generator` as `continuation` says; their new tokens,
    log-probs and per-token versions (the generator's version) go into the groups. Returns the tokens drawn."""
    out: Generation = generator.generate_ids(
        [pool[g].prompt_ids for g, _ in rows], max_new_tokens=target.max_new_tokens,
        seeds=[pool[g].seeds[r] for g, r in rows], min_new_tokens=target.min_new_tokens, continuation=continuation)
    version = version_of(generator)
    drawn = 0
    for (g, r), new, logprobs, stopped in zip(rows, out.ids, out.logprobs or [None] * len(rows), out.stopped):
        pool[g].extend(r, new, logprobs, stopped, version, step, target.max_new_tokens)
        drawn += len(new)
    return drawn


def draw_segment(generator, pool: list[GroupInFlight], rows: list[tuple[int, int]], step: int, target: StepTarget,
                 segment: int) -> int:
    """One round of `segment` tokens for `rows` of `pool` on `generator` (a step's, or a lane's)."""
    return advance_rows(generator, pool, rows, Continuation(prefixes=[pool[g].ids[r] for g, r in rows],
                                                            segment=segment), step, target)


def finishing_rule(pool: list[GroupInFlight], rows: list[tuple[int, int]], target: int):
    """stop_when for one generate call over `rows` ((group position, row) of each unfinished row): True once `target`
    groups of the pool have every row finished (before the call or in it)."""
    group_of = torch.tensor([g for g, _ in rows], dtype=torch.long)  # (R,)
    missing = torch.tensor([g.missing() for g in pool], dtype=torch.long)  # (groups,)
    already = int((missing == 0).sum())

    def enough(finished: torch.Tensor) -> bool:
        done_now = torch.zeros(len(pool), dtype=torch.long).index_add_(0, group_of, finished.long())
        return already + int(((missing > 0) & (done_now == missing)).sum()) >= target

    return enough


def at_round_ends(rule, segment: int):
    """stop_when that asks `rule` only at the end of a round of `segment` tokens (after token step S, 2S, ...: a
    generate call's rows advance one token per step, together)."""
    steps = iter(range(1, 1 << 62))
    return lambda finished: next(steps) % segment == 0 and bool(rule(finished))


def round_marks(start: int, end: int, segment: int) -> list[int]:
    """The round record of a row that went from `start` to `end` tokens in rounds of `segment` tokens: its length
    at the step's start and after each round that advanced it, [start, start + S, ..., end]."""
    return [start] + [min(start + k * segment, end) for k in range(1, -(-(end - start) // segment) + 1)]


class AheadGroups:
    """The next step's fresh groups (`groups`, the producer's own list, of step `step`) lent to a lane
    (rlx.engines.lane.AheadWork): their round record for `step` begins now, segments of `segment` tokens are drawn
    into copies, a copy replaces the groups when the lane commits it, and dropped work leaves them as drawn."""

    def __init__(self, groups: list[GroupInFlight], step: int, target: StepTarget, segment: int):
        self.groups, self.step, self.target, self.segment = groups, step, target, segment
        for group in groups:
            group.start_marks(step)

    def draw(self, generator, rows: int) -> list[GroupInFlight] | None:
        """One segment for at most `rows` unfinished rows, those with the fewest rounds first, into a copy."""
        order = sorted(((g, r) for g, group in enumerate(self.groups) for r in range(len(group.ids))
                        if not group.finished[r]), key=lambda x: (self.groups[x[0]].rounds_done(x[1]), x))
        if not order:
            return None
        work = [group.copy() for group in self.groups]
        draw_segment(generator, work, order[:rows], self.step, self.target, self.segment)
        return work

    def commit(self, drawn: list[GroupInFlight]) -> None:
        self.groups[:] = drawn

    def drop(self) -> None:
        self.groups[:] = [group.fresh() for group in self.groups]


class OneCall:
    """No rounds: one call over every unfinished row that stops at the token step where enough groups finished."""

    def __init__(self, generator, target: StepTarget):
        self.generator, self.target = generator, target

    def generate(self, pool: list[GroupInFlight], step: int) -> dict[str, float]:
        """The step's rows; its metrics (none)."""
        if sum(groups_done(pool)) >= self.target.groups:
            return {}
        rows = unfinished(pool)
        advance_rows(self.generator, pool, rows, Continuation(prefixes=[pool[g].ids[r] for g, r in rows],
                                                              stop_when=finishing_rule(pool, rows, self.target.groups)),
                     step, self.target)
        return {}


class ByRound:
    """Token-budget rounds, one generate call per round, the next step's lent to `rounds.lane` at each round
    (`ahead(step)`: step+1's groups as AheadWork; `speculative`: the lane is one that draws, so the journal has
    `drawn_ahead` and the metrics rollout/overlap_tokens_dropped)."""

    def __init__(self, generator, target: StepTarget, rounds: Rounds, ahead: Callable[[int], AheadWork | None],
                 speculative: bool):
        self.generator, self.target, self.rounds, self.ahead = generator, target, rounds, ahead
        self.speculative = speculative

    def generate(self, pool: list[GroupInFlight], step: int) -> dict[str, float]:
        """The step's rounds; rollout/rounds (and with a lane rollout/overlap_tokens_dropped: tokens drawn ahead past
        the step's last round, cut back)."""
        for group in pool:
            group.start_marks(step)
        number, segment = 0, self.rounds.segment_tokens
        while groups_completed(pool, number - 1) < self.target.groups:
            open_rows = [(g, r) for g, group in enumerate(pool) for r in range(len(group.ids))
                         if not group.finished[r] or group.rounds_done(r) > number]
            due = [(g, r) for g, r in open_rows if pool[g].rounds_done(r) == number]
            self.rounds.lane.lend(lambda: self.ahead(step), step, len(due))
            if due:
                self._draw(pool, due, step)
            tokens, drawn = round_tokens(pool, number)
            if tokens == 0:  # every row was unfinished and none moved: another round would not either
                raise RolloutServerError(f"a round of rollout.segment_tokens={segment} advanced none of "
                                         f"{len(open_rows)} unfinished rows (the generator answered no tokens)")
            self.rounds.write(step, number, version_of(self.generator), (len(open_rows), tokens),
                              groups_completed(pool, number), drawn - len(due) if self.speculative else None)
            number += 1
        dropped = settle(pool, number - 1)
        return {"rollout/rounds": float(number),
                **({"rollout/overlap_tokens_dropped": float(dropped)} if self.speculative else {})}

    def _draw(self, pool: list[GroupInFlight], due: list[tuple[int, int]], step: int) -> None:
        """One round for the rows `due`; when it fails before any row was applied because the lane holds what this
        step needs (the servers of its version were all lent and this step's lost), the lane gives it back and the
        round is drawn again (seeded: the same rows)."""
        segment = self.rounds.segment_tokens
        try:
            draw_segment(self.generator, pool, due, step, self.target, segment)
        except Exception as exc:
            if not self.rounds.lane.reclaim(exc):
                raise
            draw_segment(self.generator, pool, due, step, self.target, segment)


class InOneCall:
    """All of a step's rounds for the unfinished rows in one generate call that stops after the round in which
    enough groups finished; each row's round record split from its new tokens. More rows than `generator` decodes
    as one batch (its rounds_in_one_call): `by_round`."""

    def __init__(self, generator: OneBatchRounds, target: StepTarget, rounds: Rounds, by_round: ByRound):
        self.generator, self.target, self.rounds, self.by_round = generator, target, rounds, by_round

    def generate(self, pool: list[GroupInFlight], step: int) -> dict[str, float]:
        for group in pool:
            group.start_marks(step)
        rows = unfinished(pool)
        if not self.generator.rounds_in_one_call(len(rows)):
            return self.by_round.generate(pool, step)
        if sum(groups_done(pool)) >= self.target.groups:
            return {"rollout/rounds": 0.0}
        segment = self.rounds.segment_tokens
        starts = [len(pool[g].ids[r]) for g, r in rows]
        advance_rows(self.generator, pool, rows, Continuation(
            prefixes=[pool[g].ids[r] for g, r in rows],
            stop_when=at_round_ends(finishing_rule(pool, rows, self.target.groups), segment)), step, self.target)
        for (g, r), start in zip(rows, starts):
            pool[g].marks[r] = round_marks(start, len(pool[g].ids[r]), segment)
        last = max(pool[g].rounds_done(r) for g, r in rows)
        for n in range(last):
            tokens, advanced = round_tokens(pool, n)
            self.rounds.write(step, n, version_of(self.generator), (advanced, tokens), groups_completed(pool, n))
        return {"rollout/rounds": float(last)}


@runtime_checkable
class OneBatchRounds(Protocol):
    """A generator that can draw a step's rounds in one call (rollout=hf: HFGenerator)."""

    def rounds_in_one_call(self, rows: int) -> bool:
        """Whether `rows` continued rows decode as one batch, advancing one token per step together."""
        ...


def generation_mode(generator, target: StepTarget, rounds: Rounds, ahead: Callable[[int], AheadWork | None]):
    """The mode of a producer on `generator` (see the module docstring), chosen once when it is built: OneCall
    without rounds; with rounds, InOneCall on a generator that decodes the rows as one batch (unless a lane draws
    ahead: its rounds are at the next version), else ByRound."""
    if not rounds.segment_tokens:
        return OneCall(generator, target)
    speculative = not isinstance(rounds.lane, NoLane)
    by_round = ByRound(generator, target, rounds, ahead, speculative)
    if not speculative and isinstance(generator, OneBatchRounds):
        return InOneCall(generator, target, rounds, by_round)
    return by_round
