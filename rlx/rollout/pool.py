"""The groups in flight of partial rollouts (rollout.partial=true, rlx/rollout/partial.py): one typed record per
group, owned by this module, and what is done to a pool of them (a list in draw order).

A group is drawn once (its prompt and a seed per row), then its rows grow step after step until every row has
finished. With token-budget rounds (rollout.segment_tokens) each row also keeps the round record of the current step
(`marks`: its length at the step's start and after each round that advanced it). The record is what lets a step count
its rounds in order even when some of them were drawn earlier, ahead of the step (rollout.server.overlap_steps): a
row's segment of round r depends only on the row (prompt, seed, tokens so far), the budget and the weights, so a
segment drawn early is the one the step would draw; what cannot be known early is where the step stops (after the
round in which prompts_per_step groups have finished, counted over the whole pool), so rows drawn past that round are
cut back to it (`settle`), their extra tokens never part of a batch.

Checkpoints hold each group's `state_dict()` (plain lists, numbers and the data row), read back by `from_state`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace


@dataclass
class GroupInFlight:
    """A group in flight. Drawn: its draw index, data row, rendered prompt and its ids, a seed per row. Per row: the
    tokens so far, their sampler log-probs and versions, the version of its first token (None before it has one),
    finished (stopped, or max_new_tokens reached) and stopped (ended by the model) flags. `first_step`: the step that
    drew its first token (None before). The round record of step `marks_step` (None: never begun): per row, its
    length at that step's start and after each round that advanced it."""

    index: int
    row: dict
    prompt: str
    prompt_ids: list[int]
    seeds: list[int]
    ids: list[list[int]]
    logprobs: list[list[float]]
    token_versions: list[list[int]]
    versions: list[int | None]
    finished: list[bool]
    stopped: list[bool]
    first_step: int | None = None
    marks: list[list[int]] = field(default_factory=list)
    marks_step: int | None = None

    @classmethod
    def drawn(cls, index: int, row: dict, prompt: str, prompt_ids: list[int], seeds: list[int]) -> GroupInFlight:
        """A fresh group: rows of no token yet."""
        rows = len(seeds)
        return cls(index, row, prompt, prompt_ids, list(seeds), [[] for _ in range(rows)], [[] for _ in range(rows)],
                   [[] for _ in range(rows)], [None] * rows, [False] * rows, [False] * rows)

    @property
    def done(self) -> bool:
        """Every row finished."""
        return all(self.finished)

    def missing(self) -> int:
        """Rows not finished yet."""
        return len(self.finished) - sum(self.finished)

    def extend(self, row: int, new: list[int], logprobs: list[float] | None, stopped: bool, version: int, step: int,
               max_new_tokens: int) -> None:
        """`new` tokens for `row`, drawn at `step` by weights `version` with their sampler `logprobs` (None: not given,
        0.0 each); the row has finished when stopped or at max_new_tokens. A begun round record gets its new length."""
        self.token_versions[row] += [version] * len(new)
        if new and self.versions[row] is None:
            self.versions[row] = version
        if self.first_step is None and new:
            self.first_step = step
        self.ids[row] += list(new)
        self.logprobs[row] += list(logprobs) if logprobs is not None else [0.0] * len(new)
        self.stopped[row] = bool(stopped)
        self.finished[row] = bool(stopped) or len(self.ids[row]) >= max_new_tokens
        if self.marks:
            self.marks[row].append(len(self.ids[row]))

    def start_marks(self, step: int) -> None:
        """Begin the round record for `step` (unless it was begun, by a lane that drew ahead for it)."""
        if self.marks_step != step:
            self.marks = [[len(ids)] for ids in self.ids]
            self.marks_step = step

    def rounds_done(self, row: int) -> int:
        """Rounds of the current step that have advanced `row` (the round it finished in counts)."""
        return len(self.marks[row]) - 1

    def finished_by(self, row: int, round_: int) -> bool:
        """Whether `row` had finished by the end of round `round_` (-1: before the step's first round)."""
        return bool(self.finished[row]) and self.rounds_done(row) <= round_ + 1

    def completed_by(self, round_: int) -> bool:
        """Whether every row had finished by the end of round `round_`."""
        return all(self.finished_by(r, round_) for r in range(len(self.ids)))

    def round_tokens(self, round_: int) -> tuple[int, int]:
        """(tokens drawn in round `round_` over the rows, rows whose segment of that round is drawn)."""
        tokens = rows = 0
        for marks in self.marks:
            if len(marks) - 1 > round_:
                tokens += marks[round_ + 1] - marks[round_]
                rows += 1
        return tokens, rows

    def settle(self, last_round: int) -> int:
        """Cut every row drawn past round `last_round` back to its tokens after that round (it was unfinished then),
        the group left with no token back to no first step; returns the tokens dropped."""
        dropped = 0
        for r, marks in enumerate(self.marks):
            if len(marks) - 1 <= last_round + 1:
                continue
            keep = marks[last_round + 1]
            dropped += len(self.ids[r]) - keep
            self.ids[r], self.logprobs[r] = self.ids[r][:keep], self.logprobs[r][:keep]
            self.token_versions[r] = self.token_versions[r][:keep]
            if keep == 0:
                self.versions[r] = None
            self.finished[r] = self.stopped[r] = False
            del marks[last_round + 2:]
        if not any(self.ids):  # nothing drawn for it after all: its first tokens come at a later step
            self.first_step = None
        return dropped

    def fresh(self) -> GroupInFlight:
        """This group as drawn, before any token (a lane's work dropped, or a checkpoint of a group drawn ahead)."""
        return GroupInFlight.drawn(self.index, self.row, self.prompt, self.prompt_ids, self.seeds)

    def copy(self) -> GroupInFlight:
        """A copy whose rows (tokens, log-probs, versions, flags, round record) grow apart from this group's."""
        return replace(self, ids=[list(x) for x in self.ids], logprobs=[list(x) for x in self.logprobs],
                       token_versions=[list(x) for x in self.token_versions], versions=list(self.versions),
                       finished=list(self.finished), stopped=list(self.stopped),
                       marks=[list(x) for x in self.marks])

    def state_dict(self) -> dict:
        """The group for a checkpoint: plain values, copied."""
        return {"index": self.index, "row": copy.deepcopy(self.row), "prompt": self.prompt,
                "prompt_ids": list(self.prompt_ids), "seeds": list(self.seeds), "ids": [list(x) for x in self.ids],
                "logprobs": [list(x) for x in self.logprobs],
                "token_versions": [list(x) for x in self.token_versions], "versions": list(self.versions),
                "finished": list(self.finished), "stopped": list(self.stopped), "first_step": self.first_step,
                "marks": [list(x) for x in self.marks], "marks_step": self.marks_step}

    @classmethod
    def from_state(cls, state: dict) -> GroupInFlight:
        """The group a `state_dict()` was taken of (its lists copied)."""
        return cls(**copy.deepcopy(state))


def groups_done(pool: list[GroupInFlight]) -> list[bool]:
    """Per group of the pool: every row finished."""
    return [g.done for g in pool]


def unfinished(pool: list[GroupInFlight]) -> list[tuple[int, int]]:
    """(group position, row) of every unfinished row, in pool order."""
    return [(g, r) for g, group in enumerate(pool) for r in range(len(group.ids)) if not group.finished[r]]


def groups_completed(pool: list[GroupInFlight], round_: int) -> int:
    """Groups whose every row had finished by the end of round `round_`."""
    return sum(g.completed_by(round_) for g in pool)


def round_tokens(pool: list[GroupInFlight], round_: int) -> tuple[int, int]:
    """(tokens drawn in round `round_` over the pool's rows, rows whose segment of that round is drawn)."""
    counts = [g.round_tokens(round_) for g in pool]
    return sum(t for t, _ in counts), sum(r for _, r in counts)


def settle(pool: list[GroupInFlight], last_round: int) -> int:
    """Every group cut back to round `last_round` (GroupInFlight.settle); the tokens dropped."""
    return sum(g.settle(last_round) for g in pool)
