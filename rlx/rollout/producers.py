"""Where a step's training rows come from: the producer protocol every mode implements, and the registry of
producers a user adds (`rollout.producer`).

A producer hands the family's loop one `Batch` per step (rlx/rollout/types.py). Its interface:

    kind: str                 "single_turn" (Batch.source is PromptRows: the policy-gradient and PPO families) or
                              "episodes" (EpisodeRows: the agent family)
    loss_width: int           the longest row it can hand (Dr. GRPO's constant normaliser)
    produce(step) -> Batch    the rows of `step` (1-based), sampled through parts.generator and scored
    checkpointed() -> dict    {name: object with state_dict() / load_state_dict()}: what a resume restores
    records(batch, samples, count) -> list[dict]   the samples files' rows of the first `count` samples

rlx's own: the single-turn producer (rlx/rollout/single_turn.py), partial rollouts (partial.py) and the episode
producer (episodes.py), built by rlx/build.py when `rollout.producer=auto`. A producer of your own is one function
`fn(settings, parts) -> producer`, registered with `rlx.register("producer", NAME)` and chosen with
`rollout.producer=NAME` (docs/extending/producers.md; examples/shortest_first_producer.py builds one from the
single-turn core's pieces). Every wrapper composes with it: pipeline mode samples it ahead in a thread, and with
several processes rank 0 alone calls it for the global batch (rlx/rollout/rank_zero.py).
"""

from __future__ import annotations

from rlx.registry import Registry, publish

PRODUCERS = publish("producer", Registry("producer"))
AUTO = "auto"  # rollout.producer: the family's own producer
