"""`rlx report` over evaluation directories: the suite's paired differences aggregated over the seeds of a training
configuration (the evaluations of one configuration's runs group together through the runs' own overrides)."""

import json

import pytest

from rlx.report.report import write_report
from rlx.report.runs import eval_finals


def _summary(diffs: dict[str, float], values: dict[str, float]) -> dict:
    benchmarks = {}
    for bench, diff in diffs.items():
        entry = {"value": values[bench], "low": 0.0, "high": 1.0}
        benchmarks[bench] = {"kind": "loglikelihood", "headline": "acc", "problems": {"model": 10, "compare": 10},
                             "model": {"acc": entry, "acc_norm": entry}, "compare": {"acc": entry},
                             "diff": {"problems": 10, "acc": {"value": diff, "low": diff - 0.1, "high": diff + 0.1,
                                                              "frac_positive": 0.5}}}
    mean = sum(values.values()) / len(values)
    diff = sum(diffs.values()) / len(diffs)
    return {"models": {}, "benchmarks": benchmarks,
            "suite": {"name": "general", "benchmarks": [f"{b}:acc" for b in diffs],
                      "model": {"value": mean, "low": 0.0, "high": 1.0},
                      "diff": {"value": diff, "low": diff - 0.1, "high": diff + 0.1, "frac_positive": 0.5}}}


def _run(root, name, overrides, seed):
    run = root / "train" / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/accuracy": 0.5}) + "\n")
    (run / "overrides.yaml").write_text("".join(f"- {o}\n" for o in [*overrides, f"seed={seed}"]))
    (run / "config.yaml").write_text(f"seed: {seed}\n")
    return run


def _eval(root, name, run, summary):
    out = root / "eval" / name
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(f"run: {run}\ncompare: base\nsampling:\n  n: 0\nmetrics:\n  ks: [1]\n")
    (out / "overrides.yaml").write_text(f"- run={run}\n- compare=base\n- suite=general\n")
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def test_eval_finals_by_hand():
    final = eval_finals(_summary({"arc_easy": -0.02, "piqa": 0.04}, {"arc_easy": 0.5, "piqa": 0.7}))
    assert final["arc_easy/acc"] == 0.5 and final["piqa/acc/diff"] == 0.04
    assert final["suite/headline"] == pytest.approx(0.6) and final["suite/headline/diff"] == pytest.approx(0.01)


def test_report_groups_the_evaluations_of_one_configurations_seeds(tmp_path):
    diffs = {("grpo", 0): -0.02, ("grpo", 1): -0.04, ("grpo", 2): 0.00, ("sft", 0): -0.10, ("sft", 1): -0.12}
    for (method, seed), diff in diffs.items():
        run = _run(tmp_path, f"{method}_{seed}", [f"algorithm={method}"], seed)
        _eval(tmp_path, f"{method}_{seed}", run, _summary({"arc_easy": diff, "piqa": diff * 2},
                                                          {"arc_easy": 0.5, "piqa": 0.6}))
    result = write_report([tmp_path / "eval"], tmp_path / "report")
    groups = {g.label: g for g in result["groups"]}
    assert sorted(len(g.runs) for g in groups.values()) == [2, 3]  # seeds of one training configuration together
    rows = {(row["config"], row["metric"]): row for row in result["aggregates"]}
    metrics = {row["metric"] for row in result["aggregates"]}
    assert {"suite/headline/diff", "arc_easy/acc/diff", "piqa/acc/diff"} <= metrics
    grpo = next(g.name for g in result["groups"] if len(g.runs) == 3)
    # suite/headline/diff of a run = mean of its benchmarks' differences = 1.5 x its arc_easy difference
    assert sorted(rows[(grpo, "suite/headline/diff")]["values"]) == pytest.approx([-0.06, -0.03, 0.0])
    assert "suite/headline/diff" in result["summary"].read_text()
