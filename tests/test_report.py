"""rlx report: grouping runs by configuration, hand-computed aggregates, and a real 3-seed multirun."""

import csv
import json

import pytest

from rlx.report.report import write_report
from rlx.report.runs import config_key, find_runs, group_runs
from rlx.report.stats import stratified_bootstrap_ci
from tests.conftest import run_rlx
from tests.test_sweep import FAST, _only_sweep_dir

# Final eval/accuracy of two configurations over seeds 0-3 (hand-made runs).
A = [0.2, 0.4, 0.6, 0.8]
B = [0.1, 0.3, 0.5, 0.9]


def _fake_run(folder, overrides, seed, final):
    folder.mkdir(parents=True)
    (folder / "overrides.yaml").write_text("".join(f"- {o}\n" for o in [*overrides, f"seed={seed}"]))
    rows = [{"step": 0, "eval/accuracy": 0.1, "reward/total": 0.0},
            {"step": 5, "reward/total": 0.5 * final},
            {"step": 10, "eval/accuracy": final, "reward/total": final}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def two_configs(tmp_path):
    sweep = tmp_path / "sweep"
    for seed, (a, b) in enumerate(zip(A, B)):
        _fake_run(sweep / f"a{seed}", ["steps=10", "optim.lr=1e-4"], seed, a)
        _fake_run(sweep / f"b{seed}", ["steps=10", "optim.lr=3e-4"], seed, b)
    failed = sweep / "a_failed"
    failed.mkdir()
    (failed / "overrides.yaml").write_text("- steps=10\n- optim.lr=1e-4\n- seed=9\n")
    (failed / "failure.json").write_text(json.dumps({"status": "failed", "error": "RuntimeError: boom"}))
    return sweep


def test_config_key_drops_seed_and_sweep_selection():
    assert config_key(["seed=3", "optim.lr=1", "sweep=optuna", "hydra.job.num=2", "+x=1"]) == ("+x=1", "optim.lr=1")


def test_runs_group_by_overrides_without_the_seed(two_configs):
    groups = group_runs(find_runs([two_configs]))
    assert [(g.name, g.label, len(g.runs)) for g in groups] == [("c1", "optim.lr=1e-4", 5), ("c2", "optim.lr=3e-4", 4)]
    assert sorted(r.seed for r in groups[1].runs) == [0, 1, 2, 3]


def test_report_matches_hand_computed_aggregates(two_configs, tmp_path):
    out = tmp_path / "report"
    result = write_report([two_configs], out, n_resamples=500)
    by_config = {row["config"]: row for row in result["aggregates"]}
    # IQM of 4 values cuts floor(4/4) = 1 from each end: A -> (0.4 + 0.6) / 2 = 0.5, B -> (0.3 + 0.5) / 2 = 0.4
    assert by_config["c1"]["iqm"] == pytest.approx(0.5) and by_config["c2"]["iqm"] == pytest.approx(0.4)
    # means: A (0.2+0.4+0.6+0.8)/4 = 0.5, B (0.1+0.3+0.5+0.9)/4 = 0.45; the failed run is counted, not used
    assert by_config["c1"]["mean"] == pytest.approx(0.5) and by_config["c2"]["mean"] == pytest.approx(0.45)
    assert by_config["c1"]["runs"] == 4 and by_config["c1"]["failed"] == 1
    _, low, high = stratified_bootstrap_ci(A, "iqm", n_resamples=500, seed=0)
    assert (by_config["c1"]["ci_low"], by_config["c1"]["ci_high"]) == pytest.approx((low, high))
    # P(A > B): 0.2 beats {0.1}, 0.4 beats {0.1, 0.3}, 0.6 and 0.8 beat {0.1, 0.3, 0.5} -> (1+2+3+3)/16
    [comparison] = result["comparisons"]
    assert (comparison["x"], comparison["y"]) == ("c1", "c2")  # the best IQM against the other
    assert comparison["p"] == pytest.approx(9 / 16)
    assert comparison["ci_low"] <= 9 / 16 <= comparison["ci_high"]
    assert (out / "curves.png").stat().st_size > 1000
    with (out / "aggregates.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["config"], r["runs"], r["failed"]) for r in rows] == [("c1", "4", "1"), ("c2", "4", "0")]
    summary = (out / "summary.md").read_text()
    assert "| c1 | eval/accuracy | 4 | 0.500 | 0.500 |" in summary
    assert "| c1 | c2 | eval/accuracy | 0.562 |" in summary
    assert "Overrides shared by every configuration: `steps=10`" in summary


def test_report_cli_compare_and_mistakes(two_configs, tmp_path):
    result = run_rlx(["report", str(two_configs), "--out", str(tmp_path / "r"), "--compare", "c2", "c1",
                      "--resamples", "200"], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    # P(B > A) = 1 - 9/16 (no ties) = 0.4375
    assert "| c2 | c1 | eval/accuracy | 0.438 |" in (tmp_path / "r" / "summary.md").read_text()
    bad = run_rlx(["report", str(two_configs), "--compare", "c1", "c9"], tmp_path, timeout=120)
    assert bad.returncode == 2 and "unknown configuration 'c9' in --compare; valid choices: c1, c2" in bad.stderr
    empty = run_rlx(["report", str(tmp_path / "nothing")], tmp_path, timeout=120)
    assert empty.returncode == 2 and "is not a directory" in empty.stderr


def test_report_on_a_three_seed_multirun(tmp_path):
    result = run_rlx(["train", "-m", *FAST, "seed=0,1,2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _only_sweep_dir(tmp_path)
    report = run_rlx(["report", str(sweep), "--metrics", "eval/accuracy,eval/reward"], tmp_path, timeout=120)
    assert report.returncode == 0, report.stderr[-3000:]
    out = sweep / "report"
    assert (out / "curves.png").stat().st_size > 1000
    with (out / "aggregates.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["metric"], r["runs"]) for r in rows] == [("eval/accuracy", "3"), ("eval/reward", "3")]
    finals = [json.loads((sweep / str(i) / "result.json").read_text())["metrics"]["eval/accuracy"] for i in range(3)]
    # IQM of 3 values cuts floor(3/4) = 0 from each end: the plain mean
    assert float(rows[0]["iqm"]) == pytest.approx(sum(finals) / 3)
    assert "| c1 | eval/accuracy | 3 |" in (out / "summary.md").read_text()


@pytest.mark.parametrize("name, content", [
    ("result.json", "{not json"),
    ("result.json", "[1, 2]"),
    ("failure.json", b"\xff\xfe\x00garbage"),
    ("overrides.yaml", b"\x00\x01garbage"),
])
def test_a_damaged_run_file_is_one_line_naming_it(two_configs, name, content):
    from rlx.errors import UserError

    target = two_configs / "a1" / name
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=rf"{target} is damaged \(.+\); repair or remove it"):
        find_runs([two_configs])


def test_legends_name_runs_and_short_values_and_steps_are_integers(tmp_path, monkeypatch):
    """A run with no overrides of its own is named by its folder (not `shared overrides only`), a
    trial by sweep/trial (not `0`); float values print at 3 significant digits, short ones as written;
    the step axis ticks whole numbers."""
    import matplotlib.figure
    from matplotlib.ticker import MaxNLocator

    from rlx.report.report import plot_curves

    base, tuned = tmp_path / "2026-11-24_10-00-00_grpo", tmp_path / "2026-11-24_11-00-00_grpo"
    _fake_run(base, ["steps=10"], 0, 0.5)
    _fake_run(tuned, ["steps=10", "optim.lr=0.00030000000000000003"], 0, 0.7)
    _fake_run(tmp_path / "sweep" / "0", ["optim.lr=1e-4"], 0, 0.4)
    groups = group_runs(find_runs([base, tuned]))
    assert [g.label for g in groups] == ["2026-11-24_10-00-00_grpo", "optim.lr=0.0003"]
    assert [g.label for g in group_runs(find_runs([tmp_path / "sweep" / "0"]))] == ["sweep/0"]
    assert [g.label for g in group_runs(find_runs([tmp_path / "sweep" / "0", base]))][0] == "optim.lr=1e-4"

    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    plot_curves(groups, ["eval/accuracy"], tmp_path)
    (fig,) = drawn
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["c1: 2026-11-24_10-00-00_grpo (n=1)", "c2: optim.lr=0.0003 (n=1)"]
    locator = fig.axes[0].xaxis.get_major_locator()
    assert isinstance(locator, MaxNLocator) and all(float(t).is_integer() for t in locator.tick_values(0, 2))
    # a one-step curve (steps 1 and 1): a tick at that step only, not 0.96, 0.98, ...
    from rlx.runtime.rundir import integer_step_ticks

    ax = matplotlib.figure.Figure().subplots()
    ax.plot([1, 1], [0.2, 0.4])
    integer_step_ticks(ax, [1, 1])
    assert list(ax.get_xticks()) == [1]
