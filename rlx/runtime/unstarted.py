"""A command rejected before its work starts leaves no directory behind.

Hydra creates the run (or evaluation) directory and its log file before rlx sees the config, and rlx writes
config.yaml / overrides.yaml / env.json before it loads data and model; a mistake found then (`rlx train
steps=-3`, a data file that does not exist, a model folder without a tokenizer) used to leave a directory
that `rlx report` and `resume=auto` later stumbled over. `discard_unstarted` removes only the files a start
writes, and only when nothing else is there: a directory holding metrics, checkpoints, results or any file
rlx did not write at start-up is kept whole (nothing the user could want is deleted).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

# what a command writes before its first step or its first result: Hydra's folder and log, the run files,
# the lock, the prompt-length counts, the data files rlx.fit(dataset=...) hands over
STARTUP_FILES = frozenset({".hydra", "train.log", "eval.log", "config.yaml", "overrides.yaml", "env.json", ".lock",
                           "prompt_length.json", "dataset"})


def discard_unstarted(run_dir: Path) -> bool:
    """Delete `run_dir` when it holds nothing but STARTUP_FILES; True when it was deleted."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return False
    entries = list(run_dir.iterdir())
    if any(entry.name not in STARTUP_FILES for entry in entries):
        return False
    _detach_log_files(run_dir)
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    run_dir.rmdir()
    return True


def _detach_log_files(run_dir: Path) -> None:
    """Close and remove every logging FileHandler writing inside `run_dir` (Hydra's train.log / eval.log on the
    root logger): a handler left behind would reopen the deleted file on the process's next log line (an
    `rlx.fit` that failed, then another call in the same Python process) and fail there."""
    root = run_dir.resolve()
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict))]
    for logger in loggers:
        for handler in list(getattr(logger, "handlers", [])):
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).resolve().is_relative_to(root):
                logger.removeHandler(handler)
                handler.close()
