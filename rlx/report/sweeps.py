"""Sweeps: failure records, the per-sweep summary, and test-seed re-runs of the best configuration.

    rlx train -m seed=0,1,2 algorithm=grpo,dapo     Hydra multirun with the basic sweeper (a grid)
    rlx sweep NAME [key=value ...]                   the sweep in conf/sweep/NAME.yaml (grid or Optuna)
    rlx sweep retest SWEEP_DIR [seeds=...]           re-run the best trial on fresh (test) seeds

Every trial directory ends with `result.json` (final metrics) or `failure.json` (the exception); the
training task returns `optimized_metric` to the sweeper. A crashing trial is recorded and the sweep
goes on. At the end of a multirun, `SweepSummary` (a Hydra callback set in conf/train.yaml) writes
`summary.csv` and `summary.md` into the sweep directory and prints a table sorted by that metric.

Tuning and test seeds are kept apart (Eimer et al. 2023, "Hyperparameters in Reinforcement Learning
and How To Tune Them"): the score of the best trial is optimistic because it was selected on the
same seeds; `retest` re-runs it on seeds the search never saw and reports those numbers instead.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import traceback
from pathlib import Path

from hydra.experimental.callback import Callback

from rlx.config.rules import optimized_metric
from rlx.errors import StorageError, fail
from rlx.report.runs import short_override
from rlx.runtime.rundir import atomic_write_text
from rlx.runtime.storage import writing

log = logging.getLogger("rlx")

RESULT_FILE = "result.json"
FAILURE_FILE = "failure.json"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
DEFAULT_TEST_SEEDS = (1000, 1001, 1002)  # far from the usual tuning seeds 0, 1, 2, ...
# filled by SweepSummary at the end of a multirun; rlx.cli exits non-zero when a trial failed
FAILED_TRIALS: list[str] = []
TRIAL_COUNT: list[int] = []


def is_multirun(hydra_cfg) -> bool:
    from hydra.types import RunMode

    return hydra_cfg.mode == RunMode.MULTIRUN


def sweep_direction(hydra_cfg) -> str:
    """'maximize' or 'minimize': the Optuna sweeper's direction, else maximize (basic sweeper)."""
    direction = hydra_cfg.sweeper.get("direction", "maximize")
    return "minimize" if "min" in str(direction).lower() else "maximize"


def write_result(run_dir: Path, final: dict, optimized_metric: str) -> None:
    """result.json: the run's final metrics and which one a sweep optimizes."""
    metrics = {k: (v.item() if hasattr(v, "item") else v) for k, v in final.items()}
    record = {"status": "ok", "optimized_metric": optimized_metric, "metrics": metrics}
    with writing(run_dir, "the run's final metrics (result.json)"):
        run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / RESULT_FILE, json.dumps(record, indent=1) + "\n",
                      "the run's final metrics (result.json)")


def restore_result(run_dir: Path, optimized_metric: str) -> bool:
    """result.json of a finished run that lacks it (a storage fault stopped the run after its final model was
    written): the final evaluation is the last metrics.jsonl row holding eval/* values. True when written."""
    from rlx.runtime.rundir import read_metrics

    if (run_dir / RESULT_FILE).is_file():
        return False
    rows = [row for row in read_metrics(run_dir / "metrics.jsonl") if any(k.startswith("eval/") for k in row)]
    if not rows:
        return False
    write_result(run_dir, {k: v for k, v in rows[-1].items() if k.startswith("eval/")}, optimized_metric)
    log.info("result.json written from the last evaluation in metrics.jsonl (step %d)", rows[-1]["step"])
    return True


def record_failure(run_dir: Path, exc: BaseException, hydra_cfg) -> float | None:
    """failure.json for a trial that raised; returns what the sweeper should receive instead of a metric.

    The basic sweeper accepts None. Optuna rejects None and NaN (the sweeper would stop), so it gets
    the worst value for its direction: -inf when maximizing, +inf when minimizing."""
    with writing(run_dir, "the trial's failure record (failure.json)"):
        run_dir.mkdir(parents=True, exist_ok=True)
    message = str(exc) if not isinstance(exc, SystemExit) else f"exited with code {exc.code}"
    record = {
        "status": "failed",
        "error": f"{type(exc).__name__}: {message}",
        "overrides": list(hydra_cfg.overrides.task),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    atomic_write_text(run_dir / FAILURE_FILE, json.dumps(record, indent=1) + "\n",
                      "the trial's failure record (failure.json)")
    log.error("trial %s failed (%s); recorded in %s, the sweep goes on", hydra_cfg.job.num, record["error"],
              run_dir / FAILURE_FILE)
    if "optuna" in str(hydra_cfg.sweeper.get("_target_", "")).lower():
        return -math.inf if sweep_direction(hydra_cfg) == "maximize" else math.inf
    return None


def read_trial(trial_dir: Path) -> dict:
    """One trial directory as {trial, status, overrides, error, metrics}."""
    overrides_file = trial_dir / ".hydra" / "overrides.yaml"
    if not overrides_file.is_file():
        overrides_file = trial_dir / "overrides.yaml"
    overrides = []
    if overrides_file.is_file():
        from omegaconf import OmegaConf

        overrides = [str(o) for o in OmegaConf.load(overrides_file)]
    row = {"trial": trial_dir.name, "status": "incomplete", "overrides": overrides, "error": "", "metrics": {}}
    if (trial_dir / RESULT_FILE).is_file():
        result = json.loads((trial_dir / RESULT_FILE).read_text())
        row.update(status="ok", metrics=result.get("metrics", {}))
    elif (trial_dir / FAILURE_FILE).is_file():
        failure = json.loads((trial_dir / FAILURE_FILE).read_text())
        row.update(status="failed", error=failure.get("error", ""))
    return row


def trial_dirs(sweep_dir: Path) -> list[Path]:
    """Trial subdirectories of a sweep directory (those Hydra wrote a .hydra/ folder or overrides into)."""
    found = [p for p in sweep_dir.iterdir() if p.is_dir()
             and ((p / ".hydra").is_dir() or (p / "overrides.yaml").is_file())]
    return sorted(found, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def _finite(row: dict, metric: str) -> float | None:
    value = row["metrics"].get(metric)
    ok = row["status"] == "ok" and isinstance(value, (int, float)) and math.isfinite(value)
    return float(value) if ok else None


def configuration(overrides: list[str]) -> tuple[str, ...]:
    """A trial's configuration: its overrides without the seed (trials differing only in seed repeat it)."""
    return tuple(o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "seed")


def summarize_sweep(sweep_dir: Path, optimized_metric: str, direction: str = "maximize") -> list[dict]:
    """Read every trial, write summary.csv and summary.md into sweep_dir, return the rows in order.

    Trials that differ only in their seed are one configuration: configurations are ranked by their mean
    over seeds (a trial with a lucky seed does not make its configuration best), the trials of one
    configuration stay together, failed and incomplete trials go last. A sweep over seeds only is not
    ranked (there is one configuration): its trials stay in order and the summary gives mean and spread."""
    rows = [read_trial(p) for p in trial_dirs(sweep_dir)]
    sign = -1.0 if direction == "maximize" else 1.0
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(configuration(row["overrides"]), []).append(row)
    for members in groups.values():
        values = [v for v in (_finite(r, optimized_metric) for r in members) if v is not None]
        for row in members:
            row["config_mean"] = sum(values) / len(values) if values else None
            row["config_values"] = values
    seeds_only = len(groups) == 1 and len(rows) > 1

    def key(row):
        value, mean = _finite(row, optimized_metric), row["config_mean"]
        number = int(row["trial"]) if row["trial"].isdigit() else math.inf
        if seeds_only:
            return (0 if value is not None else 1, number, row["trial"])
        return (0 if value is not None else 1, sign * mean if mean is not None else 0.0,
                configuration(row["overrides"]), sign * value if value is not None else 0.0, number, row["trial"])

    rows.sort(key=key)
    for row in rows:
        row["seeds_only"] = seeds_only
    common = set(rows[0]["overrides"]).intersection(*(set(r["overrides"]) for r in rows[1:])) if rows else set()
    for row in rows:  # what tells the trials apart, for the tables
        row["varying"] = [o for o in row["overrides"] if o not in common] if len(rows) > 1 else row["overrides"]
    metric_names = [optimized_metric] + sorted({k for r in rows for k in r["metrics"]} - {optimized_metric})
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["rank", "trial", "status", "overrides", *metric_names, "error"])
    for rank, row in enumerate(rows, 1):
        writer.writerow([rank, row["trial"], row["status"], " ".join(row["overrides"]),
                         *[row["metrics"].get(m, "") for m in metric_names], row["error"]])
    atomic_write_text(sweep_dir / SUMMARY_CSV, table.getvalue(), "the sweep summary (summary.csv)")
    atomic_write_text(sweep_dir / SUMMARY_MD, _markdown(rows, metric_names, optimized_metric, direction),
                      "the sweep summary (summary.md)")
    return rows


def best_trial(rows: list[dict], optimized_metric: str) -> dict | None:
    """The first row of summarize_sweep's order if it finished with a finite optimized metric (a trial of
    the best configuration); None for a seeds-only sweep, which has nothing to rank."""
    if rows and rows[0].get("seeds_only"):
        return None
    if rows and rows[0]["status"] == "ok":
        value = rows[0]["metrics"].get(optimized_metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return rows[0]
    return None


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else ("" if value is None else str(value))


class ShortNumbers(logging.Filter):
    """Hydra's own launcher lines (`#1 : seed=0 optim.lr=0.00030000000000000003`) with each `key=float`
    at 3 significant digits, as in the sweep table (conf/hydra/hydra_logging/rlx.yaml); the trials
    themselves get the exact values."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "=" in message:
            words = [min(word, short_override(word), key=len) for word in message.split(" ")]  # 1e-4 stays 1e-4
            record.msg, record.args = " ".join(words), None
        return True


def spread(values: list[float]) -> str:
    """`mean ± std (n)` of a configuration's seeds."""
    if not values:
        return ""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {std:.4f} ({len(values)})"


def failed_trials(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] != "ok"]


def _markdown(rows: list[dict], metric_names: list[str], optimized_metric: str, direction: str) -> str:
    failed = sum(r["status"] != "ok" for r in rows)
    lines = [f"# Sweep summary: {len(rows)} trials, {len(rows) - failed} finished, {failed} failed or incomplete", ""]
    common = [o for o in rows[0]["overrides"] if o not in rows[0]["varying"]] if rows else []
    if common:
        lines += [f"Overrides shared by every trial: `{' '.join(common)}`", ""]
    best = best_trial(rows, optimized_metric)
    if rows and rows[0].get("seeds_only"):
        lines += [f"Seeds only (one configuration, not ranked): {optimized_metric} mean ± std (seeds) = "
                  f"{spread(rows[0]['config_values'])}", ""]
    elif best is not None:
        repeated = len(best["config_values"]) > 1
        lines += [f"Best trial: {best['trial']} ({optimized_metric} = {_fmt(best['metrics'][optimized_metric])}, "
                  f"{direction}d) with `{' '.join(short_override(o) for o in best['varying'])}`"
                  + (f"; its configuration over seeds: {spread(best['config_values'])}" if repeated else ""), ""]
    lines.append("| rank | trial | status | overrides (varying) | " + " | ".join(metric_names)
                 + f" | {optimized_metric} over seeds |")
    lines.append("|---" * (5 + len(metric_names)) + "|")
    for rank, row in enumerate(rows, 1):
        status = row["status"] if row["status"] == "ok" else f"{row['status']}: {row['error'][:80]}"
        cells = [str(rank), row["trial"], status.replace("|", "/"),
                 f"`{' '.join(short_override(o) for o in row['varying'])}`"]
        cells += [_fmt(row["metrics"].get(m)) for m in metric_names] + [spread(row["config_values"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def print_summary(rows: list[dict], optimized_metric: str, sweep_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sweep {sweep_dir} (sorted by {optimized_metric})")
    extra = sorted({k for r in rows for k in r["metrics"] if k.startswith("eval/")} - {optimized_metric})[:2]
    for column in ("trial", "status", "overrides", optimized_metric, *extra):
        table.add_column(column, overflow="fold", min_width=24 if column == "overrides" else None)
    for row in rows:
        status = row["status"] if row["status"] == "ok" else f"[red]{row['status']}[/red]"
        table.add_row(row["trial"], status, " ".join(short_override(o) for o in row["varying"]),
                      *[_fmt(row["metrics"].get(m)) for m in (optimized_metric, *extra)])
    console = Console(stderr=True)
    if not console.is_terminal:  # logs and CI: a wider table instead of rich's 80-column default
        console.width = 160
    console.print(table)


class SweepSummary(Callback):
    """Hydra callback: after a multirun, write summary.csv / summary.md into the sweep directory and
    print the table (conf/train.yaml: hydra.callbacks.sweep_summary)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            log.warning("sweep directory %s not found; no summary written", sweep_dir)
            return
        metric = optimized_metric(config.get("optimized_metric", "auto"), config.algorithm.family,
                                  config.get("data", {}).get("source"))
        try:
            rows = summarize_sweep(sweep_dir, metric, sweep_direction(config.hydra))
        except StorageError as exc:  # one line (exit 3), not Hydra's traceback; the trials' own records stand
            exc.survived = f"every trial keeps its {RESULT_FILE} or {FAILURE_FILE}"
            fail(str(exc), code=3)
        print_summary(rows, metric, sweep_dir)
        best = best_trial(rows, metric)
        if rows and rows[0].get("seeds_only"):
            log.info("seeds only: %s = %s", metric, spread(rows[0]["config_values"]))
        elif best is not None:
            log.info("best trial %s: %s = %.4f with %s", best["trial"], metric, best["metrics"][metric],
                     " ".join(short_override(o) for o in best["varying"]))
        log.info("done: %s  summary: %s", sweep_dir, sweep_dir / SUMMARY_MD)
        FAILED_TRIALS[:] = [f"{r['trial']} ({' '.join(short_override(o) for o in r['varying'])})"
                            for r in failed_trials(rows)]
        TRIAL_COUNT[:] = [len(rows)]


