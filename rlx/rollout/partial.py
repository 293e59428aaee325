"""Partial rollouts (APRIL, "Active Partial Rollouts in RL": rollout.partial=true): the single-turn producer that
keeps more groups in flight than a step trains, stops generating once enough of them have finished, and carries the
unfinished rows into the next step with the tokens they already have.

Each step:
  1. the pool is filled up to ceil(prompts_per_step x partial_oversample) groups with fresh prompts (in the stream's
     order), each of G rows with its own seed, sample_seed(seed, step it was drawn at, its index among that step's
     fresh rows): with oversample 1 (and nothing carried) exactly the synchronous producer's prompts and seeds;
  2. every unfinished row of the pool is continued from its tokens (Generator.generate_ids(continuation=...): token t of
     a row is drawn from (its seed, position t), as an uninterrupted row would draw it) until prompts_per_step groups
     have finished (every row stopped or reached max_new_tokens), then generation stops;
  3. the finished groups with the smallest draw index are trained, in draw order (not in finishing order, which
     would favour short answers); finished groups beyond prompts_per_step wait for the next step, unfinished rows
     keep their tokens, log-probs and versions.
A row can span versions: each token's sampler log-prob is the one its sampler gave (Rollout.logprobs), so the
token-level correction weighs each token by its own behaviour policy; Rollout.token_versions holds each token's
version and Rollout.versions the row's OLDEST (its first token's), which the staleness metrics use. Rows that waited are
off-policy even with rollout.max_staleness=0: the config rules require rollout.correction.
The pool (tokens, log-probs, versions, seeds, draw indices) is training state: in checkpoints, so a resumed run
continues the same rows. Partial rollouts need a generator that continues rows and stops early (rollout=hf).

The seed stages that act on finished groups (rlx/rollout/stages/: verifier noise, replay, hints, group reward
shaping, a user's algorithm.stages) run on the step's finished groups as one round, through the same StagePipeline
as the single-turn producer: after scoring, the round's first sample index is 0 (verifier noise's uniforms and
hints' seeds follow the row's position in the step's batch, as for the synchronous producer's one round), and the
stages' state (replay buffer, LASER-D targets) is checkpointed with the pool. With oversample 1 the step is the
synchronous producer's, stages included. The per-position temperature schedule and the difficulty-aware prompt
sampler stay refused (rlx/config/async_rules.py says why).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rlx.algorithms.grouping import fixed_groups
from rlx.config.async_rules import partial_schedule_refusal
from rlx.data.sources import PromptSource
from rlx.engines.generator import Continuation
from rlx.engines.records import Generation, Rollout
from rlx.engines.sampling import sample_seed
from rlx.errors import NoServerAtVersion, RolloutServerError, UserError
from rlx.rewards import RewardComponent
from rlx.rollout.overlap import (
    StepOverlap,
    fresh_copy,
    groups_completed,
    round_tokens,
    rounds_done,
    settle,
    start_marks,
)
from rlx.rollout.pipeline import staleness_metrics
from rlx.rollout.prompts import format_prompts
from rlx.rollout.single_turn import (
    SingleTurnSettings,
    observe_source,
    round_batch,
    round_metrics,
    round_scorer,
    scored_round,
    single_turn_records,
    stage_context,
)
from rlx.rollout.stages import StagePipeline
from rlx.rollout.types import Batch


def new_group(index: int, row: dict, prompt: str, prompt_ids: list[int], seeds: list[int]) -> dict:
    """A group in flight: its draw index, data row, rendered prompt and ids, and per row: seed, tokens so far, their
    sampler log-probs, the version of its first token (None before it has one), finished and stopped flags."""
    rows = len(seeds)
    return {"index": index, "row": row, "prompt": prompt, "prompt_ids": prompt_ids, "seeds": list(seeds),
            "ids": [[] for _ in range(rows)], "logprobs": [[] for _ in range(rows)], "versions": [None] * rows,
            "finished": [False] * rows, "stopped": [False] * rows, "first_step": None}


def groups_done(pool: list[dict]) -> list[bool]:
    return [all(g["finished"]) for g in pool]


def finishing_rule(pool: list[dict], rows: list[tuple[int, int]], target: int):
    """stop_when for one generate call over `rows` ((group position, row) of each unfinished row): True once `target`
    groups of the pool have every row finished (before the call or in it)."""
    group_of = torch.tensor([g for g, _ in rows], dtype=torch.long)  # (R,)
    missing = torch.tensor([len(g["finished"]) - sum(g["finished"]) for g in pool], dtype=torch.long)  # (groups,)
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


def advance_rows(generator, pool: list[dict], rows: list[tuple[int, int]], continuation: Continuation, step: int,
                 max_new_tokens: int, min_new_tokens: int) -> int:
    """Continue `rows` ((group position, row) of `pool`) on `generator` as `continuation` says; their new tokens,
    log-probs and per-token versions (the generator's version) go into the groups, and each row's round record
    (marks) gets its new length. Returns the tokens drawn."""
    out: Generation = generator.generate_ids(
        [pool[g]["prompt_ids"] for g, _ in rows], max_new_tokens=max_new_tokens,
        seeds=[pool[g]["seeds"][r] for g, r in rows], min_new_tokens=min_new_tokens, continuation=continuation)
    version = int(getattr(generator, "version", 0) or 0)
    drawn = 0
    for (g, r), new, logprobs, stopped in zip(rows, out.ids, out.logprobs or [None] * len(rows), out.stopped):
        group = pool[g]
        group.setdefault("token_versions", [[] for _ in group["ids"]])[r] += [version] * len(new)
        if new and group["versions"][r] is None:
            group["versions"][r] = version
        if group["first_step"] is None and new:
            group["first_step"] = step
        group["ids"][r] += list(new)
        group["logprobs"][r] += list(logprobs) if logprobs is not None else [0.0] * len(new)
        group["stopped"][r] = bool(stopped)
        group["finished"][r] = bool(stopped) or len(group["ids"][r]) >= max_new_tokens
        if "marks" in group:
            group["marks"][r].append(len(group["ids"][r]))
        drawn += len(new)
    return drawn


@dataclass
class Rounds:
    """Token-budget rounds of partial rollouts (rollout.segment_tokens): every unfinished row advances at most
    `segment_tokens` tokens per round (0: off, one call per step); `journal`: the run's rounds.jsonl, one line
    per round (step, round, version, rows advanced, tokens, groups completed, and, as information only, rows
    answered per server so far), written by the main process (None: not written)."""

    segment_tokens: int = 0
    journal: Path | None = None
    _cut_from: int | None = None  # a resumed run drops the lines of steps it redoes, once

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


class PartialProducer:
    """Single-turn rows with partial rollouts (see the module docstring); the interface of SingleTurnProducer."""

    def __init__(self, generator, tokenizer, stream: PromptSource, rewards: list[RewardComponent],
                 settings: SingleTurnSettings, *, oversample: float, stages: StagePipeline | None = None,
                 rounds: Rounds | None = None):
        """`settings`: as the single-turn producer's (its dynamic sampling unused); `oversample`: the groups kept in
        flight, a multiple of prompts_per_step (rollout.partial_oversample); `stages`: the seed stages run on the
        groups each step finishes (None or inactive: none); `rounds`: token-budget rounds (rollout.segment_tokens)."""
        self.rounds, self.last_rounds = rounds if rounds is not None else Rounds(), 0
        self.generator, self.tokenizer, self.stream, self.rewards = generator, tokenizer, stream, rewards
        s = settings
        self.settings = s
        self.stages = stages if stages is not None and stages.active else None
        self.group_size, self.prompts_per_step = s.group_size, s.prompts_per_step
        self.in_flight = max(s.prompts_per_step, math.ceil(s.prompts_per_step * oversample))
        self.max_new_tokens, self.min_new_tokens, self.seed = s.max_new_tokens, s.min_new_tokens, s.seed
        self.use_chat_template, self.system_prompt = s.use_chat_template, s.system_prompt
        self.on_error, self.accuracy_key, self.total_steps = s.on_error, s.accuracy_key, s.total_steps
        self.pool: list[dict] = []  # groups in flight, in draw order
        self.next_index = 0  # draw index of the next fresh group
        self.ahead: list[dict] = []  # the next step's fresh groups, drawn early (rollout.server.overlap_steps)
        self.overlap: StepOverlap | None = None  # set by the pipeline with rollout.server.overlap_steps
        self.dropped = 0  # tokens drawn ahead past the step's last round and cut back (this step)
        self.unscheduled(1)

    @property
    def loss_width(self) -> int:
        return int(self.max_new_tokens)

    def checkpointed(self) -> dict:
        """The position in the prompts, the pool, and the stages' state (replay buffer, LASER-D targets)."""
        return {"data": self.stream, "partial": self, **(self.stages.checkpointed() if self.stages is not None else {})}

    def state_dict(self) -> dict:
        """The pool, the next draw index, and the groups drawn ahead for the next step (as drawn: what a lane drew
        for them is not kept, the resumed run draws it again)."""
        return {"pool": copy.deepcopy(self.pool), "next_index": self.next_index,
                "ahead": [fresh_copy(g) for g in self.ahead]}

    def load_state_dict(self, state: dict) -> None:
        self.pool, self.next_index = copy.deepcopy(state["pool"]), int(state["next_index"])
        self.ahead = copy.deepcopy(state.get("ahead", []))

    def _refill(self, step: int) -> int:
        """Fresh groups up to `in_flight` (those drawn ahead for this step first); returns how many were drawn."""
        fresh = self.in_flight - len(self.pool)
        if fresh <= 0:
            return 0
        ahead, self.ahead = self.ahead[:fresh], self.ahead[fresh:]
        if self.ahead:
            raise RuntimeError(f"{len(self.ahead)} groups were drawn ahead beyond the {fresh} step {step} takes")
        self.pool += ahead + self._draw(step, fresh - len(ahead))
        return fresh

    def _draw(self, step: int, count: int) -> list[dict]:
        """`count` fresh groups from the stream, in its order, each row seeded sample_seed(seed, step, index)."""
        if count <= 0:
            return []
        rows = self.stream.take(count)
        prompts = format_prompts(self.tokenizer, rows, self.use_chat_template, self.system_prompt)
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        group, drawn = self.group_size, []
        for i, (row, prompt, prompt_ids) in enumerate(zip(rows, prompts, ids)):
            seeds = [sample_seed(self.seed, step, i * group + j) for j in range(group)]
            drawn.append(new_group(self.next_index, row, prompt, prompt_ids, seeds))
            self.next_index += 1
        return drawn

    def _generate(self, step: int) -> int:
        """Continue the pool's unfinished rows until prompts_per_step groups have finished. Returns tokens drawn.
        With rounds (rollout.segment_tokens = S): every unfinished row advances at most S tokens per round at the
        round's version, round after round, until prompts_per_step groups have finished; each round is a line of
        rounds.jsonl. Without: one call that stops at the token step where enough groups finished."""
        if self.rounds.segment_tokens:
            return self._rounds(step)
        if sum(groups_done(self.pool)) >= self.prompts_per_step:
            return 0
        rows = self._unfinished()
        return self._advance(rows, Continuation(prefixes=[self.pool[g]["ids"][r] for g, r in rows],
                                                stop_when=finishing_rule(self.pool, rows, self.prompts_per_step)), step)

    def _unfinished(self) -> list[tuple[int, int]]:
        return [(g, r) for g, group in enumerate(self.pool) for r in range(self.group_size) if not group["finished"][r]]

    def _rounds(self, step: int) -> int:
        """Round r advances every row unfinished at its start by at most S tokens, except rows a lane drew ahead
        (rollout.server.overlap_steps), whose segment of round r is already recorded; rounds end after the first in
        which prompts_per_step groups have finished (counted round by round), and rows drawn past it are cut back.
        A generator that decodes the rows as one batch (rollout=hf) draws all of a step's rounds in one call that
        stops at the end of that round: every round is at the step's version, so the rows are the same (without the
        prompt and prefix encoded again each round), and the journal's lines are made from the rows' lengths."""
        for group in self.pool:
            start_marks(group, step)
        rows = self._unfinished()
        if self.overlap is None and getattr(self.generator, "rounds_in_one_call", lambda _: False)(len(rows)):
            return self._rounds_in_one_call(rows, step)
        drawn, number, segment = 0, 0, self.rounds.segment_tokens
        while groups_completed(self.pool, number - 1) < self.prompts_per_step:
            unfinished = [(g, r) for g, group in enumerate(self.pool) for r in range(self.group_size)
                          if not group["finished"][r] or rounds_done(group, r) > number]
            due = [(g, r) for g, r in unfinished if rounds_done(self.pool[g], r) == number]
            if self.overlap is not None:
                self.overlap.lend(self._ahead_for(step), step, len(due), self._segment)
            if due:
                self._draw_round(due, step)
            tokens, ahead = round_tokens(self.pool, number)
            if tokens == 0:  # every row was unfinished and none moved: another round would not either
                raise RolloutServerError(f"a round of rollout.segment_tokens={segment} advanced none of "
                                         f"{len(unfinished)} unfinished rows (the generator answered no tokens)")
            drawn += tokens
            self._journal(step, number, len(unfinished), tokens, ahead - len(due))
            number += 1
        self.dropped = settle(self.pool, number - 1)
        self.last_rounds = number
        return drawn

    def _rounds_in_one_call(self, rows: list[tuple[int, int]], step: int) -> int:
        """All of the step's rounds for the unfinished `rows` in one generate call that stops after the round in
        which prompts_per_step groups have finished; each row's round record is split from its new tokens."""
        self.dropped = self.last_rounds = 0
        if sum(groups_done(self.pool)) >= self.prompts_per_step:
            return 0
        segment = self.rounds.segment_tokens
        starts = [len(self.pool[g]["ids"][r]) for g, r in rows]
        drawn = self._advance(rows, Continuation(prefixes=[self.pool[g]["ids"][r] for g, r in rows],
                                                 stop_when=at_round_ends(finishing_rule(
                                                     self.pool, rows, self.prompts_per_step), segment)), step)
        for (g, r), start in zip(rows, starts):
            self.pool[g]["marks"][r] = round_marks(start, len(self.pool[g]["ids"][r]), segment)
        self.last_rounds = max(rounds_done(self.pool[g], r) for g, r in rows)
        for n in range(self.last_rounds):
            tokens, advanced = round_tokens(self.pool, n)
            self._journal(step, n, advanced, tokens)
        return drawn

    def _journal(self, step: int, number: int, advanced: int, tokens: int, drawn_ahead: int = 0) -> None:
        """The rounds.jsonl line of round `number`: `advanced` rows unfinished at its start, `tokens` drawn."""
        line = {"step": step, "round": number, "version": self._version(), "rows_advanced": advanced,
                "tokens": tokens, "groups_completed": groups_completed(self.pool, number), "served": self._served()}
        if self.overlap is not None:
            line["drawn_ahead"] = drawn_ahead  # information only: rows whose segment a lane drew earlier
        self.rounds.record(line)

    def _draw_round(self, due: list[tuple[int, int]], step: int) -> None:
        """One round for the rows `due`; with overlap, when the servers of this step's version were all lost to
        the next step's lane, they are moved back and the round is drawn again (seeded: the same rows)."""
        try:
            self._segment(self.generator, self.pool, due, step)
        except NoServerAtVersion:  # raised before any row of the round was applied
            if self.overlap is None:
                raise
            self.overlap.reclaim()
            self._segment(self.generator, self.pool, due, step)

    def _ahead_for(self, step: int) -> list[dict] | None:
        """The fresh groups of step+1, drawn now from the stream (in its order, with step+1's seeds) for a lane to
        advance while this step finishes; None past the last step."""
        if step + 1 > self.total_steps:
            return None
        if not self.ahead:
            self.ahead = self._draw(step + 1, self.prompts_per_step)
        return self.ahead

    def _round_metrics(self, groups: list[dict]) -> dict[str, float]:
        """rollout/rounds (rounds this step, with rollout.segment_tokens) and rollout/row_version_span_max: the most
        versions one trained row's tokens span (newest - oldest sampler version, from the per-token versions)."""
        spans = [max(v) - min(v) for g in groups for v in g.get("token_versions", []) if v]
        metrics = {"rollout/row_version_span_max": float(max(spans, default=0))}
        if self.rounds.segment_tokens:
            metrics["rollout/rounds"] = float(self.last_rounds)
        if self.overlap is not None:
            metrics.update({"rollout/overlap_tokens_dropped": float(self.dropped), **self.overlap.step_metrics()})
        return metrics

    def _version(self) -> int:
        return int(getattr(self.generator, "version", 0) or 0)

    def _served(self) -> dict:
        """Information only: rows answered per server so far (a fleet), which server served what and when."""
        client = getattr(self.generator, "client", None)
        return {m.url: m.answered for m in getattr(client, "members", [])}

    def _advance(self, rows: list[tuple[int, int]], continuation: Continuation, step: int) -> int:
        """Continue `rows` (pool group, row) as `continuation` says; their new tokens, log-probs and per-token
        versions go into the pool. Returns the tokens drawn."""
        return advance_rows(self.generator, self.pool, rows, continuation, step, self.max_new_tokens,
                            self.min_new_tokens)

    def _segment(self, generator, groups: list[dict], rows: list[tuple[int, int]], step: int) -> int:
        """One round of rollout.segment_tokens for `rows` of `groups` on `generator` (this step's, or a lane's)."""
        return advance_rows(generator, groups, rows, Continuation(prefixes=[groups[g]["ids"][r] for g, r in rows],
                                                                  segment=self.rounds.segment_tokens),
                            step, self.max_new_tokens, self.min_new_tokens)

    def unscheduled(self, step: int) -> None:
        """A stage's per-position temperature schedule cannot hold for a row begun at an earlier step: refused with
        the config rule's line (rollout.temperature_schedule is refused before the run; a user's stage only here)."""
        if self.stages is not None and self.stages.schedule(step, self.max_new_tokens) is not None:
            raise UserError(partial_schedule_refusal("a stage of algorithm.stages",
                                                     "algorithm.stages without that stage"))

    def produce(self, step: int) -> Batch:
        self.unscheduled(step)
        drawn = self._refill(step)
        try:
            self._generate(step)
        finally:
            if self.overlap is not None:
                self.overlap.finish()  # the lane of step+1 stops (a call in flight is dropped); its rows wait in ahead
        done = [i for i, finished in enumerate(groups_done(self.pool)) if finished][: self.prompts_per_step]
        chosen = [self.pool[i] for i in done]  # the finished groups first drawn, in draw order
        self.pool = [g for i, g in enumerate(self.pool) if i not in set(done)]
        return self._batch(chosen, step, drawn)

    def _batch(self, groups: list[dict], step: int, drawn: int) -> Batch:
        group = self.group_size
        ids = [ids for g in groups for ids in g["ids"]]
        out = Generation(ids, [lp for g in groups for lp in g["logprobs"]], [s for g in groups for s in g["stopped"]])
        width = max((len(c) for c in ids), default=0)
        padded = torch.full((len(ids), width), self.tokenizer.pad_token_id, dtype=torch.long)
        for row, c in enumerate(ids):
            padded[row, : len(c)] = torch.tensor(c, dtype=torch.long)
        texts = self.tokenizer.batch_decode(padded, skip_special_tokens=True)
        versions = [tokens or [v if v is not None else 0]  # each token's sampler (a row's oldest: Rollout.versions)
                    for g in groups for v, tokens in zip(g["versions"], g.get("token_versions", [[]] * group))]
        rollout = Rollout.from_ids([g["prompt_ids"] for g in groups], out, group, self.tokenizer.pad_token_id, texts,
                                   versions)
        score = round_scorer(self.rewards, self.settings, step)
        part = scored_round(score, rollout, [g["row"] for g in groups for _ in range(group)],
                            [g["prompt"] for g in groups for _ in range(group)], fixed_groups(len(ids), group),
                            self.accuracy_key)
        stage_metrics = {}
        if self.stages is not None:  # the seed stages on the finished groups, as the single-turn producer's one round
            part = self.stages.after_scoring(part, stage_context(self.generator, self.tokenizer, score, self.settings,
                                                                 step), 0)
            stage_metrics = self.stages.after_step([part], step)
        stage_metrics.update(observe_source(self.stream, [part]))  # the source learns from the finished groups
        metrics = round_metrics(part, part.rewards, part.components, part.errors, part.groups, self.accuracy_key, group)
        carried = [g["first_step"] is not None and g["first_step"] < step for g in groups]
        metrics.update({"rollout/partial_carried_frac": sum(carried) / max(len(groups), 1),
                        "rollout/partial_pool_groups": len(self.pool), **staleness_metrics(part.rollout.versions, step),
                        **self._round_metrics(groups),
                        **stage_metrics})
        return round_batch(part, group, metrics, prompts_drawn=drawn)

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        """The samples file rows of the first `count` samples, with each row's oldest policy version."""
        return single_turn_records(batch, samples, count, version=True)
