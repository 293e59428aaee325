"""Playing and scoring episodes of a text environment: what the agent loops report and evaluate with.

episode_metrics: success rate, mean return, mean turns, invalid actions, truncated fraction, errors.
play: fresh environments, one episode each, through rollout/env.py (token-in/token-out).
evaluate_env / summarize_env_eval / main: held-out success, return, turns and pass@k over episodes with
bootstrap intervals and a paired comparison (`python -m rlx.evaluation.agents --help`).
"""

from __future__ import annotations

import numpy as np

from rlx.evaluation.metrics import bootstrap_ci, paired_bootstrap_diff, pass_at_k_per_problem
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


def summarize_env_eval(success: np.ndarray, returns: np.ndarray, turns: np.ndarray, ks: list[int],
                       n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict:
    """Metrics over T held-out tasks x n sampled episodes each, with bootstrap intervals over tasks.

    success, returns, turns: (T, n). success/return/turns: means over all episodes; pass@k: the
    unbiased estimator of Chen et al. 2021 over the n episodes of each task (a task passes when one
    of k episodes succeeds), averaged over tasks. Each value is (point, low, high) from a percentile
    bootstrap over tasks (evaluation/metrics.py)."""
    per_task = {"success": success.mean(axis=1), "return": returns.mean(axis=1), "turns": turns.mean(axis=1)}
    n = success.shape[1]
    correct = (success > 0.5).sum(axis=1)
    for k in ks:
        if k <= n:
            per_task[f"pass@{k}"] = pass_at_k_per_problem(n, correct, k)
    return {name: tuple(bootstrap_ci(values, n_resamples, confidence, seed)) for name, values in per_task.items()}, per_task


def evaluate_env(model, tokenizer, env_cfg, factory, *, tasks: int, samples: int, temperature: float = 1.0,
                 seed: int = 0, use_chat_template: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Play `samples` sampled episodes (greedy when samples == 0: one) on each of `tasks` held-out
    seeds. Returns success, return, turns arrays (tasks, max(samples, 1))."""
    from rlx.rollout.env import EVAL_SEED_BASE
    from rlx.rollout.generator import HFGenerator
    from rlx.rollout.sampling import sample_seed

    n = max(samples, 1)
    env_seeds = [EVAL_SEED_BASE + t for t in range(tasks) for _ in range(n)]
    sample_seeds = [sample_seed(seed, 0, i) for i in range(len(env_seeds))]
    generator = HFGenerator(model, tokenizer, temperature=temperature)
    episodes = play(generator, tokenizer, factory, env_cfg, env_seeds, sample_seeds, greedy=samples == 0,
                    use_chat_template=use_chat_template)
    shape = (tasks, n)
    success = np.array([e.success for e in episodes]).reshape(shape)
    returns = np.array([sum(e.step_rewards) for e in episodes]).reshape(shape)
    turns = np.array([len(e.step_rewards) for e in episodes], dtype=np.float64).reshape(shape)
    return success, returns, turns


def main(argv: list[str] | None = None) -> int:
    """python -m rlx.evaluation.agents --model PATH --env grid [--compare PATH]: success, return, turns
    and pass@k over held-out environment seeds, with bootstrap intervals and a paired comparison."""
    import argparse

    from omegaconf import OmegaConf

    from rlx.config import CONF_DIR
    from rlx.envs import env_factory
    from rlx.models.loading import load_causal_lm, load_tokenizer

    parser = argparse.ArgumentParser(prog="python -m rlx.evaluation.agents", description=main.__doc__)
    parser.add_argument("--model", required=True, help="builtin:NAME, a save_pretrained folder or a run's final/")
    parser.add_argument("--compare", default=None, help="a second model, compared on the same tasks and seeds")
    parser.add_argument("--env", default="grid", help="an env config name (conf/env/NAME.yaml)")
    parser.add_argument("--tasks", type=int, default=100, help="held-out tasks (environment seeds)")
    parser.add_argument("--samples", type=int, default=8, help="sampled episodes per task (0: one greedy episode)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ks", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    env_cfg = OmegaConf.load(CONF_DIR / "env" / f"{args.env}.yaml")
    factory = env_factory(env_cfg.name, env_cfg.get("target"), env_cfg.get("kwargs"))
    results = {}
    for role, path in (("model", args.model), ("compare", args.compare)):
        if path is None:
            continue
        tokenizer, model = load_tokenizer(path), load_causal_lm(path, "float32")
        arrays = evaluate_env(model, tokenizer, env_cfg, factory, tasks=args.tasks, samples=args.samples,
                              temperature=args.temperature, seed=args.seed)
        results[role] = summarize_env_eval(*arrays, ks=args.ks, seed=args.seed)
        print(f"{role} ({path}):")
        for name, (point, low, high) in results[role][0].items():
            print(f"  {name:10s} {point:.3f}  [{low:.3f}, {high:.3f}]")
    if "compare" in results:
        print("model - compare (paired bootstrap over tasks):")
        for name in results["model"][1]:
            diff = paired_bootstrap_diff(results["model"][1][name], results["compare"][1][name], seed=args.seed)
            print(f"  {name:10s} {diff.diff:+.3f}  [{diff.low:+.3f}, {diff.high:+.3f}]  P(>0)={diff.frac_positive:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
