"""An environment with a misaligned immediate reward, for gated reward accumulation (G-RA, algorithm.credit=gra).

`ProgressCorridor` is the key-and-door corridor (rlx/envs/builtin.py Corridor: fetch the key on the left, then
walk through the door on the right) with a "progress" reward of `right_reward` for every step toward the door
(action R), paid whether or not the door can open. Pressing R from the start farms it (the door is locked
without the key), so an agent trained on the summed rewards can learn to walk right and never fetch the key;
G-RA counts the immediate rewards only in episodes whose outcome (walking through the door: info["metrics"]
["outcome"] = 1) reaches the gate. Observations, actions and the anchor are the corridor's, so the agent warm
start (builtin:tiny_agent) plays it. Use it with env=custom env.target=rlx.envs.gated.ProgressCorridor.
"""

from __future__ import annotations

from rlx.envs.builtin import Corridor


class ProgressCorridor(Corridor):
    """Corridor plus `right_reward` per R action; the step reward is that plus 1 on success (the outcome)."""

    def __init__(self, length: int = 5, max_steps: int = 8, right_reward: float = 0.3):
        super().__init__(length, max_steps)
        self.right_reward = right_reward

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        outcome = reward  # 1.0 on walking through the door with the key
        if action.strip().upper() == "R":
            reward += self.right_reward
        info["metrics"] = {**info.get("metrics", {}), "outcome": outcome}
        return obs, reward, terminated, truncated, info
