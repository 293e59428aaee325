"""Multiruns end with a summary; a crashing trial is recorded and the sweep goes on; Optuna sweeps and
test-seed re-runs work offline on the tiny model."""

import csv
import json
import math
import re

import pytest
from omegaconf import OmegaConf

from rlx.config.paths import CONF_DIR, group_options
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
    # configurations (optim.lr) ranked by their mean over the two seeds, the trials of one kept together
    lrs = [[o for o in r["overrides"].split() if o.startswith("optim.lr=")][0] for r in rows]
    assert lrs[0] == lrs[1] and lrs[2] == lrs[3] and lrs[0] != lrs[2]
    values = [float(r["eval/accuracy"]) for r in rows]
    assert (values[0] + values[1]) / 2 >= (values[2] + values[3]) / 2
    assert sorted(values) == sorted(finals.values())
    assert "seed=1 optim.lr=0.003" in " ".join(r["overrides"] for r in rows)
    summary = (sweep / "summary.md").read_text()
    assert "4 trials, 4 finished, 0 failed" in summary and f"Best trial: {rows[0]['trial']}" in summary
    assert "its configuration over seeds:" in summary


def test_one_crashing_trial_is_recorded_and_the_sweep_goes_on(tmp_path):
    # a reward component that raises only when both flags are set: exactly one of the four trials crashes
    probe = ["+reward.components.probe._target_=tests.helpers.crash_when_both", "+reward.components.probe.weight=0.0",
             "+reward.components.probe.first=false,true", "+reward.components.probe.second=false,true"]
    result = run_rlx(["train", "-m", *FAST, *probe], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]  # the others finished; the exit code says one failed
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 4 trials failed: 3 (") and "probe.first=True" in last, last
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
    assert (f"Best trial: {rows[0]['trial']} (eval/accuracy = "
            f"{max(finals.values()):.4f}") in (sweep / "summary.md").read_text()
    # the trials sampled the search space of conf/sweep/optuna.yaml
    assert all("optim.lr=" in r["overrides"] and "algorithm.clip_high=" in r["overrides"] for r in rows)
    # the log prints the sampled values at 3 significant digits (Hydra's "#N : ..." lines and the optuna
    # line included) and no Optuna plugin lines; the trials themselves got the exact values
    printed = result.stdout + result.stderr
    assert "#0 : " in printed and "best max value" in printed and "A new study created" not in printed
    assert "\x1b[" not in printed  # no ANSI codes outside a terminal (the summary table included)
    assert not re.search(r"=-?\d*\.\d{7,}", printed), re.findall(r"\S+=-?\d*\.\d{7,}", printed)
    assert any(len(o.split("=")[1]) > 8 for r in rows for o in r["overrides"].split() if o.startswith("optim.lr="))

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
    assert result.stderr.strip() == ("error: unknown sweep 'optuan' (did you mean 'optuna'?); valid choices: grid, "
                                     "optuna, seed_ablation, smollm2_mc_grpo, smollm2_seed_ablation")


@pytest.mark.parametrize("name", group_options("sweep"))
def test_every_sweep_composes_with_its_sweeper(name):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"sweep={name}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    assert cfg.hydra.sweeper.params, "a sweep names the parameters it searches"
    assert cfg.hydra.callbacks.sweep_summary._target_ == "rlx.report.sweeps.SweepSummary"
    if name == "optuna":
        assert "OptunaSweeper" in cfg.hydra.sweeper._target_ and cfg.hydra.sweeper.direction == "maximize"


def test_cross_algorithm_multirun_is_one_sweep_and_seeds_only_is_not_ranked(tmp_path):
    one = ["steps=1", "eval.every=1", *[a for a in FAST if not a.startswith(("steps=", "eval.every="))]]
    result = run_rlx(["train", "-m", *one, "seed=0,1", "algorithm=grpo,dapo"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _only_sweep_dir(tmp_path)
    assert sweep.name.endswith("_multirun")  # not named after the first algorithm
    rows = _summary_rows(sweep)
    assert len(rows) == 4 and "4 trials, 4 finished" in (sweep / "summary.md").read_text()
    assert {o for r in rows for o in r["overrides"].split() if o.startswith("algorithm=")} == {"algorithm=grpo",
                                                                                               "algorithm=dapo"}
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    result = run_rlx(["train", "-m", *one, "seed=0,1"], seeds)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _only_sweep_dir(seeds)
    summary = (sweep / "summary.md").read_text()
    assert "Seeds only (one configuration, not ranked)" in summary and "Best trial" not in summary
    assert [r["trial"] for r in _summary_rows(sweep)] == ["0", "1"]  # trial order, not a ranking


def test_a_combination_that_does_not_compose_stops_the_sweep_before_it_starts(tmp_path):
    result = run_rlx(["train", "-m", "algorithm=grpo,dpo", "algorithm.clip_high=0.3", "seed=0,1"], tmp_path,
                     timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: sweep combination 3 of 4 (algorithm=dpo seed=0) does not compose: "
                                     "algorithm.clip_high is a policy_gradient / ppo / agent knob; use "
                                     "algorithm=grpo, ppo or agent_grpo (or leave algorithm.clip_high out); nothing "
                                     "was run")
    assert not (tmp_path / "outputs").exists()


def test_a_combination_with_a_value_out_of_range_stops_the_sweep_before_it_starts():
    # it composes, and used to fail only when its turn came (a failed trial, after the others had run)
    from rlx.cli.sweep import check_every_trial
    from rlx.errors import UserError

    with pytest.raises(UserError) as info:
        check_every_trial(["seed=0,1", "optim.lr=0.1,-1"])
    assert str(info.value) == ("sweep combination 2 of 4 (seed=0 optim.lr=-1) is refused: optim.lr=-1 is not valid: it "
                               "must be a number > 0; nothing was run")
    assert check_every_trial(["seed=0,1", "optim.lr=0.1,0.2"]) == 4


@pytest.mark.parametrize("content", [b"\x00garbage,,\n1,2\n", b"a,b\n1,2\n", b"\xff\xfe,status\n"])
def test_retest_of_a_damaged_summary_is_one_line(tmp_path, content):
    from rlx.cli.sweep import best_overrides
    from rlx.errors import UserError

    (tmp_path / "summary.csv").write_bytes(content)
    with pytest.raises(UserError, match="summary.csv is damaged or was not written by rlx sweep"):
        best_overrides(tmp_path)


def test_hyper_parameters_print_at_three_significant_digits():
    from rlx.report.runs import short_override

    assert short_override("optim.lr=0.00012345678901") == "optim.lr=0.000123"
    assert short_override("algorithm.clip_high=0.2799999999") == "algorithm.clip_high=0.28"
    assert short_override("seed=3") == "seed=3" and short_override("algorithm=dapo") == "algorithm=dapo"


def test_hydra_launcher_lines_print_short_numbers():
    import logging

    from rlx.report.sweeps import ShortNumbers

    record = logging.LogRecord("hydra", logging.INFO, "", 0, "\t#%d : %s",
                               (1, "seed=0 optim.lr=0.00030000000000000003"), None)
    assert ShortNumbers().filter(record) and record.getMessage() == "\t#1 : seed=0 optim.lr=0.0003"
    written = logging.LogRecord("hydra", logging.INFO, "", 0, "#0 : optim.lr=1e-4 data.train_path=a.jsonl", None, None)
    assert ShortNumbers().filter(written) and written.getMessage() == "#0 : optim.lr=1e-4 data.train_path=a.jsonl"
    plain = logging.LogRecord("hydra", logging.INFO, "", 0, "Launching %d jobs locally", (4,), None)
    assert ShortNumbers().filter(plain) and plain.getMessage() == "Launching 4 jobs locally"
