"""Playing and scoring episodes of a text environment: what the agent loops report and evaluate with.

episode_metrics: success rate, mean return, mean turns, invalid actions, truncated fraction, errors.
play: fresh environments, one episode each, through rollout/env.py (token-in/token-out).
play_tasks / per_task_values: held-out tasks for `rlx eval env=NAME` (rlx/evaluation/runner.py), which
adds the bootstrap intervals, the paired comparison and resume. `python -m rlx.evaluation.agents` is an alias of
it (__main__.py here; its arguments are read by rlx/cli/agents.py).
"""

from __future__ import annotations

import numpy as np
from accelerate.utils import gather_object

from rlx.engines.records import Episode
from rlx.envs.registry import plays_through_gateway
from rlx.evaluation.metrics import pass_at_k
from rlx.rollout.env import EVAL_SEED_BASE, TurnDecoding, play
from rlx.rollout.episodes import episode_metrics


def player_for(env):
    """The `play` of an env (rlx.rollout.env.play's signature) and its extra metrics: env=harness plays the user's
    program through the gateway (rlx/gateway/harness.py) and reports its forks, timeouts and cut episodes."""
    if plays_through_gateway(getattr(env, "name", None)):
        from rlx.gateway.episodes import harness_metrics
        from rlx.gateway.harness import harness_player

        return harness_player(env), harness_metrics
    return play, None


def episode_evaluator(acc, generator, tokenizer, factory, limits, *, use_chat_template: bool, play_fn=play,
                      extra_metrics=None):
    """run_eval(step) -> eval/* metrics: `limits.eval_episodes` held-out episodes (environment seeds from
    EVAL_SEED_BASE), greedy when `limits.eval_greedy`, split over processes and gathered; played by `generator`
    (the policy itself, or the engine holding the weights published after the last update). acc None: this process
    plays every episode, no collective (rank 0 when it alone samples, rlx/rollout/rank_zero.py)."""
    eval_seeds = [EVAL_SEED_BASE + k for k in range(limits.eval_episodes)]

    def run_eval(step: int) -> dict:
        mine = (list(range(acc.process_index, len(eval_seeds), acc.num_processes)) if acc is not None
                else list(range(len(eval_seeds))))  # this process's episodes
        episodes = play_fn(generator, tokenizer, factory, limits, [eval_seeds[k] for k in mine], mine,
                           TurnDecoding(greedy=limits.eval_greedy, use_chat_template=use_chat_template))
        episodes = gather_object(episodes) if acc is not None else episodes
        return {**episode_metrics(episodes, "eval"), **(extra_metrics(episodes, "eval") if extra_metrics else {})}

    return run_eval


def episode_summary(e: Episode) -> dict:
    """One line of an evaluation file: what happened in the episode and its three numbers."""
    return {"observations": e.observations, "actions": e.actions, "rewards": e.step_rewards, "success": e.success,
            "return": float(sum(e.step_rewards)), "turns": len(e.step_rewards), "truncated": e.truncated,
            "error": e.error}


def play_tasks(generator, tokenizer, factory, env_cfg, tasks: list[int], run, stop_ids: list[int] | None = None
               ) -> list[dict]:
    """One record per held-out task t (environment seed EVAL_SEED_BASE + t): its greedy episode (when
    `run.sampling.greedy`) and `run.sampling.n` sampled episodes; run: the pass's EvalPass (rlx/evaluation/runner.py:
    its sampling, seed and chat_template). Sampled episode j of task t samples with sample_seed(run.seed, t, j),
    so a task's episodes do not depend on which tasks share its batch (resume gives the same records)."""
    play_fn, _ = player_for(env_cfg)
    from rlx.engines.sampling import sample_seed

    n, seed = int(run.sampling.n), run.seed
    records = [{"id": f"task_{t:06d}", "env_seed": EVAL_SEED_BASE + t, "greedy": None, "episodes": []} for t in tasks]
    if bool(run.sampling.greedy):
        seeds = [EVAL_SEED_BASE + t for t in tasks]
        greedy = TurnDecoding(greedy=True, use_chat_template=run.chat_template, stop_ids=stop_ids)
        for record, episode in zip(records,
                                   play_fn(generator, tokenizer, factory, env_cfg, seeds, list(tasks), greedy)):
            record["greedy"] = episode_summary(episode)
    if n:
        seeds = [EVAL_SEED_BASE + t for t in tasks for _ in range(n)]
        sample_seeds = [sample_seed(seed, t, j) for t in tasks for j in range(n)]
        episodes = play_fn(generator, tokenizer, factory, env_cfg, seeds, sample_seeds,
                           TurnDecoding(greedy=False, use_chat_template=run.chat_template, stop_ids=stop_ids))
        for i, record in enumerate(records):
            record["episodes"] = [episode_summary(e) for e in episodes[i * n:(i + 1) * n]]
    return records


def per_task_values(records: list[dict], ks: list[int], threshold: float = 0.5) -> dict[str, np.ndarray]:
    """One value per task for every metric, over T tasks with n sampled episodes each:
    greedy/success|return|turns (the greedy episode), success|return|turns (mean over the n episodes),
    pass@k (Chen et al. 2021's unbiased estimator: 1 - C(n-c, k)/C(n, k) with c the episodes whose
    success >= threshold; a task passes when one of k episodes succeeds). k > n is left out."""
    values: dict[str, list[float]] = {}
    if records and records[0].get("greedy") is not None:
        for name in ("success", "return", "turns"):
            values[f"greedy/{name}"] = [float(r["greedy"][name]) for r in records]
    n = min(len(r["episodes"]) for r in records) if records else 0
    if n:
        for name in ("success", "return", "turns"):
            values[name] = [float(np.mean([e[name] for e in r["episodes"]])) for r in records]
        for k in [k for k in ks if 1 <= k <= n]:
            values[f"pass@{k}"] = [pass_at_k(len(r["episodes"]), sum(e["success"] >= threshold for e in r["episodes"]),
                                             k)
                                   for r in records]
    return {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}  # each (T,)
