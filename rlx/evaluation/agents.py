"""Playing and scoring episodes of a text environment: what the agent loops report and evaluate with.

episode_metrics: success rate, mean return, mean turns, invalid actions, truncated fraction, errors.
play: fresh environments, one episode each, through rollout/env.py (token-in/token-out).
"""

from __future__ import annotations

from rlx.rollout.env import run_episodes
from rlx.rollout.hf import eos_ids
from rlx.rollout.types import Episode


def episode_metrics(episodes: list[Episode], prefix: str) -> dict:
    """<prefix>/success|return|turns|invalid_actions|truncated_frac (means over episodes) and errors (count)."""
    n = max(len(episodes), 1)
    return {
        f"{prefix}/success": sum(e.success for e in episodes) / n,
        f"{prefix}/return": sum(sum(e.step_rewards) for e in episodes) / n,
        f"{prefix}/turns": sum(len(e.step_rewards) for e in episodes) / n,
        f"{prefix}/invalid_actions": sum(e.valid.count(False) for e in episodes) / n,
        f"{prefix}/truncated_frac": sum(e.truncated for e in episodes) / n,
        f"{prefix}/errors": sum(e.error is not None for e in episodes),
    }


def play(generator, tokenizer, factory, env_cfg, env_seeds: list[int], sample_seeds: list[int], *, greedy: bool,
         use_chat_template: bool = True, stop_ids: list[int] | None = None) -> list[Episode]:
    """One episode in a fresh environment (factory()) per seed, limits from the `env` config group."""
    envs = [factory() for _ in env_seeds]
    if stop_ids is None and hasattr(generator, "model"):
        stop_ids = eos_ids(generator.model, tokenizer)
    return run_episodes(generator, tokenizer, envs, env_seeds, sample_seeds, max_turns=env_cfg.max_turns,
                        max_new_tokens=env_cfg.max_new_tokens, max_total_tokens=env_cfg.max_total_tokens, greedy=greedy,
                        system_prompt=env_cfg.system_prompt, use_chat_template=use_chat_template, stop_ids=stop_ids)


def episode_records(episodes: list[Episode], count: int, extra: list[dict] | None = None) -> list[dict]:
    """Readable samples files: what the model saw and did in each episode."""
    return [{"observations": e.observations, "actions": e.actions, "rewards": e.step_rewards, "success": e.success,
             "truncated": e.truncated, "error": e.error, **(extra[i] if extra else {})}
            for i, e in enumerate(episodes[:count])]
