"""Multiruns end with a summary; a crashing trial is recorded and the sweep goes on; Optuna sweeps and
test-seed re-runs work offline on the tiny model."""

import csv
import json
import math

import pytest
from omegaconf import OmegaConf

from rlx.config import CONF_DIR, group_options
from tests.conftest import run_rlx

FAST = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=8", "eval.every=2",
        "log.samples_every=0", "save.final=false", "save.plot=false", "hardware.num_threads=1"]


def _only_sweep_dir(tmp_path):
    sweeps = sorted((tmp_path / "outputs" / "multirun").iterdir())
    assert len(sweeps) == 1, sweeps
    return sweeps[0]


def _summary_rows(sweep):
    with (sweep / "summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_grid_multirun_writes_four_runs_and_a_sorted_summary(tmp_path):
    result = run_rlx(["train", "-m", *FAST, "seed=0,1", "optim.lr=1e-4,3e-3"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _only_sweep_dir(tmp_path)
    trials = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert trials == ["0", "1", "2", "3"]
    finals = {}
    for trial in trials:
        record = json.loads((sweep / trial / "result.json").read_text())
        assert record["status"] == "ok" and record["optimized_metric"] == "eval/accuracy"
        finals[trial] = record["metrics"]["eval/accuracy"]
        assert (sweep / trial / "metrics.jsonl").is_file()
    rows = _summary_rows(sweep)
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert sorted(r["trial"] for r in rows) == trials
    values = [float(r["eval/accuracy"]) for r in rows]
    assert values == sorted(values, reverse=True)  # best first
    assert values == sorted(finals.values(), reverse=True)
    assert "seed=1 optim.lr=0.003" in " ".join(r["overrides"] for r in rows)
    summary = (sweep / "summary.md").read_text()
    assert "4 trials, 4 finished, 0 failed" in summary and f"Best trial: {rows[0]['trial']}" in summary


def test_one_crashing_trial_is_recorded_and_the_sweep_goes_on(tmp_path):
    # a reward component that raises only when both flags are set: exactly one of the four trials crashes
    probe = ["+reward.components.probe._target_=tests.helpers.crash_when_both", "+reward.components.probe.weight=0.0",
             "+reward.components.probe.first=false,true", "+reward.components.probe.second=false,true"]
    result = run_rlx(["train", "-m", *FAST, *probe], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _only_sweep_dir(tmp_path)
    results = sorted(p.parent.name for p in sweep.glob("*/result.json"))
    failures = sorted(p.parent.name for p in sweep.glob("*/failure.json"))
    assert results == ["0", "1", "2"] and failures == ["3"]
    failure = json.loads((sweep / "3" / "failure.json").read_text())
    assert failure["status"] == "failed"
    assert "forced crash for the sweep failure test" in failure["error"]
    assert "+reward.components.probe.first=True" in failure["overrides"]  # as Hydra renders it
    rows = _summary_rows(sweep)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "failed"]  # failures sort last
    assert rows[-1]["trial"] == "3" and "forced crash" in rows[-1]["error"]
    assert "4 trials, 3 finished, 1 failed" in (sweep / "summary.md").read_text()


def test_optuna_sweep_names_its_best_trial_and_retest_uses_fresh_seeds(tmp_path):
    result = run_rlx(["sweep", "optuna", *FAST, "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.n_startup_trials=2"],
                     tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _only_sweep_dir(tmp_path)
    finals = {p.parent.name: json.loads(p.read_text())["metrics"]["eval/accuracy"] for p in sweep.glob("*/result.json")}
    assert sorted(finals) == ["0", "1", "2"]
    optuna = OmegaConf.load(sweep / "optimization_results.yaml")
    assert math.isclose(optuna.best_value, max(finals.values()))
    rows = _summary_rows(sweep)
    assert float(rows[0]["eval/accuracy"]) == max(finals.values())
    assert f"Best trial: {rows[0]['trial']} (eval/accuracy = {max(finals.values()):.4f}" in (sweep / "summary.md").read_text()
    # the trials sampled the search space of conf/sweep/optuna.yaml
    assert all("optim.lr=" in r["overrides"] and "algorithm.clip_high=" in r["overrides"] for r in rows)

    reused = run_rlx(["sweep", "retest", str(sweep), "seeds=0,7"], tmp_path, timeout=120)
    assert reused.returncode == 2 and "test seeds [0] were already used for tuning" in reused.stderr

    retest = run_rlx(["sweep", "retest", str(sweep), "seeds=1000"], tmp_path)
    assert retest.returncode == 0, retest.stderr[-3000:]
    rerun = sweep / "test_seeds"
    config = OmegaConf.load(rerun / "0" / "config.yaml")
    assert config.seed == 1000
    best_lr = [o for o in rows[0]["overrides"].split() if o.startswith("optim.lr=")][0]
    assert math.isclose(config.optim.lr, float(best_lr.split("=")[1]))
    assert not (rerun / "optimization_results.yaml").exists()  # a plain re-run, not a new search
    assert (rerun / "report" / "summary.md").is_file() and (rerun / "summary.csv").is_file()


def test_unknown_sweep_is_one_line(tmp_path):
    result = run_rlx(["sweep", "optuan"], tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: unknown sweep 'optuan' (did you mean 'optuna'?); valid choices: grid, optuna"


@pytest.mark.parametrize("name", group_options("sweep"))
def test_every_sweep_composes_with_its_sweeper(name):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"sweep={name}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    assert cfg.hydra.sweeper.params, "a sweep names the parameters it searches"
    assert cfg.hydra.callbacks.sweep_summary._target_ == "rlx.sweep.SweepSummary"
    if name == "optuna":
        assert "OptunaSweeper" in cfg.hydra.sweeper._target_ and cfg.hydra.sweeper.direction == "maximize"
