"""Partial rollouts (APRIL, "Active Partial Rollouts in RL": rollout.partial=true): the single-turn producer that
keeps more groups in flight than a step trains, stops generating once enough of them have finished, and carries the
unfinished rows into the next step with the tokens they already have.

Each step:
  1. the pool is filled up to ceil(prompts_per_step x partial_oversample) groups with fresh prompts (in the stream's
     order), each of G rows with its own seed, sample_seed(seed, step it was drawn at, its index among that step's
     fresh rows): with oversample 1 (and nothing carried) exactly the synchronous producer's prompts and seeds;
  2. every unfinished row of the pool is continued from its tokens (Generator.generate_ids(continuation=...): token t of
     a row is drawn from (its seed, position t), as an uninterrupted row would draw it) until prompts_per_step groups
     have finished (every row stopped or reached max_new_tokens), then generation stops: in one call, or in
     token-budget rounds (rollout.segment_tokens), the mode chosen when the producer is built (rlx/rollout/rounds.py);
  3. the finished groups with the smallest draw index are trained, in draw order (not in finishing order, which
     would favour short answers); finished groups beyond prompts_per_step wait for the next step, unfinished rows
     keep their tokens, log-probs and versions.
A row can span versions: each token's sampler log-prob is the one its sampler gave (Rollout.logprobs), so the
token-level correction weighs each token by its own behaviour policy; Rollout.token_versions holds each token's
version and Rollout.versions the row's OLDEST (its first token's), which the staleness metrics use. Rows that waited are
off-policy even with rollout.max_staleness=0: the config rules require rollout.correction.
The pool (rlx/rollout/pool.py: tokens, log-probs, versions, seeds, draw indices) is training state: in checkpoints,
so a resumed run continues the same rows. Partial rollouts need a generator that continues rows and stops early
(rollout=hf), or rounds (rollout=server).

The seed stages that act on finished groups (rlx/rollout/stages/: verifier noise, replay, hints, group reward
shaping, a user's algorithm.stages) run on the step's finished groups as one round, through the same StagePipeline
as the single-turn producer: after scoring, the round's first sample index is 0 (verifier noise's uniforms and
hints' seeds follow the row's position in the step's batch, as for the synchronous producer's one round), and the
stages' state (replay buffer, LASER-D targets) is checkpointed with the pool. With oversample 1 the step is the
synchronous producer's, stages included. The per-position temperature schedule and the difficulty-aware prompt
sampler stay refused (rlx/config/async_rules.py says why).
"""

from __future__ import annotations

import math

from rlx.algorithms.grouping import fixed_groups
from rlx.config.async_rules import partial_schedule_refusal
from rlx.data.sources import PromptSource
from rlx.engines.generator import completion_texts
from rlx.engines.records import Generation, Rollout
from rlx.engines.sampling import sample_seed
from rlx.errors import UserError
from rlx.rewards import RewardComponent
from rlx.rollout.pipeline import staleness_metrics
from rlx.rollout.pool import GroupInFlight, groups_done
from rlx.rollout.prompts import format_prompts
from rlx.rollout.rounds import AheadGroups, Rounds, StepTarget, generation_mode
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


class PartialProducer:
    """Single-turn rows with partial rollouts (see the module docstring); the interface of SingleTurnProducer."""

    def __init__(self, generator, tokenizer, stream: PromptSource, rewards: list[RewardComponent],
                 settings: SingleTurnSettings, *, oversample: float, stages: StagePipeline | None = None,
                 rounds: Rounds | None = None):
        """`settings`: as the single-turn producer's (its dynamic sampling unused); `oversample`: the groups kept in
        flight, a multiple of prompts_per_step (rollout.partial_oversample); `stages`: the seed stages run on the
        groups each step finishes (None or inactive: none); `rounds`: token-budget rounds (rollout.segment_tokens)
        and the lane that draws the next step's ahead (None: no rounds). The generation mode (rlx/rollout/rounds.py)
        is chosen here, once."""
        self.rounds = rounds if rounds is not None else Rounds()
        self.generator, self.tokenizer, self.stream, self.rewards = generator, tokenizer, stream, rewards
        s = settings
        self.settings = s
        self.stages = stages if stages is not None and stages.active else None
        self.group_size, self.prompts_per_step = s.group_size, s.prompts_per_step
        self.in_flight = max(s.prompts_per_step, math.ceil(s.prompts_per_step * oversample))
        self.max_new_tokens, self.seed = s.max_new_tokens, s.seed
        self.use_chat_template, self.system_prompt = s.use_chat_template, s.system_prompt
        self.on_error, self.accuracy_key, self.total_steps = s.on_error, s.accuracy_key, s.total_steps
        self.target = StepTarget(s.prompts_per_step, s.max_new_tokens, s.min_new_tokens)
        self.mode = generation_mode(generator, self.target, self.rounds, self._ahead_for)
        self.pool: list[GroupInFlight] = []  # groups in flight, in draw order
        self.next_index = 0  # draw index of the next fresh group
        self.ahead: list[GroupInFlight] = []  # the next step's fresh groups, drawn early for a lane
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
        return {"pool": [g.state_dict() for g in self.pool], "next_index": self.next_index,
                "ahead": [g.fresh().state_dict() for g in self.ahead]}

    def load_state_dict(self, state: dict) -> None:
        self.pool = [GroupInFlight.from_state(g) for g in state["pool"]]
        self.next_index = int(state["next_index"])
        self.ahead = [GroupInFlight.from_state(g) for g in state["ahead"]]

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

    def _draw(self, step: int, count: int) -> list[GroupInFlight]:
        """`count` fresh groups from the stream, in its order, each row seeded sample_seed(seed, step, index)."""
        if count <= 0:
            return []
        rows = self.stream.take(count)
        prompts = format_prompts(self.tokenizer, rows, self.use_chat_template, self.system_prompt)
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        group, drawn = self.group_size, []
        for i, (row, prompt, prompt_ids) in enumerate(zip(rows, prompts, ids)):
            seeds = [sample_seed(self.seed, step, i * group + j) for j in range(group)]
            drawn.append(GroupInFlight.drawn(self.next_index, row, prompt, prompt_ids, seeds))
            self.next_index += 1
        return drawn

    def _ahead_for(self, step: int) -> AheadGroups | None:
        """The fresh groups of step+1, drawn now from the stream (in its order, with step+1's seeds) for a lane to
        advance while this step finishes; None past the last step."""
        if step + 1 > self.total_steps:
            return None
        if not self.ahead:
            self.ahead = self._draw(step + 1, self.prompts_per_step)
        return AheadGroups(self.ahead, step + 1, self.target, self.rounds.segment_tokens)

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
            generated = self.mode.generate(self.pool, step)
        finally:
            self.rounds.lane.finish()  # a lane of step+1 stops (a call in flight is dropped); its rows wait in ahead
        done = [i for i, finished in enumerate(groups_done(self.pool)) if finished][: self.prompts_per_step]
        chosen = [self.pool[i] for i in done]  # the finished groups first drawn, in draw order
        self.pool = [g for i, g in enumerate(self.pool) if i not in set(done)]
        return self._batch(chosen, step, drawn, generated)

    def _step_metrics(self, groups: list[GroupInFlight], generated: dict[str, float]) -> dict[str, float]:
        """rollout/row_version_span_max: the most versions one trained row's tokens span (newest - oldest sampler
        version, from the per-token versions); the generation mode's (rollout/rounds, ...) and the lane's."""
        spans = [max(v) - min(v) for g in groups for v in g.token_versions if v]
        return {"rollout/row_version_span_max": float(max(spans, default=0)), **generated,
                **self.rounds.lane.metrics()}

    def _batch(self, groups: list[GroupInFlight], step: int, drawn: int, generated: dict[str, float]) -> Batch:
        group = self.group_size
        ids = [ids for g in groups for ids in g.ids]
        out = Generation(ids, [lp for g in groups for lp in g.logprobs], [s for g in groups for s in g.stopped])
        texts = completion_texts(self.tokenizer, ids)
        versions = [tokens or [v if v is not None else 0]  # each token's sampler (a row's oldest: Rollout.versions)
                    for g in groups for v, tokens in zip(g.versions, g.token_versions)]
        rollout = Rollout.from_ids([g.prompt_ids for g in groups], out, group, self.tokenizer.pad_token_id, texts,
                                   versions)
        score = round_scorer(self.rewards, self.settings, step)
        part = scored_round(score, rollout, [g.row for g in groups for _ in range(group)],
                            [g.prompt for g in groups for _ in range(group)], fixed_groups(len(ids), group),
                            self.accuracy_key)
        stage_metrics = {}
        if self.stages is not None:  # the seed stages on the finished groups, as the single-turn producer's one round
            part = self.stages.after_scoring(part, stage_context(self.generator, self.tokenizer, score, self.settings,
                                                                 step), 0)
            stage_metrics = self.stages.after_step([part], step)
        stage_metrics.update(observe_source(self.stream, [part]))  # the source learns from the finished groups
        metrics = round_metrics(part, part.rewards, part.components, part.errors, part.groups, self.accuracy_key, group)
        carried = [g.first_step is not None and g.first_step < step for g in groups]
        metrics.update({"rollout/partial_carried_frac": sum(carried) / max(len(groups), 1),
                        "rollout/partial_pool_groups": len(self.pool), **staleness_metrics(part.rollout.versions, step),
                        **self._step_metrics(groups, generated),
                        **stage_metrics})
        return round_batch(part, group, metrics, prompts_drawn=drawn)

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        """The samples file rows of the first `count` samples, with each row's oldest policy version."""
        return single_turn_records(batch, samples, count, version=True)
