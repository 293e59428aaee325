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


def plot_run(run_dir: Path, keys: tuple[str, ...] = ("reward/total", "eval/accuracy")) -> Path | None:
    """PNG of training reward and held-out accuracy over steps."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for key in keys:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if len(points) < 20 else None, label=key)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(run_dir.name, fontsize=9)
    out = run_dir / "plots" / "reward.png"
    out.parent.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
