"""Demonstrations with partial skill, for the warm start of an agent (loops/agent_sft.py).

`ExpertGenerator` stands in for the model in rollout/env.py: for each live episode it answers with the
environment's `expert_action()` with probability `skill`, else with its `random_action(rng)` (both
optional methods of the built-in environments, not part of the protocol), encoded as tokens and
closed with the stop token. The episodes then carry exactly the token layout RL will produce.
"""

from __future__ import annotations

import random

from rlx.engines.records import Generation
from rlx.errors import UserError
from rlx.rollout.env import TURN_STRIDE


class ExpertGenerator:
    """Generator protocol over environments that know an expert move. envs[i] (a list, or a dict keyed by
    global demonstration index) is the environment of the episode whose sample seed is i (pass the
    indices as sample_seeds to run_episodes): a demonstration's moves depend on (seed, i), not on which
    other demonstrations share its batch or process."""

    version = 0  # the expert never changes (no weights published)

    def __init__(self, envs: list | dict, tokenizer, skill: float, seed: int):
        for env in (envs.values() if isinstance(envs, dict) else envs):
            if not (hasattr(env, "expert_action") and hasattr(env, "random_action")):
                raise UserError(f"algorithm=agent_sft imitates an expert, but {type(env).__name__} has no "
                                "expert_action() and random_action() methods; add them to it, or use a built-in "
                                "environment (all have them)")
        self.envs, self.tokenizer, self.skill, self.seed = envs, tokenizer, skill, seed

    def generate_ids(self, prompts, *, max_new_tokens, seeds, greedy=False) -> Generation:
        ids = []
        for turn_seed in seeds:
            episode, turn = divmod(turn_seed, TURN_STRIDE)
            rng = random.Random(self.seed * 7919 + turn_seed)
            env = self.envs[episode]
            action = env.expert_action() if rng.random() < self.skill else env.random_action(rng)
            ids.append(self.tokenizer(action, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id])
        return Generation(ids, [[0.0] * len(row) for row in ids], [True] * len(ids))
