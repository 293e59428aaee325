"""Several built-in environments behind one, one drawn per episode: the warm start of the tiny agent
(recipe tiny_agent_sft) learns all of them from one demonstration stream, so one asset
(builtin:tiny_agent) starts every agent recipe with partial skill.

The seed picks both the environment and its task: environment index = seed % n, task seed =
seed // n. The G episodes of a group (same seed) therefore play the same environment and task, and
consecutive held-out seeds cover the environments evenly. Observations are the sub-environment's own
(each environment's text shows which it is); the anchor is (environment name, its anchor).
"""

from __future__ import annotations

import random

from rlx.envs.registry import ENVIRONMENTS


@ENVIRONMENTS.register("mixture")
class Mixture:
    """envs: {name: kwargs} of registered environments (rlx.envs.ENVIRONMENTS), in a fixed order."""

    def __init__(self, envs: dict | None = None):
        envs = dict(envs or {"corridor": {}, "grid": {}, "tool_use": {}})
        unknown = [name for name in envs if name not in ENVIRONMENTS or name == "mixture"]
        if unknown or not envs:
            raise TypeError(f"mixture envs must name built-in environments ({', '.join(ENVIRONMENTS)}), got "
                            f"{unknown or 'none'}")
        self.names = list(envs)
        self.envs = [ENVIRONMENTS[name](**dict(envs[name] or {})) for name in self.names]
        self.current = 0

    def reset(self, *, seed=None, options=None):
        if seed is None:
            seed = random.randrange(2**31)
        self.current, task_seed = seed % len(self.envs), seed // len(self.envs)
        obs, info = self.envs[self.current].reset(seed=task_seed, options=options)
        return obs, self._tag(info)

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.envs[self.current].step(action)
        return obs, reward, terminated, truncated, self._tag(info)

    def _tag(self, info: dict) -> dict:
        info = dict(info)
        if "anchor" in info:
            info["anchor"] = (self.names[self.current], info["anchor"])
        return info

    def expert_action(self) -> str:
        """The current environment's expert move (demonstrations; not part of the protocol)."""
        return self.envs[self.current].expert_action()

    def random_action(self, rng: random.Random) -> str:
        return self.envs[self.current].random_action(rng)
