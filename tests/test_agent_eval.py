"""Held-out environment evaluation: per-task metrics (rlx/evaluation/agents.py) and `rlx eval env=`
through the real CLI (rlx/evaluation/runner.py): intervals, compare=, run=, resume, the alias."""

import json

import pytest

from rlx.config.paths import CONF_DIR
from rlx.evaluation.agents import per_task_values
from tests.conftest import REPO, run_rlx


def _episode(success, ret, turns):
    return {"success": success, "return": ret, "turns": turns}


def test_per_task_values_hand_numbers():
    # task 0: one success in two episodes; task 1: none.  success per task (0.5, 0); pass@1 = (1/2, 0);
    # pass@2 = (1, 0); turns ((2 + 4) / 2, 6) = (3, 6); greedy episode of each task as written
    records = [{"greedy": _episode(1.0, 1.0, 2), "episodes": [_episode(1.0, 1.0, 2), _episode(0.0, 0.0, 4)]},
               {"greedy": _episode(0.0, -1.0, 6), "episodes": [_episode(0.0, 0.0, 6), _episode(0.0, 0.0, 6)]}]
    values = per_task_values(records, ks=[1, 2, 4])
    assert values["success"].tolist() == [0.5, 0.0]
    assert values["pass@1"].tolist() == [0.5, 0.0] and values["pass@2"].tolist() == [1.0, 0.0]
    assert "pass@4" not in values  # k above the episodes per task is skipped
    assert values["turns"].tolist() == [3.0, 6.0]
    assert values["greedy/return"].tolist() == [1.0, -1.0] and values["greedy/turns"].tolist() == [2.0, 6.0]


def _summary(tmp_path):
    (run,) = (tmp_path / "outputs" / "eval").iterdir()
    return run, json.loads((run / "summary.json").read_text())


@pytest.mark.long
def test_rlx_eval_env_custom_with_run_dir_and_compare(tmp_path):
    """env=custom through the CLI on a run directory (the environment read from the run's config.yaml),
    compared with the same weights: the seed decides
    the outcome (tasks 0..3, even seeds win), so every number is known by hand and every paired
    difference is exactly 0."""
    from omegaconf import OmegaConf

    from rlx.models.loading import load_causal_lm, load_tokenizer

    final = tmp_path / "run" / "final"
    load_causal_lm("builtin:tiny_agent", "float32").save_pretrained(final)
    load_tokenizer("builtin:tiny_agent").save_pretrained(final)
    env = OmegaConf.load(CONF_DIR / "env" / "custom.yaml")
    env.target = "tests.helpers.SeedParity"
    OmegaConf.save({"env": env}, tmp_path / "run" / "config.yaml")  # the run's environment: no env= needed
    result = run_rlx(["eval", f"run={tmp_path / 'run'}", "compare=builtin:tiny_agent", "limit=4", "sampling.n=3",
                      "metrics.ks=[1,2]", "plot=false", "hardware.num_threads=1"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run, summary = _summary(tmp_path)
    env = summary["benchmarks"]["env_SeedParity"]
    for role in ("model", "compare"):
        got = {name: entry["value"] for name, entry in env[role].items()}
        assert got == pytest.approx({"greedy/success": 0.5, "greedy/return": 0.5, "greedy/turns": 1.0, "success": 0.5,
                                     "return": 0.5, "turns": 1.0, "pass@1": 0.5, "pass@2": 0.5})
        assert env[role]["success"]["low"] <= 0.5 <= env[role]["success"]["high"]
    assert env["diff"]["problems"] == 4 and all(env["diff"][m]["value"] == 0 for m in env["model"])
    lines = (run / "env_SeedParity" / "model.jsonl").read_text().splitlines()
    assert [json.loads(line)["greedy"]["success"] for line in lines] == [1.0, 0.0, 1.0, 0.0]
    assert summary["models"]["model"]["path"] == str(final)


@pytest.mark.long
def test_agents_alias_then_resume_plays_the_same_episodes(tmp_path):
    """python -m rlx.evaluation.agents runs `rlx eval env=`; an interrupted evaluation (last task and a
    half-written line lost) resumed with `rlx eval resume=` gives the records of the uninterrupted one."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, RLX_OUTPUTS=str(tmp_path / "outputs"), PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "rlx.evaluation.agents", "--model", "builtin:tiny_agent", "--env",
                             "grid", "--tasks", "3", "--samples", "2", "hardware.num_threads=1", "plot=false",
                             "--ks", "1", "2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run, summary = _summary(tmp_path)
    assert set(summary["benchmarks"]["env_grid"]["model"]) == {"success", "return", "turns", "pass@1", "pass@2"}
    results = run / "env_grid" / "model.jsonl"
    full = results.read_text().splitlines()
    assert len(full) == 3 and all(len(json.loads(line)["episodes"]) == 2 for line in full)
    results.write_text("\n".join(full[:2]) + "\n" + full[2][:40])  # interrupted while writing task 2
    result = run_rlx(["eval", f"resume={run}"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert results.read_text().splitlines() == full
    assert _summary(tmp_path)[1] == summary


def test_rlx_eval_env_refuses_benchmark_and_bad_env(tmp_path):
    result = run_rlx(["eval", "env=grid", "benchmark=chain_sum"], tmp_path)
    assert result.returncode == 2 and "separate run" in result.stderr
    result = run_rlx(["eval", "env=custom", "env.target=nowhere.Env"], tmp_path)
    assert result.returncode == 2 and "No module named 'nowhere" in result.stderr
