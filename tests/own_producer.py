"""A producer of one's own for the plugin tests (docs/extending/producers.md): the training rows in order of question
length, each step the next `prompts_per_step` of them, sampled, scored and batched with the single-turn core's
pieces (rlx/rollout/single_turn.py). A prompt source says this in fewer lines (examples/shortest_first_source.py);
the tests use a producer to check the producer plugin point itself: registration, the refusals, the wrong rows,
pipeline and rank-0 wrapping, checkpointing its own state.

    rlx train plugins=[tests.own_producer] rollout.producer=shortest_first
"""

from __future__ import annotations

import torch

import rlx
from rlx.build import single_turn_settings
from rlx.engines.generator import Draw, sample_rollout
from rlx.engines.sampling import sample_seed
from rlx.rollout.prompts import format_prompts
from rlx.rollout.single_turn import (
    round_batch,
    round_metrics,
    round_scorer,
    scored_round,
    single_turn_records,
)


class Position:
    """How many prompts the curriculum has handed out: checkpointed (state_dict / load_state_dict)."""

    def __init__(self):
        self.taken = 0

    def state_dict(self) -> dict:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self.taken = int(state["taken"])


class ShortestFirst:
    """Hands PromptRows batches: the rows the policy-gradient and PPO loops train."""

    def __init__(self, settings, parts):
        self.settings, self.parts = settings, parts
        self.rows = sorted(parts.train_rows, key=lambda row: len(str(row["question"])))
        self.group = settings.rollout.samples_per_prompt
        self.loss_width = settings.rollout.max_new_tokens
        self.position = Position()

    def checkpointed(self) -> dict:
        return {"shortest_first": self.position}

    def produce(self, step: int):
        s, parts, group = self.settings, self.parts, self.group
        first = self.position.taken
        rows = [self.rows[(first + i) % len(self.rows)] for i in range(s.prompts_per_step)]
        self.position.taken += len(rows)
        prompts = format_prompts(parts.tokenizer, rows, s.model.chat_template, s.data.system_prompt)
        draw = Draw(samples_per_prompt=group, max_new_tokens=s.rollout.max_new_tokens,
                    min_new_tokens=s.rollout.min_new_tokens)
        seeds = [sample_seed(s.seed, step, i) for i in range(len(prompts) * group)]  # row i of step: its own seed
        rollout = sample_rollout(parts.generator, parts.tokenizer, prompts, draw, seeds)
        score = round_scorer(parts.rewards, single_turn_settings(s, group), step)
        part = scored_round(score, rollout, [row for row in rows for _ in range(group)],
                            [p for p in prompts for _ in range(group)],
                            torch.arange(len(rows)).repeat_interleave(group), s.reward.accuracy)
        metrics = round_metrics(part, part.rewards, part.components, part.errors, part.groups, s.reward.accuracy, group)
        metrics["curriculum/longest_question_chars"] = max(len(str(row["question"])) for row in rows)
        return round_batch(part, group, metrics, prompts_drawn=len(rows))

    def records(self, batch, samples: list[dict], count: int) -> list[dict]:
        return single_turn_records(batch, samples, count)


@rlx.register("producer", "shortest_first")
def shortest_first(settings, parts) -> ShortestFirst:
    return ShortestFirst(settings, parts)
