"""`rlx report RUN_OR_SWEEP_DIRS...`: curves, aggregates and comparisons over seeds, from run directories.

Writes into --out (default: <first dir>/report):
    curves.png       learning curves: mean over seeds and a 95% Student-t band, one panel per metric
    aggregates.csv   per configuration and final metric: seeds, mean, IQM and its stratified bootstrap CI
    profiles.png     performance profiles of the first metric (fraction of runs above tau), with bands
    summary.md       the same as markdown, plus the probability of improvement between configurations,
                     the optimality gap (rlx/report/profiles.py) and, with --adastop, AdaStop's decisions

Statistics follow Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical Precipice"): the
interquartile mean of final scores with a stratified percentile bootstrap interval, and
P(X > Y) + 0.5 P(X = Y) for a run X of one configuration against a run Y of another.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlx.errors import UserError
from rlx.report.profiles import default_taus, optimality_gap_ci, performance_profile_ci
from rlx.report.remarks import (
    default_curves,
    default_metrics,
    interval_caveat,
    pair_caveat,
    skipped_dirs,
    task_of,
    task_remark,
)
from rlx.report.runs import Group, common_overrides, eval_metrics, find_runs, group_runs, is_eval_dir
from rlx.report.stats import (
    probability_of_improvement_ci,
    seed_band,
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
                   "failed": sum(bool(r.failed) for r in group.runs), "values": values,
                   "overrides": " ".join(group.key), "caveat": interval_caveat(len(values))}
            if len(values) == 1:  # one run: its value, no interval (a bootstrap of one value is that value)
                row.update(mean=values[0], iqm=values[0])
            elif values:
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
        caveat = pair_caveat(len(finals[x]), len(finals[y]))
        if caveat is not None and caveat.startswith("no interval"):
            low = high = None
        out.append({"x": x, "y": y, "metric": metric, "p": point, "ci_low": low, "ci_high": high, "caveat": caveat})
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
            band = seed_band([c for c in curves if c[0]])
            if band is None:
                continue
            steps, mean, low, high, seeds = band
            line = ax.plot(steps, mean, marker="o" if len(steps) < 20 else None, markersize=3,
                           label=f"{group.name}: {group.label} (n={seeds})")[0]
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


def final_scores(groups: list[Group], metric: str, seed_order: bool = False) -> dict[str, list[float]]:
    """Configuration id -> the finite final values of its finished runs (in seed order when asked)."""
    out = {}
    for group in groups:
        runs = [r for r in group.runs if not r.failed]
        if seed_order:
            runs = sorted(runs, key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, str(r.path)))
        values = [v for v in (r.final_value(metric) for r in runs) if v is not None]
        if values:
            out[group.name] = values
    return out


def profiles(groups: list[Group], metric: str, gamma: float, n_resamples: int = 2000, seed: int = 0) -> dict:
    """Optimality gap (with CI) per configuration and the performance profiles of `metric`'s final values
    on a shared tau grid (Agarwal et al. 2021, rlx/report/profiles.py)."""
    finals = final_scores(groups, metric)
    taus = default_taus([np.asarray(v) for v in finals.values()])
    gaps, curves = {}, {}
    for name, values in finals.items():
        gaps[name] = optimality_gap_ci(values, gamma, n_resamples=n_resamples, seed=seed)
        curves[name] = performance_profile_ci(values, taus, n_resamples=n_resamples, seed=seed)
    return {"metric": metric, "gamma": gamma, "taus": taus, "gaps": gaps, "curves": curves}


def plot_profiles(result: dict, groups: list[Group], out: Path) -> Path | None:
    if not result["curves"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {g.name: g.label for g in groups}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, (profile, low, high) in result["curves"].items():
        line = ax.step(result["taus"], profile, where="post", label=f"{name}: {labels.get(name, '')}")[0]
        ax.fill_between(result["taus"], low, high, step="post", color=line.get_color(), alpha=0.2)
    ax.set_xlabel(f"tau ({result['metric']})")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("performance profile, 95% stratified bootstrap band", fontsize=9)
    fig.tight_layout()
    path = out / "profiles.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _f(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) and math.isfinite(value) else "-"


def _interval_cell(low, high, caveat: str | None) -> str:
    """`[low, high]`, the interval with its caveat when rough, or the caveat alone when there is no interval."""
    if low is None or high is None:
        return caveat or "-"
    interval = f"[{_f(low)}, {_f(high)}]"
    return f"{interval} ({caveat})" if caveat else interval


@dataclass(frozen=True)
class ReportContent:
    """What summary.md shows: the configurations (groups) and their aggregate rows, the comparisons, the plot,
    the run folders read (sources), and where present the profiles and their plot, the AdaStop decision, the
    remarks and the folders skipped (with why)."""

    groups: list[Group]
    rows: list[dict]
    comparisons: list[dict]
    plot: Path | None
    sources: list[Path]
    profile: dict | None = None
    profile_plot: Path | None = None
    adastop: dict | None = None
    remarks: list[str] | None = None
    skipped: list[tuple[Path, str]] | None = None


def markdown(content: ReportContent) -> str:
    """summary.md of a report."""
    groups, rows, comparisons, plot, sources = (content.groups, content.rows, content.comparisons, content.plot,
                                                content.sources)
    profile, profile_plot, adastop = content.profile, content.profile_plot, content.adastop
    remarks, skipped = content.remarks, content.skipped
    lines = ["# rlx report", "", "Runs from: " + ", ".join(f"`{s}`" for s in sources), ""]
    for remark in remarks or []:
        lines += [f"**Remark:** {remark}", ""]
    common = common_overrides(groups)
    if common:
        lines += [f"Overrides shared by every configuration: `{' '.join(common)}`", ""]
    lines += ["## Configurations", "",
              "| id | overrides (besides the shared ones and the seed), or the run's folder | seeds | failed |",
              "|---|---|---|---|"]
    for group in groups:
        seeds = sorted(str(r.seed) for r in group.runs if not r.failed)
        lines.append(f"| {group.name} | `{group.label}` | {', '.join(seeds)} | "
                     f"{sum(bool(r.failed) for r in group.runs)} |")
    lines += ["", "## Final metrics", "",
              "IQM = interquartile mean over seeds; CI = 95% stratified percentile bootstrap interval of the IQM "
              "(Agarwal et al. 2021). With few seeds the interval is wide and the IQM is close to the mean.", "",
              "| id | metric | runs | mean | IQM | 95% CI |", "|---|---|---|---|---|---|"]
    for row in rows:
        ci = _interval_cell(row.get("ci_low"), row.get("ci_high"), row.get("caveat")) if row["runs"] else "-"
        lines.append(f"| {row['config']} | {row['metric']} | {row['runs']} | {_f(row.get('mean'))} | "
                     f"{_f(row.get('iqm'))} | {ci} |")
    if comparisons:
        lines += ["", "## Probability of improvement", "",
                  "P(X > Y) = probability that a run of X ends above a run of Y (ties count half), "
                  "with a 95% bootstrap CI.", "", "| X | Y | metric | P(X > Y) | 95% CI |", "|---|---|---|---|---|"]
        for c in comparisons:
            lines.append(f"| {c['x']} | {c['y']} | {c['metric']} | {_f(c['p'])} | "
                         f"{_interval_cell(c['ci_low'], c['ci_high'], c.get('caveat'))} |")
    if profile is not None and profile["gaps"]:
        lines += ["", "## Optimality gap and performance profile", "",
                  f"Optimality gap = {profile['gamma']:g} - mean(min(score, {profile['gamma']:g})) over the runs' "
                  f"final {profile['metric']} (lower is better; Agarwal et al. 2021), with a 95% stratified bootstrap "
                  "CI.",
                  "", "| id | optimality gap | 95% CI |", "|---|---|---|"]
        runs = {row["config"]: row["runs"] for row in rows if row["metric"] == profile["metric"]}
        for name, (point, low, high) in profile["gaps"].items():
            caveat = interval_caveat(runs.get(name, 0))
            shown = (None, None) if caveat is not None and caveat.startswith("n=1") else (low, high)
            lines.append(f"| {name} | {_f(point)} | {_interval_cell(*shown, caveat)} |")
        if profile_plot is not None:
            lines += ["", f"![performance profiles]({profile_plot.name})"]
    if adastop is not None:
        lines += ["", "## AdaStop", "",
                  f"Sequential permutation test on {adastop['metric']} (Mathieu et al. 2024; n = {adastop['n']} seeds "
                  f"per interim, at most K = {adastop['K']} interims, alpha = {adastop['alpha']:g}); interims "
                  f"completed: {adastop['interims']}.", "", "| pair | decision |", "|---|---|"]
        lines += [f"| {pair} | {decision} |" for pair, decision in adastop["decisions"].items()]
        if adastop["needs"]:
            lines += ["", "Undecided: run more seeds of "
                      + ", ".join(f"{name} (+{more})" for name, more in adastop["needs"].items())
                      + " and report again."]
    if plot is not None:
        lines += ["", "## Learning curves", "", f"![learning curves]({plot.name})"]
    if skipped:
        lines += ["", "## Skipped directories", "", "| directory | why |", "|---|---|"]
        lines += [f"| `{path}` | {why} |" for path, why in skipped]
    return "\n".join(lines) + "\n"


def _default_metrics(runs: list) -> tuple[str, ...]:
    """Each training run's optimized metric (remarks.default_metrics), then each evaluation's headline metrics
    (runs.eval_metrics: the paired differences when it has compare=)."""
    trained = [r.path for r in runs if not is_eval_dir(r.path)]
    found = list(default_metrics(trained)) if trained else []
    for run in runs:
        if is_eval_dir(run.path):
            found += [m for m in eval_metrics(run.path) if m not in found]
    return tuple(found) or ("eval/accuracy",)


def write_report(paths: list[Path], out: Path | None = None, metrics: tuple[str, ...] | None = None,
                 curves: tuple[str, ...] | None = None, compare: list[tuple[str, str]] | None = None,
                 n_resamples: int = 2000, gamma: float = 1.0, adastop: dict | None = None) -> dict:
    """Build the report; returns {groups, aggregates, comparisons, plot, profiles, adastop, summary, remarks,
    skipped} with the written paths. metrics None: each run's own optimized metric (eval/success for agent runs,
    eval/accuracy for the others); curves None: those and the training signal beside them. adastop: {n, K,
    alpha, B} runs AdaStop on the first metric (rlx/report/adastop.py)."""
    runs = find_runs(paths)
    out = Path(out) if out is not None else Path(paths[0]) / "report"
    skipped = skipped_dirs(paths, [r.path for r in runs], out)
    if not runs:
        reasons = "; ".join(f"skipped {path} ({why})" for path, why in skipped)
        raise UserError(f"no run found under {', '.join(map(str, paths))} (a run directory holds metrics.jsonl)"
                        + (f"; {reasons}" if reasons else ""))
    metrics = tuple(metrics) if metrics else _default_metrics(runs)
    curves = tuple(curves) if curves is not None else default_curves(metrics)
    groups = group_runs(runs)
    remarks = []
    tasks = {g.name: " / ".join(sorted({t for t in (task_of(r.path) for r in g.runs) if t})) or None for g in groups}
    remark = task_remark(tasks)
    if remark is not None:
        remarks.append(remark)
    out.mkdir(parents=True, exist_ok=True)
    rows = aggregate(groups, list(metrics), n_resamples=n_resamples)
    comparisons = improvements(groups, metrics[0], compare, n_resamples=n_resamples)
    plot = plot_curves(groups, list(curves), out) if curves else None
    profile = profiles(groups, metrics[0], gamma, n_resamples=n_resamples)
    profile_plot = plot_profiles(profile, groups, out)
    decided = None
    if adastop is not None:
        from rlx.report.adastop import adastop_compare

        decided = {**adastop_compare(final_scores(groups, metrics[0], seed_order=True), **adastop), **adastop,
                   "metric": metrics[0]}
    with (out / "aggregates.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["config", "overrides", "metric", "runs", "failed", "mean", "iqm", "ci_low", "ci_high",
                         "values"])
        for row in rows:  # the full overrides (tables and legends show the short label)
            writer.writerow([row["config"], row["overrides"], row["metric"], row["runs"], row["failed"],
                             row.get("mean", ""),
                             row.get("iqm", ""), row.get("ci_low", ""), row.get("ci_high", ""),
                             " ".join(f"{v:.6g}" for v in row["values"])])
    summary = out / "summary.md"
    summary.write_text(markdown(ReportContent(groups, rows, comparisons, plot, [Path(p) for p in paths], profile,
                                              profile_plot, decided, remarks, skipped)))
    return {"groups": groups, "aggregates": rows, "comparisons": comparisons, "plot": plot, "profiles": profile,
            "adastop": decided, "summary": summary, "remarks": remarks, "skipped": skipped}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="rlx report",
        description="Learning curves, IQM with bootstrap CIs and probability of improvement over seeds, "
                    "from run or sweep directories written by rlx train.")
    parser.add_argument("dirs", nargs="+", type=Path,
                        help="run directories or sweep directories (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first dir>/report)")
    parser.add_argument("--metrics", default=None,
                        help="comma-separated final metrics to aggregate; the first one is compared (default: each "
                             "run's optimized_metric: eval/success for agent runs, eval/accuracy for the others)")
    parser.add_argument("--curves", default=None,
                        help="comma-separated metrics to plot over steps (default: the metrics, and reward/total or, "
                             "for agent runs, env/success)")
    parser.add_argument("--compare", nargs=2, action="append", metavar=("X", "Y"),
                        help="configuration ids (c1, c2, ...) to compare with P(X > Y); repeatable "
                             "(default: the best configuration against each other one)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    parser.add_argument("--gamma", type=float, default=1.0,
                        help="target of the optimality gap of the first metric (default: 1.0, an accuracy's best)")
    parser.add_argument("--adastop", metavar="N,K", default=None,
                        help="AdaStop sequential comparison of the configurations on the first metric: N seeds per "
                             "interim, at most K interims (e.g. 5,5; needs pip install 'rlx[stats]')")
    parser.add_argument("--adastop-alpha", type=float, default=0.05, help="AdaStop family-wise level (default: 0.05)")
    args = parser.parse_args(argv)
    if args.resamples < 1:
        raise UserError(f"--resamples={args.resamples} must be at least 1")
    adastop = None
    if args.adastop is not None:
        parts = args.adastop.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            raise UserError(f"--adastop={args.adastop} must be N,K with two positive integers, e.g. --adastop 5,5")
        if not 0 < args.adastop_alpha < 1:
            raise UserError(f"--adastop-alpha={args.adastop_alpha} must lie in (0, 1)")
        adastop = {"n": int(parts[0]), "K": int(parts[1]), "alpha": args.adastop_alpha}
    metrics = tuple(m for m in args.metrics.split(",") if m) if args.metrics is not None else None
    curves = tuple(m for m in args.curves.split(",") if m) if args.curves is not None else None
    if metrics is not None and not metrics:
        raise UserError("--metrics is empty; name at least one metric, e.g. --metrics eval/accuracy")
    result = write_report(args.dirs, args.out, metrics, curves,
                          [tuple(p) for p in args.compare] if args.compare else None,
                          args.resamples, args.gamma, adastop)
    print(result["summary"].read_text())
    for path, why in result["skipped"]:
        print(f"skipped {path}: {why}", file=sys.stderr)
    print(f"done: {result['summary'].parent}  summary: {result['summary']}"
          + (f"  plot: {result['plot']}" if result["plot"] else "  (no curve to plot)"))
