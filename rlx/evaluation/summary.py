"""`rlx eval`'s results: per-problem (per-task) values of every metric, their bootstrap intervals and the paired
difference with compare=, the solved-set changes, the printed table and plots/pass_at_k.png."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlx.evaluation.metrics import (
    bootstrap_ci,
    crossover_k,
    macro_mean_ci,
    majority_vote,
    mean_at_k,
    paired_bootstrap_diff,
    pass_at_k,
    solved_set_changes,
)
from rlx.runtime.storage import writing


def per_problem_values(records: list[dict], ks: list[int], threshold: float) -> dict[str, np.ndarray]:
    """One value per problem for every metric: greedy/accuracy, pass@k, maj@k, mean@k.
    A k larger than a problem's number of samples is left out."""
    values: dict[str, list[float]] = {}
    if records and records[0].get("greedy") is not None:
        values["greedy/accuracy"] = [r["greedy"]["score"] for r in records]
    n = min(len(r["scores"]) for r in records) if records else 0
    for k in [k for k in ks if 1 <= k <= n]:
        values[f"pass@{k}"] = [pass_at_k(len(r["scores"]), sum(s >= threshold for s in r["scores"]), k)
                               for r in records]
        values[f"maj@{k}"] = [majority_vote(r["extracted"][:k], r["scores"][:k])[1] for r in records]
        values[f"mean@{k}"] = [mean_at_k(r["scores"], k) for r in records]
    return {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}  # each (P,)


def summarize(records_by_role: dict[str, list[dict]], metrics_cfg, values_fn=per_problem_values) -> dict:
    """Per role: {metric: {value, low, high}}; with a compare role: paired differences on shared problems.
    values_fn(records, ks, threshold) -> {metric: (P,) one value per problem} (per_problem_values for
    benchmarks, evaluation/agents.py: per_task_values for environments)."""
    ks = [int(k) for k in metrics_cfg.ks]
    boot = dict(n_resamples=int(metrics_cfg.bootstrap_resamples), confidence=float(metrics_cfg.confidence),
                seed=int(metrics_cfg.bootstrap_seed))
    out: dict = {"problems": {role: len(recs) for role, recs in records_by_role.items()}}
    values = {role: values_fn(recs, ks, float(metrics_cfg.correct_threshold))
              for role, recs in records_by_role.items()}
    for role, metrics in values.items():
        out[role] = {}
        for name, vals in metrics.items():
            ci = bootstrap_ci(vals, **boot)
            out[role][name] = {"value": ci.point, "low": ci.low, "high": ci.high}
    if "compare" in records_by_role:
        shared = sorted({r["id"] for r in records_by_role["model"]} & {r["id"] for r in records_by_role["compare"]})
        index = {role: {r["id"]: i for i, r in enumerate(recs)} for role, recs in records_by_role.items()}
        out["diff"] = {"problems": len(shared)}
        for name in values["model"].keys() & values["compare"].keys():
            a = values["model"][name][[index["model"][i] for i in shared]]  # (P,) paired by problem id
            b = values["compare"][name][[index["compare"][i] for i in shared]]  # (P,)
            d = paired_bootstrap_diff(a, b, **boot)
            out["diff"][name] = {"value": d.diff, "low": d.low, "high": d.high, "frac_positive": d.frac_positive}
        if shared and all("scores" in r for recs in records_by_role.values() for r in recs):
            out["support"] = support_changes([records_by_role["model"][index["model"][i]] for i in shared],
                                             [records_by_role["compare"][index["compare"][i]] for i in shared],
                                             float(metrics_cfg.correct_threshold))
    return out


def support_changes(model_records: list[dict], compare_records: list[dict], threshold: float) -> dict:
    """Crossover k (where the compare= model's pass@k reaches the model's) and solved-set changes from the
    compare= model to the model, over the same problems (rlx/evaluation/metrics.py). n: samples per problem."""
    def counts(records):
        return (np.array([len(r["scores"]) for r in records]),
                np.array([sum(s >= threshold for s in r["scores"]) for r in records]))

    (n_model, c_model), (n_compare, c_compare) = counts(model_records), counts(compare_records)
    samples = int(min(n_model.min(), n_compare.min())) if len(model_records) else 0
    crossover = crossover_k(n_model, c_model, n_compare, c_compare) if samples else None
    return {"samples": samples, "crossover_k": crossover, **solved_set_changes(c_model, c_compare)}


def _metric_order(name: str) -> tuple:
    kind, _, k = name.partition("@")
    order = {"greedy/accuracy": 0, "greedy/success": 0, "greedy/return": 1, "greedy/turns": 2, "success": 3,
             "return": 4, "turns": 5, "pass": 6, "maj": 7, "mean": 8}
    return (order.get(kind, 9), int(k) if k.isdigit() else 0)


def render_table(summary: dict, labels: dict[str, str], confidence: float):
    """A rich Table: one row per benchmark and metric, value [low, high] per model and the difference; the column
    `read by` names the answer reader that scored each benchmark (rlx/tasks/readers.py; '-': an environment)."""
    from rich.table import Table

    pct = f"{confidence:.0%}"
    table = Table(title=f"rlx eval ({pct} bootstrap intervals over problems or environment tasks)")
    table.add_column("benchmark")
    table.add_column("read by")
    table.add_column("metric")
    table.add_column(labels["model"], justify="right")
    if "compare" in labels:
        table.add_column(labels["compare"], justify="right")
        table.add_column("difference (paired)", justify="right")
        table.add_column("P(diff>0)", justify="right")

    def cell(entry):
        return f"{entry['value']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"

    for bench, result in summary["benchmarks"].items():
        for i, name in enumerate(sorted(result["model"], key=_metric_order)):
            row = [bench if i == 0 else "", (result.get("reader") or "-") if i == 0 else "", name,
                   cell(result["model"][name])]
            if "compare" in labels:
                diff = result["diff"].get(name)
                row += [cell(result["compare"][name]) if name in result["compare"] else "-",
                        f"{diff['value']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]" if diff else "-",
                        f"{diff['frac_positive']:.3f}" if diff else "-"]
            table.add_row(*row)
    suite = summary.get("suite")
    if suite and suite.get("model"):  # the macro mean of the benchmarks' headline metrics
        row = [f"{suite['name']} (mean of {len(suite['benchmarks'])})", "-", "headline", cell(suite["model"])]
        if "compare" in labels:
            diff = suite.get("diff")
            row += ["-", f"{diff['value']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]" if diff else "-",
                    f"{diff['frac_positive']:.3f}" if diff else "-"]
        table.add_section()
        table.add_row(*row)
    return table


def support_lines(summary: dict, labels: dict[str, str]) -> list[str]:
    """One line per benchmark with compare=: the crossover k and the solved-set changes (support_changes)."""
    lines = []
    for bench, result in summary["benchmarks"].items():
        support = result.get("support")
        if not support or not support["samples"]:
            continue
        k = support["crossover_k"]
        crossing = (f"{labels['compare']} reaches {labels['model']}'s pass@k at k = {k}" if k is not None else
                    f"{labels['model']} stays ahead up to k = {support['samples']}")
        lines.append(f"{bench}: {crossing}; solved at least once in {support['samples']} samples: by "
                     f"{labels['model']} only {support['expand']} (expand), by {labels['compare']} only "
                     f"{support['shrink']} (shrink), both {support['both']}, neither {support['neither']}")
    return lines


def _k_ticks(ax, ks: list[int]) -> None:
    """Ticks at the plotted k, written 1, 2, 4 (not 2^0, 2^1, 2^2)."""
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()


def plot_pass_at_k(summary: dict, labels: dict[str, str], path: Path) -> Path | None:
    """pass@k against k (log2 axis) with interval bars, one panel per benchmark."""
    panels = [(b, r) for b, r in summary["benchmarks"].items() if any(m.startswith("pass@") for m in r["model"])]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paired = any(any(m.startswith("pass@") for m in r.get("diff", {})) for _, r in panels)
    fig, axes = plt.subplots(2 if paired else 1, len(panels), figsize=(5 * len(panels), 7.5 if paired else 4),
                             squeeze=False)
    for column, (bench, result) in enumerate(panels):
        diff = sorted((int(m.split("@")[1]), e) for m, e in result.get("diff", {}).items() if m.startswith("pass@"))
        if paired and diff:  # compare=: the paired difference model - compare, with its interval
            ax = axes[1][column]
            mid = np.array([e["value"] for _, e in diff])
            err = np.array([[e["value"] - e["low"] for _, e in diff], [e["high"] - e["value"] for _, e in diff]])
            ax.errorbar([k for k, _ in diff], mid, yerr=err, marker="o", capsize=3, color="C2",
                        label=f"{labels['model']} - {labels['compare']}")
            ax.axhline(0.0, color="grey", linewidth=1)
            ax.set_xscale("log", base=2)
            _k_ticks(ax, [k for k, _ in diff])
            ax.set_xlabel("k")
            ax.set_ylabel("paired difference in pass@k")
            ax.set_title(f"{bench}: paired difference ({result['diff']['problems']} problems)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        elif paired:
            axes[1][column].axis("off")
        ax = axes[0][column]
        for role in ("model", "compare"):
            if role not in result:
                continue
            points = sorted((int(m.split("@")[1]), e) for m, e in result[role].items() if m.startswith("pass@"))
            ks = [k for k, _ in points]
            mid = np.array([e["value"] for _, e in points])
            err = np.array([[e["value"] - e["low"] for _, e in points], [e["high"] - e["value"] for _, e in points]])
            ax.errorbar(ks, mid, yerr=err, marker="o", capsize=3, label=labels[role])
        ax.set_xscale("log", base=2)
        _k_ticks(ax, ks)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k")
        ax.set_title(bench)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        # optional: summary.json holds the numbers
        with writing(path, "the pass@k plot", partial=path, optional="plots"):
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=100)
            return path
    finally:
        plt.close(fig)
    return None


def suite_summary(name: str, benchmarks: list, records: dict, metrics_cfg) -> dict:
    """The macro mean of the benchmarks' headline metrics (each benchmark weighs the same) with its stratified
    bootstrap interval and, with compare=, the paired difference (rlx/evaluation/metrics.py: macro_mean_ci)."""
    ks, threshold = [int(k) for k in metrics_cfg.ks], float(metrics_cfg.correct_threshold)
    pairs, used = [], []
    for bench in benchmarks:
        by_role = records[bench.name]
        values = {role: bench.values(recs, ks, threshold) for role, recs in by_role.items()}
        metric = bench.metric or next((m for m in ("greedy/accuracy", "pass@1") if m in values["model"]), None)
        if metric is None:
            continue
        index = {r["id"]: i for i, r in enumerate(by_role["model"])}
        if "compare" in by_role:
            shared = [r["id"] for r in by_role["compare"] if r["id"] in index]
            compare_index = {r["id"]: i for i, r in enumerate(by_role["compare"])}
            pairs.append((values["model"][metric][[index[i] for i in shared]],
                          values["compare"][metric][[compare_index[i] for i in shared]]))
        else:
            pairs.append((values["model"][metric], None))
        used.append(f"{bench.name}:{metric}")
    if not pairs:
        return {"name": name, "benchmarks": []}
    value, diff = macro_mean_ci(pairs, int(metrics_cfg.bootstrap_resamples), float(metrics_cfg.confidence),
                                int(metrics_cfg.bootstrap_seed))
    out = {"name": name, "benchmarks": used, "model": {"value": value.point, "low": value.low, "high": value.high}}
    if diff is not None:
        out["diff"] = {"value": diff.diff, "low": diff.low, "high": diff.high, "frac_positive": diff.frac_positive}
    return out
