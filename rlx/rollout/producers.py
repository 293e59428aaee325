"""Where a step's training rows come from: the `Producer` protocol every mode implements, and the registry of
producers a user adds (`rollout.producer`).

A producer hands the family's loop one `Batch` per step (rlx/rollout/types.py). What rows it hands is the batch's
own record: `Batch.source` is PromptRows (single-turn rows: the policy-gradient and PPO families) or EpisodeRows
(the agent family), and the loop's credit rule is chosen by that record (rlx/loops/credit.py). What a producer
counts while sampling (prompts drawn, draws of dynamic sampling, ...) goes into `Batch.metrics`.

rlx's own: the single-turn producer (rlx/rollout/single_turn.py), partial rollouts (partial.py) and the episode
producer (episodes.py), built by rlx/build.py when `rollout.producer=auto`. To change only which prompts a step
draws, a prompt source is the smaller plugin (rlx/data/sources.py: it keeps the stages, dynamic sampling, the
temperature schedule and partial rollouts); a producer of your own is for what a source cannot say: how rows are
sampled or scored. It is one function `fn(settings, parts) -> Producer`, registered with
`rlx.register("producer", NAME)` and chosen with `rollout.producer=NAME` (docs/extending/producers.md). Every
wrapper composes with it: pipeline mode samples it ahead in a thread, and with several processes rank 0 alone
calls it for the global batch (rlx/rollout/rank_zero.py).
"""

from __future__ import annotations

from typing import Protocol

from rlx.registry import Registry, publish
from rlx.rollout.types import Batch

PRODUCERS = publish("producer", Registry("producer"))
AUTO = "auto"  # rollout.producer: the family's own producer


class Producer(Protocol):
    """What the loops call on a producer (rlx's own and a user's alike)."""

    @property
    def loss_width(self) -> int:
        """The longest row it can hand (Dr. GRPO's constant normaliser): rollout.max_new_tokens for single-turn
        rows."""
        ...

    def produce(self, step: int) -> Batch:
        """The rows of `step` (1-based), sampled through the run's generator and scored."""
        ...

    def checkpointed(self) -> dict:
        """{name: object with state_dict() / load_state_dict()}: what a checkpoint saves and a resume restores."""
        ...

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        """The samples files' rows of the first `count` samples (`samples`: the loop's per-sample figures)."""
        ...
