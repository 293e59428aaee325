"""Engines of your own: `rlx.register("engine", NAME, gives=...)` adds a generator factory that rollout=hf builds
in place of rlx's own decoder when `rollout.engine=NAME` (docs/extending/engines.md, examples/transformers_engine.py).

An entry is `fn(rollout settings, model, tokenizer, seed) -> Generator` (a class works: its constructor is the
factory): `version`, `generate_ids(prompts, *, max_new_tokens, seeds, greedy, samples_per_prompt, min_new_tokens,
continuation, schedule) -> Generation`, `publish(model, version)`, `sleep()`, `step_metrics()`, `close()` (the
Protocol in rlx/engines/generator.py). It runs in the training process on the policy module itself, which the
update changes in place; `publish` tells it the version. `gives` (rlx.config.gives.RolloutGives, or a dict of its
fields) says which options it supports: the config rules read it as they read a built-in backend's, so an option
the engine lacks (partial rollouts, a temperature schedule, pipeline mode, ...) stops in one line before the model
loads. An engine that declares nothing gives nothing beyond plain sampling.
"""

from __future__ import annotations

from rlx.config.gives import RolloutGives
from rlx.registry import Registry, publish

ENGINES = publish("engine", Registry("engine", default_needs=RolloutGives()))
BUILTIN = "builtin"  # rollout.engine: rlx's own decoder (rollout=hf)


def register_engine(name: str, gives: RolloutGives | dict | None = None):
    """The `rlx.register("engine", NAME, gives=...)` decorator: the entry with what it gives (its needs, to the
    registry)."""
    return ENGINES.register(name, needs=gives)
