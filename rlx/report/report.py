"""`rlx report RUN_OR_SWEEP_DIRS...`: curves, aggregates and comparisons over seeds, from run directories.

Writes into --out (default: <first dir>/report):
    curves.png       learning curves: mean over seeds and a 95% Student-t band, one panel per metric
    aggregates.csv   per configuration and final metric: seeds, mean, IQM and its stratified bootstrap CI
    summary.md       the same as markdown, plus the probability of improvement between configurations

Statistics follow Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical Precipice"): the
interquartile mean of final scores with a stratified percentile bootstrap interval, and
P(X > Y) + 0.5 P(X = Y) for a run X of one configuration against a run Y of another.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from rlx.errors import UserError
from rlx.report.runs import Group, common_overrides, find_runs, group_runs
from rlx.report.stats import (
    align_curves,
    mean_and_band,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)
from rlx.runtime.rundir import integer_step_ticks


def aggregate(groups: list[Group], metrics: list[str], n_resamples: int = 2000, seed: int = 0) -> list[dict]:
    """One row per (configuration, metric) with the finite final values of its runs."""
    rows = []
    for group in groups:
        for metric in metrics:
            values = [v for v in (r.final_value(metric) for r in group.runs if not r.failed) if v is not None]
            row = {"config": group.name, "label": group.label, "metric": metric, "runs": len(values),
                   "failed": sum(bool(r.failed) for r in group.runs), "values": values}
            if values:
                point, low, high = stratified_bootstrap_ci(values, "iqm", n_resamples=n_resamples, seed=seed)
                row.update(mean=sum(values) / len(values), iqm=point, ci_low=low, ci_high=high)
            rows.append(row)
    return rows


def improvements(groups: list[Group], metric: str, pairs: list[tuple[str, str]] | None, n_resamples: int = 2000,
                 seed: int = 0) -> list[dict]:
    """P(X > Y) with a bootstrap CI for each (x, y) pair of group names. Default pairs: the group with
    the highest IQM of `metric` against every other group."""
    finals = {}
    for group in groups:
        values = [v for v in (r.final_value(metric) for r in group.runs if not r.failed) if v is not None]
        if values:
            finals[group.name] = values
    by_name = {g.name: g for g in groups}
    if pairs is None:
        if len(finals) < 2:
            return []
        from rlx.report.stats import iqm

        best = max(finals, key=lambda name: iqm(finals[name]))
        pairs = [(best, other) for other in finals if other != best]
    out = []
    for x, y in pairs:
        for name in (x, y):
            if name not in by_name:
                raise UserError(f"unknown configuration '{name}' in --compare; valid choices: {', '.join(by_name)}")
            if name not in finals:
                raise UserError(f"configuration '{name}' has no finished run with {metric}")
        point, low, high = probability_of_improvement_ci(finals[x], finals[y], n_resamples=n_resamples, seed=seed)
        out.append({"x": x, "y": y, "metric": metric, "p": point, "ci_low": low, "ci_high": high})
    return out


def plot_curves(groups: list[Group], metrics: list[str], out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    drawn = False
    for ax, metric in zip(axes[0], metrics):
        drawn_steps = []
        for group in groups:
            curves = [r.curve(metric) for r in group.runs if not r.failed]
            curves = [c for c in curves if c[0]]
            if not curves:
                continue
            try:
                steps, matrix = align_curves(curves)  # (S,), (seeds, S)
            except ValueError:
                continue
            mean, low, high = mean_and_band(matrix)
            line = ax.plot(steps, mean, marker="o" if len(steps) < 20 else None, markersize=3,
                           label=f"{group.name}: {group.label} (n={matrix.shape[0]})")[0]
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
            drawn_steps += list(steps)
            drawn = True
        ax.set_title(metric)
        ax.set_xlabel("step")
        integer_step_ticks(ax, drawn_steps)
        ax.grid(alpha=0.3)
    if not drawn:
        plt.close(fig)
        return None
    axes[0][0].legend(fontsize=7)
    fig.suptitle("mean over seeds, 95% t-interval of the mean", fontsize=9)
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _f(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) and math.isfinite(value) else "-"


def markdown(groups: list[Group], rows: list[dict], comparisons: list[dict], plot: Path | None, sources: list[Path]) -> str:
    lines = ["# rlx report", "", "Runs from: " + ", ".join(f"`{s}`" for s in sources), ""]
    common = common_overrides(groups)
    if common:
        lines += [f"Overrides shared by every configuration: `{' '.join(common)}`", ""]
    lines += ["## Configurations", "", "| id | overrides (besides the shared ones and the seed), or the run's folder | seeds | failed |",
              "|---|---|---|---|"]
    for group in groups:
        seeds = sorted(str(r.seed) for r in group.runs if not r.failed)
        lines.append(f"| {group.name} | `{group.label}` | {', '.join(seeds)} | {sum(bool(r.failed) for r in group.runs)} |")
    lines += ["", "## Final metrics", "",
              "IQM = interquartile mean over seeds; CI = 95% stratified percentile bootstrap interval of the IQM "
              "(Agarwal et al. 2021). With few seeds the interval is wide and the IQM is close to the mean.", "",
              "| id | metric | runs | mean | IQM | 95% CI |", "|---|---|---|---|---|---|"]
    for row in rows:
        ci = f"[{_f(row.get('ci_low'))}, {_f(row.get('ci_high'))}]" if row["runs"] else "-"
        lines.append(f"| {row['config']} | {row['metric']} | {row['runs']} | {_f(row.get('mean'))} | {_f(row.get('iqm'))} | {ci} |")
    if comparisons:
        lines += ["", "## Probability of improvement", "",
                  "P(X > Y) = probability that a run of X ends above a run of Y (ties count half), "
                  "with a 95% bootstrap CI.", "", "| X | Y | metric | P(X > Y) | 95% CI |", "|---|---|---|---|---|"]
        for c in comparisons:
            lines.append(f"| {c['x']} | {c['y']} | {c['metric']} | {_f(c['p'])} | [{_f(c['ci_low'])}, {_f(c['ci_high'])}] |")
    if plot is not None:
        lines += ["", "## Learning curves", "", f"![learning curves]({plot.name})"]
    return "\n".join(lines) + "\n"


def write_report(paths: list[Path], out: Path | None = None, metrics: tuple[str, ...] = ("eval/accuracy",),
                 curves: tuple[str, ...] = ("eval/accuracy", "reward/total"), compare: list[tuple[str, str]] | None = None,
                 n_resamples: int = 2000) -> dict:
    """Build the report; returns {groups, aggregates, comparisons, plot, summary} with the written paths."""
    runs = find_runs(paths)
    if not runs:
        raise UserError(f"no run found under {', '.join(map(str, paths))} (a run directory holds metrics.jsonl)")
    groups = group_runs(runs)
    out = Path(out) if out is not None else Path(paths[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = aggregate(groups, list(metrics), n_resamples=n_resamples)
    comparisons = improvements(groups, metrics[0], compare, n_resamples=n_resamples)
    plot = plot_curves(groups, list(curves), out) if curves else None
    with (out / "aggregates.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["config", "overrides", "metric", "runs", "failed", "mean", "iqm", "ci_low", "ci_high", "values"])
        for row in rows:
            writer.writerow([row["config"], row["label"], row["metric"], row["runs"], row["failed"], row.get("mean", ""),
                             row.get("iqm", ""), row.get("ci_low", ""), row.get("ci_high", ""),
                             " ".join(f"{v:.6g}" for v in row["values"])])
    summary = out / "summary.md"
    summary.write_text(markdown(groups, rows, comparisons, plot, [Path(p) for p in paths]))
    return {"groups": groups, "aggregates": rows, "comparisons": comparisons, "plot": plot, "summary": summary}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="rlx report",
        description="Learning curves, IQM with bootstrap CIs and probability of improvement over seeds, "
                    "from run or sweep directories written by rlx train.")
    parser.add_argument("dirs", nargs="+", type=Path, help="run directories or sweep directories (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first dir>/report)")
    parser.add_argument("--metrics", default="eval/accuracy",
                        help="comma-separated final metrics to aggregate; the first one is compared (default: eval/accuracy)")
    parser.add_argument("--curves", default="eval/accuracy,reward/total",
                        help="comma-separated metrics to plot over steps (default: eval/accuracy,reward/total)")
    parser.add_argument("--compare", nargs=2, action="append", metavar=("X", "Y"),
                        help="configuration ids (c1, c2, ...) to compare with P(X > Y); repeatable "
                             "(default: the best configuration against each other one)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    args = parser.parse_args(argv)
    if args.resamples < 1:
        raise UserError(f"--resamples={args.resamples} must be at least 1")
    metrics = tuple(m for m in args.metrics.split(",") if m)
    curves = tuple(m for m in args.curves.split(",") if m)
    if not metrics:
        raise UserError("--metrics is empty; name at least one metric, e.g. --metrics eval/accuracy")
    result = write_report(args.dirs, args.out, metrics, curves, [tuple(p) for p in args.compare] if args.compare else None,
                          args.resamples)
    print(result["summary"].read_text())
    print(f"report: {result['summary']}" + (f"  plot: {result['plot']}" if result["plot"] else "  (no curve to plot)"))
