"""The run directory: config, overrides, metrics.jsonl, samples, plots, and terminal feedback.

    <run>/config.yaml  overrides.yaml  metrics.jsonl  train.log  samples/step_000050.jsonl
    <run>/final/ (save_pretrained format)  plots/reward.png
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import socket
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from rlx.errors import RunInUse
from rlx.runtime.storage import writing

log = logging.getLogger("rlx")


def _jsonable(value):
    # NaN and inf stay what they are (json writes NaN / Infinity, which json.loads reads back): a
    # non-finite metric must stay visible; null means "not applicable"
    if hasattr(value, "item"):
        value = value.item()
    return value


def _shown(value, fmt: str) -> str:
    value = _jsonable(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt.format(value) if math.isfinite(value) else str(value)
    return str(value)


def atomic_write_text(path: Path, text: str, what: str | None = None) -> None:
    """Replace `path` with `text` so that a crash leaves either the old or the new file, never half of one.
    A storage fault is a StorageError about `what` (default: the file's name)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with writing(path, what or path.name, partial=tmp):
        with tmp.open("w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)


def append_text(path: Path, text: str, what: str) -> None:
    """Append `text` (whole lines) to `path`; a fault part-way cuts the file back to where it ended, so no half
    line is left for the next append to run into. A storage fault is a StorageError about `what`."""
    path = Path(path)
    with writing(path, what):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            left = memoryview(text.encode())
            try:
                while left:  # a nearly full disk takes part of a write, then refuses the rest
                    left = left[os.write(fd, left):]
            except OSError:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass  # then readers drop the cut-short last line (read_metrics, rlx eval's read_records)
                raise
        finally:
            os.close(fd)


def write_run_files(run_dir: Path, cfg, overrides: list[str]) -> None:
    with writing(run_dir, "the run directory"):
        run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True), "the run's settings (config.yaml)")
    atomic_write_text(run_dir / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(overrides))),
                      "the run's overrides (overrides.yaml)")


RESUMES_FILE = "resumes.jsonl"


def record_resume(run_dir: Path, old_config: dict, new_config: dict, checkpoint_step: int,
                  overrides: list[str]) -> dict:
    """Append to <run>/resumes.jsonl which settings this resume changed and the step they apply from."""
    old_flat, new_flat = flatten_settings(old_config), flatten_settings(new_config)
    changed = {key: [old_flat.get(key), new_flat.get(key)] for key in sorted(set(old_flat) | set(new_flat))
               if old_flat.get(key) != new_flat.get(key) and key not in ("resume",)}
    record = {"time": round(time.time(), 3), "checkpoint_step": checkpoint_step, "from_step": checkpoint_step + 1,
              "changed": changed, "overrides": list(overrides)}
    append_text(Path(run_dir) / RESUMES_FILE, json.dumps(record, default=str) + "\n", "the record of this resume")
    if changed:
        log.info("resume changes from step %d: %s", checkpoint_step + 1,
                 ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in changed.items()))
    return record


def flatten_settings(node, prefix: str = "") -> dict:
    """{'a.b': 1} from {'a': {'b': 1}}; lists stay values (a resume's changes, rlx view's config diff)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(flatten_settings(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


LOCK_FILE = ".lock"


class RunLock:
    """An exclusive lock on a run directory for the whole life of the run (flock on <run>/.lock).

    The kernel drops an flock when its process dies, so a lock file left by a killed run is simply
    taken over; the file's text (pid, host, time) only names the holder in the refusal."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd = None

    def acquire(self, record: bool = True) -> RunLock:
        with writing(self.path, "the run's lock file"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunInUse(f"run {self.path.parent} is in use by {holder}; wait for it to finish or stop it "
                           f"(a second process would write every metrics row twice)") from None
        if record:
            try:
                with writing(self.path, "the run's lock file"):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def check_run_free(run_dir: Path) -> None:
    """Raise RunInUse when a live process holds the run's lock (without keeping the lock)."""
    if (Path(run_dir) / LOCK_FILE).exists():
        RunLock(run_dir).acquire(record=False).release()


NO_SIGNAL_STEPS = 5  # consecutive steps with every group tied before the no-signal warning
ENTROPY_FLOOR = 0.01  # nats per token; below it for NO_SIGNAL_STEPS steps the policy has collapsed


class SignalWatch:
    """Says once, with the likely cause, when training has stopped learning anything:
    every group tied for NO_SIGNAL_STEPS steps in a row (zero advantage everywhere), or the policy's
    token entropy below ENTROPY_FLOOR for as long (it samples one answer only)."""

    CHECKS = {
        "no_signal": (lambda m: _finite(m.get("train/frac_zero_std_groups")) and m["train/frac_zero_std_groups"] >= 1.0,
                      "every group of the last {n} steps had identical rewards, so every advantage is 0 and nothing is "
                      "learned; likely causes: rollout.temperature too low (identical samples), a task far too hard or "
                      "too easy for the model, or a reward that ignores the completion (see samples/)"),
        "entropy_collapse": (lambda m: _finite(m.get("train/entropy")) and m["train/entropy"] < ENTROPY_FLOOR,
                             "the policy's token entropy stayed below {floor} for {n} steps: it has collapsed onto one "
                             "answer; likely causes: a learning rate too high (optim.lr), no KL or entropy term "
                             "(algorithm.kl_coef, algorithm.entropy_coef), or a reward that is easy to hack"),
    }

    def __init__(self, patience: int = NO_SIGNAL_STEPS):
        self.patience = patience
        self.streak = dict.fromkeys(self.CHECKS, 0)
        self.warned: set[str] = set()

    def observe(self, step: int, metrics: dict) -> list[str]:
        said = []
        for name, (hit, message) in self.CHECKS.items():
            self.streak[name] = self.streak[name] + 1 if hit(metrics) else 0
            if self.streak[name] >= self.patience and name not in self.warned:
                self.warned.add(name)
                said.append(message.format(n=self.patience, floor=ENTROPY_FLOOR))
                log.warning("step %d: %s", step, said[-1])
        return said


def _finite(value) -> bool:
    value = _jsonable(value)
    return isinstance(value, (int, float)) and math.isfinite(value)


class _AboveBar:
    """A stream for logging handlers while a bar is live: each complete line goes through the bar's
    console, which prints it above the bar, unwrapped (the terminal wraps it, so paths stay whole)."""

    def __init__(self, console):
        self.console, self._pending = console, ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self.console.print(line, soft_wrap=True, markup=False, highlight=False, emoji=False)
        return len(text)

    def flush(self) -> None:
        pass


def start_bar(bar) -> list:
    """Start a rich Progress bar with log lines printed above it, not through it: logging handlers
    writing to the terminal (stdout or stderr) write through the bar's console until stop_bar.
    Returns what stop_bar restores."""
    terminal = {id(sys.stdout), id(sys.stderr), id(sys.__stdout__), id(sys.__stderr__)}
    bar.start()
    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    swapped = []
    for handler in {h for logger in loggers for h in logger.handlers}:
        if type(handler) is logging.StreamHandler and id(handler.stream) in terminal:
            swapped.append((handler, handler.stream))
            handler.setStream(_AboveBar(bar.console))
    return swapped


def stop_bar(bar, swapped: list) -> None:
    """Stop a bar started by start_bar and give the logging handlers their own streams back."""
    for handler, stream in swapped:
        handler.setStream(stream)
    bar.stop()


class PhaseProgress:
    """A rich bar for one long phase before or outside the training steps (reference log-probs, data
    building) on a terminal; nothing otherwise (the phase's log line reports its duration)."""

    def __init__(self, description: str, total: int, progress: str | bool = "auto", enabled: bool = True,
                 console=None):
        show = sys.stderr.isatty() if progress == "auto" else bool(progress)
        self._bar = None
        if enabled and show and total > 0:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn(f"[bold]{description}"), MofNCompleteColumn(), BarColumn(),
                                 TimeRemainingColumn(), transient=True, console=console)
            self._task = self._bar.add_task(description, total=total)

    def __enter__(self) -> PhaseProgress:
        if self._bar is not None:
            self._swapped = start_bar(self._bar)
        return self

    def advance(self, amount: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, amount)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            stop_bar(self._bar, self._swapped)


# (metric, label, format) of a progress line, in order: single-turn rows show reward and accuracy, agent rows
# (the episode producer's env/ metrics, the held-out eval/success) show success and return
PROGRESS_FIELDS = (
    ("reward/total", "reward", "{:.3f}"), ("eval/accuracy", "eval acc", "{:.3f}"),
    ("eval/success", "eval success", "{:.3f}"),
    ("reward/accuracy", "acc", "{:.3f}"), ("env/success", "success", "{:.3f}"), ("env/return", "return", "{:.3f}"),
    ("train/loss", "loss", "{:.4f}"), ("perf/tokens_per_s", "tok/s", "{:.0f}"),
)


class MetricsLog:
    """Appends one JSON object per logged step to metrics.jsonl and shows progress on the terminal."""

    def __init__(self, run_dir: Path, total_steps: int, progress: str | bool = "auto", enabled: bool = True,
                 tracker=None):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        # an object with .log(values, step=): the Accelerator's trackers (rlx/runtime/tracking.py)
        self.tracker = tracker
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
            self._swapped = start_bar(self._bar)
        self._last_print = 0.0
        self.watch = SignalWatch()

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": round(time.time(), 3)}
        row.update({k: _jsonable(v) for k, v in sorted(metrics.items())})
        append_text(self.path, json.dumps(row) + "\n", f"the metrics row of step {step}")
        if self.tracker is not None:
            numbers = {k: v for k, v in row.items() if k not in ("step", "time") and isinstance(v, (int, float))}
            self.tracker.log(numbers, step=step)

    def show(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        parts = []
        for key, label, fmt in PROGRESS_FIELDS:
            if metrics.get(key) is not None:
                parts.append(f"{label} {_shown(metrics[key], fmt)}")
        status = "  ".join(parts)
        self.watch.observe(step, metrics)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)
        elif not status:  # nothing to show (a step 0 without a start evaluation): no empty `step 0/N` line
            return
        elif (step in (0, self.total) or step % max(1, self.total // 20) == 0
              or any(k.startswith("eval/") for k in metrics)):
            log.info("step %d/%d  %s", step, self.total, status)

    def close(self) -> None:
        if self._bar is not None:
            stop_bar(self._bar, self._swapped)
            self._bar = None


def write_samples(run_dir: Path, step: int, records: list[dict]) -> None:
    """samples/step_XXXXXX.jsonl; optional: a storage fault is a warning (once) and the run goes on."""
    path = run_dir / "samples" / f"step_{step:06d}.jsonl"
    with writing(path, f"the samples of step {step}", partial=path, optional="samples"):
        path.parent.mkdir(exist_ok=True)
        with path.open("w") as handle:
            for record in records:
                handle.write(json.dumps(record, default=str) + "\n")


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics.jsonl. A last line cut short (a crash or a full disk mid-append) is left out;
    a damaged line anywhere else is an error naming the file and line."""
    rows = []
    if path.is_file():
        lines = path.read_text(errors="replace").split("\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                if number >= len(lines) - 1 and not any(rest.strip() for rest in lines[number:]):
                    log.warning("%s: line %d is cut short (the run stopped while writing it); left out", path, number)
                    break
                raise ValueError(f"{path}: line {number} column {exc.colno} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {number} is not a JSON object")
            rows.append(row)
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


def integer_step_ticks(ax, steps) -> None:
    """Whole-number step ticks on x; when all points sit within one step (a 1-step run), ticks at those
    steps instead of matplotlib's fractions (MaxNLocator alone falls back to them)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    steps = sorted(set(steps))
    if steps and steps[-1] - steps[0] < 2:
        ax.set_xticks(steps)


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
                ax.plot(xs, ys, marker="o" if len(points) < 20 else None, markersize=3,
                        label=SERIES_LABELS.get(key, key))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("step")
        integer_step_ticks(ax, [x for points in series.values() for x, _ in points])
        ax.grid(alpha=0.3)
        if len(series) > 1 or "reward/total" in series and len(series["reward/total"]) >= 10:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(run_dir.name, fontsize=9)
    out = run_dir / "plots" / "reward.png"
    fig.tight_layout()
    try:
        with writing(out, "the run's plot", partial=out, optional="plots"):  # optional: the metrics hold the data
            out.parent.mkdir(exist_ok=True)
            fig.savefig(out, dpi=100)
            return out
    finally:
        plt.close(fig)
    return None
