"""What post-training cost elsewhere: the in-task gain and the general-suite change of trained runs, paired to the
base model, per arm over seeds (issue 49 item 5).

    python benchmarks/forgetting.py --base outputs/eval/<an eval with compare=base> \
        --arm grpo=outputs/eval/<eval of seed 0>,outputs/eval/<eval of seed 1> --arm sft=... \
        --out benchmarks/results/forgetting.json

Each --arm names `rlx eval run=<run> suite=general subset=N` directories, one per seed (same subset, same questions).
The base model's records come from --base's compare= records (an evaluation made with compare=base on the same
suite and subset), so the base is scored once. Per seed: each benchmark's paired difference (rlx's summarize, the
same bootstrap as `rlx eval compare=`) and the suite's macro mean difference (metrics.macro_mean_ci); the training
run's own held-out accuracy at its first and last evaluation (metrics.jsonl). Per arm over seeds: the IQM of the
suite difference and of the in-task gain with their stratified bootstrap intervals, and P(arm A's suite change >
arm B's) (rlx/report/stats.py, Agarwal et al. 2021).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from rlx.evaluation.choices import per_question_values  # noqa: E402
from rlx.evaluation.metrics import macro_mean_ci  # noqa: E402
from rlx.evaluation.records import read_records  # noqa: E402
from rlx.evaluation.summary import summarize  # noqa: E402
from rlx.report.stats import iqm, probability_of_improvement_ci, stratified_bootstrap_ci  # noqa: E402
from rlx.runtime.rundir import read_metrics  # noqa: E402

METRICS = SimpleNamespace(ks=[1], correct_threshold=1.0, bootstrap_resamples=2000, confidence=0.95, bootstrap_seed=0)


def in_task(run_dir: Path) -> dict:
    """The run's held-out accuracy at its first and last evaluation (eval/accuracy in metrics.jsonl)."""
    points = [(row["step"], row["eval/accuracy"]) for row in read_metrics(run_dir / "metrics.jsonl")
              if isinstance(row.get("eval/accuracy"), (int, float))]
    return {"start": points[0][1], "end": points[-1][1], "gain": points[-1][1] - points[0][1]} if points else {}


def gold_per_byte(record: dict) -> float:
    """The right choice's log-likelihood per byte of its text: how much the model believes the right answer, which
    moves before an accuracy does."""
    return record["loglikelihoods"][record["gold"]] / max(1, record["bytes"][record["gold"]])


def seed_result(eval_dir: Path, base_dir: Path) -> dict:
    """One trained model against the base on every benchmark of the suite, paired by question."""
    summary = json.loads((eval_dir / "summary.json").read_text())
    per_benchmark, pairs, gold = {}, [], []
    for bench, result in summary["benchmarks"].items():
        headline = result.get("headline", "acc")
        model = read_records(eval_dir / bench / "model.jsonl")
        base = read_records(base_dir / bench / "compare.jsonl")
        if {r["id"] for r in model} != {r["id"] for r in base}:
            raise SystemExit(f"{eval_dir}/{bench} and {base_dir}/{bench} scored different questions")
        values = summarize({"model": model, "compare": base}, METRICS, per_question_values)
        per_benchmark[bench] = {"metric": headline, "model": values["model"][headline]["value"],
                                "base": values["compare"][headline]["value"], **values["diff"][headline]}
        index = {r["id"]: r for r in base}
        pairs.append(([r[headline] for r in model], [index[r["id"]][headline] for r in model]))
        gold.append((np.array([gold_per_byte(r) for r in model]),
                     np.array([gold_per_byte(index[r["id"]]) for r in model])))
    value, diff = macro_mean_ci([(np.asarray(a, float), np.asarray(b, float)) for a, b in pairs],
                                METRICS.bootstrap_resamples, METRICS.confidence, METRICS.bootstrap_seed)
    _, belief = macro_mean_ci(gold, METRICS.bootstrap_resamples, METRICS.confidence, METRICS.bootstrap_seed)
    config = (eval_dir / "config.yaml").read_text()
    run = next((line.split(":", 1)[1].strip() for line in config.splitlines() if line.startswith("run:")), None)
    return {"eval": str(eval_dir), "run": run, "in_task": in_task(Path(run)) if run else {},
            "suite": {"model": value.point, "diff": diff.diff, "low": diff.low, "high": diff.high,
                      "frac_positive": diff.frac_positive},
            "gold_logprob_per_byte": {"diff": belief.diff, "low": belief.low, "high": belief.high},
            "benchmarks": per_benchmark}


def task_accuracy(evals: Path, name: str) -> float | None:
    """Greedy held-out accuracy of the evaluation named `name` under `evals` (an `rlx eval ... benchmark=reasoning_gym
    name=<name>` directory: <timestamp>_<name>), or None when there is none."""
    found = sorted(evals.glob(f"*_{name}"))
    if not found:
        return None
    summary = json.loads((found[-1] / "summary.json").read_text())
    return summary["benchmarks"]["reasoning_gym"]["model"]["greedy/accuracy"]["value"]


def per_task(seeds: list[dict], evals: Path, tasks: list[str]) -> None:
    """Each seed's greedy accuracy on every task of --tasks (evaluations named <run folder>_<task>), in place."""
    for seed in seeds:
        if seed["run"]:
            seed["tasks"] = {task: task_accuracy(evals, f"{Path(seed['run']).name}_{task}") for task in tasks}


def arm_summary(seeds: list[dict]) -> dict:
    out = {"seeds": len(seeds)}
    for name, values in (("suite_diff", [s["suite"]["diff"] for s in seeds]),
                         ("gold_logprob_per_byte_diff", [s["gold_logprob_per_byte"]["diff"] for s in seeds]),
                         ("in_task_gain", [s["in_task"].get("gain") for s in seeds if s["in_task"]])):
        if len(values) > 1:
            point, low, high = stratified_bootstrap_ci(values, "iqm")
            out[name] = {"iqm": point, "low": low, "high": high, "values": values}
        elif values:
            out[name] = {"iqm": iqm(values), "values": values}
    return out


def _accuracy_cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _iqm_cell(value: dict | None, digits: int) -> str:
    if value is None:
        return ""
    low, high = value.get("low", value["iqm"]), value.get("high", value["iqm"])
    return f"{value['iqm']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def markdown(result: dict) -> str:
    """The tables of docs/evaluation.md#cost: one row per arm and seed, then one per arm over its seeds."""
    benches = list(next(iter(result["arms"].values()))["seeds"][0]["benchmarks"])
    tasks = list(result.get("base_tasks", {}))
    head = ["arm (seed)", "in-task held-out accuracy", *[f"{t} (greedy)" for t in tasks], "suite change [95% CI]",
            "right answer's log-lik. per byte [95% CI]", *benches]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    if tasks:
        lines.append("| base | | " + " | ".join(f"{result['base_tasks'][t]:.3f}" for t in tasks) + " | | |"
                     + " |" * len(benches))
    for name, arm in result["arms"].items():
        for i, seed in enumerate(arm["seeds"]):
            t, su, g = seed["in_task"], seed["suite"], seed["gold_logprob_per_byte"]
            cells = [f"{name} ({i})", f"{t.get('start', float('nan')):.3f} -> {t.get('end', float('nan')):.3f}",
                     *[_accuracy_cell(seed.get("tasks", {}).get(task)) for task in tasks],
                     f"{su['diff']:+.4f} [{su['low']:+.4f}, {su['high']:+.4f}]",
                     f"{g['diff']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}]",
                     *[f"{seed['benchmarks'][b]['value']:+.2f}" for b in benches]]
            lines.append("| " + " | ".join(cells) + " |")
    columns = ["arm", "seeds", "in-task gain, IQM [95% CI]", "suite change, IQM [95% CI]",
               "log-lik. per byte, IQM [95% CI]", *[f"{t} (mean)" for t in tasks]]
    lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, arm in result["arms"].items():
        summary = arm["summary"]
        cells = [name, str(summary["seeds"]), _iqm_cell(summary.get("in_task_gain"), 3),
                 _iqm_cell(summary.get("suite_diff"), 4), _iqm_cell(summary.get("gold_logprob_per_byte_diff"), 4),
                 *[_accuracy_cell(summary.get("tasks", {}).get(t)) for t in tasks]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="an eval directory made with compare=base")
    parser.add_argument("--arm", action="append", required=True, metavar="NAME=DIR[,DIR...]")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--task-evals", type=Path, default=None, help="a folder of `rlx eval run=<run> "
                        "benchmark=reasoning_gym name=<run folder>_<task>` directories (and base_<task>): each run's "
                        "greedy held-out accuracy per task of --tasks")
    parser.add_argument("--tasks", default="chain_sum,products")
    parser.add_argument("--markdown", action="store_true", help="also print the tables of docs/evaluation.md#cost")
    args = parser.parse_args(argv)
    arms = {}
    for spec in args.arm:
        name, _, dirs = spec.partition("=")
        arms[name] = [seed_result(Path(d), args.base) for d in dirs.split(",") if d]
    result = {"base": str(args.base), "arms": {name: {"summary": arm_summary(seeds), "seeds": seeds}
                                               for name, seeds in arms.items()}}
    if args.task_evals:
        tasks = args.tasks.split(",")
        result["base_tasks"] = {task: task_accuracy(args.task_evals, f"base_{task}") for task in tasks}
        for name, seeds in arms.items():
            per_task(seeds, args.task_evals, tasks)
            means = {task: [s["tasks"][task] for s in seeds if s.get("tasks", {}).get(task) is not None]
                     for task in tasks}
            result["arms"][name]["summary"]["tasks"] = {task: float(np.mean(v)) for task, v in means.items() if v}
    names = list(arms)
    result["improvement"] = {}
    for a in names:
        for b in names:
            if a < b and len(arms[a]) > 1 and len(arms[b]) > 1:
                p, low, high = probability_of_improvement_ci([s["suite"]["diff"] for s in arms[a]],
                                                             [s["suite"]["diff"] for s in arms[b]])
                result["improvement"][f"P({a} > {b})"] = {"value": p, "low": low, "high": high}
                p, low, high = probability_of_improvement_ci([s["gold_logprob_per_byte"]["diff"] for s in arms[a]],
                                                             [s["gold_logprob_per_byte"]["diff"] for s in arms[b]])
                result["improvement"][f"P({a} > {b}) gold log-lik. per byte"] = {"value": p, "low": low, "high": high}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    for name, seeds in arms.items():
        for seed in seeds:
            gain = seed["in_task"].get("gain")
            print(f"{name:10s} in-task {seed['in_task'].get('start', float('nan')):.3f} -> "
                  f"{seed['in_task'].get('end', float('nan')):.3f} ({gain:+.3f})  suite {seed['suite']['diff']:+.4f} "
                  f"[{seed['suite']['low']:+.4f}, {seed['suite']['high']:+.4f}]  gold logp/byte "
                  f"{seed['gold_logprob_per_byte']['diff']:+.4f} [{seed['gold_logprob_per_byte']['low']:+.4f}, "
                  f"{seed['gold_logprob_per_byte']['high']:+.4f}]  "
                  + "  ".join(f"{b} {v['value']:+.3f}" for b, v in seed["benchmarks"].items()))
    print(json.dumps(result["improvement"]))
    if args.markdown:
        print(markdown(result))


if __name__ == "__main__":
    main(sys.argv[1:])
