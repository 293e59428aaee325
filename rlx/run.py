"""The run directory: config, overrides, metrics.jsonl, samples, plots, and terminal feedback.

    <run>/config.yaml  overrides.yaml  metrics.jsonl  train.log  samples/step_000050.jsonl
    <run>/final/ (save_pretrained format)  plots/reward.png
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

log = logging.getLogger("rlx")


def _jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_run_files(run_dir: Path, cfg, overrides: list[str]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))


class MetricsLog:
    """Appends one JSON object per logged step to metrics.jsonl and shows progress on the terminal."""

    def __init__(self, run_dir: Path, total_steps: int, progress: str | bool = "auto", enabled: bool = True,
                 tracker=None):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.tracker = tracker  # an object with .log(values, step=): the Accelerator's trackers (rlx/tracking.py)
        self.total = total_steps
        self._bar = None
        show_bar = sys.stderr.isatty() if progress == "auto" else bool(progress)
        if enabled and show_bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"), transient=False,
            )
            self._task = self._bar.add_task("train", total=total_steps, status="")
            self._bar.start()
        self._last_print = 0.0

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": round(time.time(), 3)}
        row.update({k: _jsonable(v) for k, v in sorted(metrics.items())})
        with self.path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        if self.tracker is not None:
            numbers = {k: v for k, v in row.items() if k not in ("step", "time") and isinstance(v, (int, float))}
            self.tracker.log(numbers, step=step)

    def show(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        parts = []
        for key, label, fmt in (
            ("reward/total", "reward", "{:.3f}"), ("eval/accuracy", "eval acc", "{:.3f}"),
            ("reward/accuracy", "acc", "{:.3f}"), ("train/loss", "loss", "{:.4f}"), ("perf/tokens_per_s", "tok/s", "{:.0f}"),
        ):
            if metrics.get(key) is not None:
                parts.append(f"{label} {fmt.format(_jsonable(metrics[key]))}")
        status = "  ".join(parts)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)
        elif step in (0, self.total) or step % max(1, self.total // 20) == 0 or any(k.startswith("eval/") for k in metrics):
            log.info("step %d/%d  %s", step, self.total, status)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def write_samples(run_dir: Path, step: int, records: list[dict]) -> None:
    folder = run_dir / "samples"
    folder.mkdir(exist_ok=True)
    with (folder / f"step_{step:06d}.jsonl").open("w") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")


def read_metrics(path: Path) -> list[dict]:
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


# (panel title, y label, metric keys in order of preference; the first present is drawn)
RUN_PANELS = (
    ("training reward", "reward (total)", ("reward/total",)),
    ("held-out accuracy", "accuracy (greedy)", ("eval/accuracy",)),
    ("KL to the reference", "KL (nats / token)", ("train/kl_ref", "train/approx_kl")),
    ("policy entropy", "entropy (nats / token)", ("train/entropy",)),
    ("response length", "tokens", ("completions/mean_length",)),
    ("clipped tokens", "fraction", ("train/clip_frac_low", "train/clip_frac_high")),
)


SERIES_LABELS = {"train/clip_frac_low": "ratio below 1 - clip_low", "train/clip_frac_high": "ratio above 1 + clip_high"}


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average: mean of the last `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_run(run_dir: Path) -> Path | None:
    """plots/reward.png: what to look at first when a run goes wrong, one panel each (only those with
    data): training reward (raw faint, moving average bold), held-out accuracy, KL to the reference,
    entropy, response length, clip fractions. Integer steps on x; the run's name as the title."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = []
    for title, ylabel, keys in RUN_PANELS:
        series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))] for k in keys}
        series = {k: v for k, v in series.items() if v}
        if title == "KL to the reference" and len(series) > 1:
            series = {keys[0]: series[keys[0]]}  # the penalised KL when there is one, else the policy-update KL
        if series:
            panels.append((title, ylabel, series))
    if not panels:
        return None
    columns = min(3, len(panels))
    rows_n = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows_n, columns, figsize=(4.6 * columns, 3.2 * rows_n), squeeze=False)
    for ax, (title, ylabel, series) in zip(axes.flat, panels):
        for key, points in series.items():
            xs, ys = zip(*points)
            if key == "reward/total" and len(ys) >= 10:
                window = max(5, len(ys) // 20)
                ax.plot(xs, ys, color="C0", alpha=0.25, linewidth=1, label="per step")
                ax.plot(xs, smooth(list(ys), window), color="C0", linewidth=2, label=f"moving average ({window} steps)")
            else:
                ax.plot(xs, ys, marker="o" if len(points) < 20 else None, markersize=3, label=SERIES_LABELS.get(key, key))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(series) > 1 or "reward/total" in series and len(series["reward/total"]) >= 10:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(run_dir.name, fontsize=9)
    out = run_dir / "plots" / "reward.png"
    out.parent.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
