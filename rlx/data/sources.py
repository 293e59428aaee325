"""Prompt sources: which training rows a single-turn step draws, the plugin point for a curriculum.

A source hands the producer the next prompts and learns from how the policy did on them:

    take(n) -> list[dict]                the next n training rows (a row may come again: epochs, re-draws)
    observe(rows, verdicts) -> dict      after the step's stages: the data row of every group the producer drew
                                         (dynamic sampling's dropped ones too), in the order drawn, and for each a
                                         (g,) bool tensor, the verdicts of its own samples as first drawn (before
                                         replay and hints); returns the source's metrics for the step ({} for none)
    state_dict() / load_state_dict(s)    its whole state, checkpointed as "data", so a resumed run draws exactly
                                         what the uninterrupted one would

Everything else of the producer stays as it is: the stages, dynamic sampling, the temperature schedule, partial
rollouts, pipeline mode and rank-0 sampling. An entry of PROMPT_SOURCES is `fn(rows, settings) -> PromptSource`
(`rows`: the training rows; `settings`: the run's typed settings), chosen with algorithm.prompt_sampling.source
and added with `rlx.register("prompt_source", NAME)` (docs/extending/sources.md; examples/shortest_first_source.py).
Anchor: verl's AbstractCurriculumSampler (`update(batch)`): a curriculum is a sampler, not a rollout.
"""

from __future__ import annotations

import random
from typing import Protocol

import torch

from rlx.data.difficulty import DifficultySampler
from rlx.registry import Registry, publish

# name -> fn(rows, settings) -> PromptSource; algorithm.prompt_sampling.source (auto: `source_name`)
PROMPT_SOURCES = publish("prompt_source", Registry("prompt source"))
AUTO = "auto"


class PromptSource(Protocol):
    """Where a single-turn producer's prompts come from (see the module docstring)."""

    def take(self, n: int) -> list[dict]: ...

    def observe(self, rows: list[dict], verdicts: list[torch.Tensor]) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class PromptStream:
    """Endless seeded stream of training rows, reshuffled each epoch; its position can be saved. It learns
    nothing from verdicts."""

    def __init__(self, rows: list[dict], seed: int):
        self.rows, self.seed = rows, seed
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[dict]:
        batch = []
        while len(batch) < n:
            if self.index >= len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation()
            batch.append(self.rows[self._order[self.index]])
            self.index += 1
        return batch

    def observe(self, rows: list[dict], verdicts: list[torch.Tensor]) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation()


@PROMPT_SOURCES.register("stream")
def _stream(rows: list[dict], settings) -> PromptStream:
    return PromptStream(rows, settings.seed)


@PROMPT_SOURCES.register("difficulty")
def _difficulty(rows: list[dict], settings) -> DifficultySampler:
    sampling = settings.algorithm.prompt_sampling
    return DifficultySampler(rows, settings.seed, sampling.mode, sampling.ema, sampling.eps, sampling.prior,
                             sampling.retire_after)


def source_name(sampling) -> str:
    """The PROMPT_SOURCES entry of algorithm.prompt_sampling: its `source`, where auto is the difficulty sampler
    when a weighting `mode` other than uniform is set, else the shuffled stream."""
    if sampling.source != AUTO:
        return sampling.source
    return "difficulty" if sampling.mode != "uniform" else "stream"


def prompt_source(rows: list[dict], settings) -> tuple[str, PromptSource]:
    """(the entry's name, the source over the training `rows`) of the run's typed `settings`."""
    name = source_name(settings.algorithm.prompt_sampling)
    return name, PROMPT_SOURCES[name](rows, settings)
