"""The progress of an evaluation pass (rlx eval): a rich bar on a terminal, log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

from rlx.runtime.rundir import start_bar, stop_bar

log = logging.getLogger("rlx")


class EvalProgress:
    """Problems done, samples/s and the running metric: a rich bar on a terminal, log lines otherwise."""

    def __init__(self, label: str, total: int, done: int, enabled: str | bool, unit: str = "problems"):
        self.label, self.total, self.done, self.unit = label, total, done, unit
        self.samples, self.start = 0, time.monotonic()
        show = sys.stderr.isatty() if enabled == "auto" else bool(enabled)
        self._bar = None
        if show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), MofNCompleteColumn(), BarColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.fields[status]}"))
            self._task = self._bar.add_task(label, total=total, completed=done, status="")
            self._swapped = start_bar(self._bar)

    def update(self, problems: int, samples: int, metric_name: str, metric: float) -> None:
        self.done += problems
        self.samples += samples
        rate = self.samples / max(time.monotonic() - self.start, 1e-9)
        status = f"{rate:.1f} samples/s  {metric_name} {metric:.3f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, status=status)
        else:
            log.info("%s: %d/%d %s  %s", self.label, self.done, self.total, self.unit, status)

    def close(self) -> None:
        if self._bar is not None:
            stop_bar(self._bar, self._swapped)
            self._bar = None
