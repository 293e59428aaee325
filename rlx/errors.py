"""The error types every module raises, in one leaf module (it imports nothing from rlx).

Each maps to one `error:` line and an exit code at the command line (rlx/cli/train.py `known`):
    0    the run finished (or had nothing left to do)
    1    a fault met while running: RewardError, NonFiniteError, CheckpointDamaged, EpisodesFailed, a worker that died
    2    the user's command or config: UserError, RunInUse
    3    storage: StorageError (a full disk, a quota, a read-only file system, a permission or device error)
    130  stopped by Ctrl-C / SIGTERM after writing a checkpoint (TrainingInterrupted)
"""

from __future__ import annotations

import sys
from pathlib import Path

_progress = {"step": None}  # the training step in progress, for messages about a failure inside it


def set_current_step(step: int | None) -> None:
    _progress["step"] = step


def current_step() -> int | None:
    """The training step in progress in this process (None before a loop restored its checkpoint)."""
    return _progress["step"]


class UserError(Exception):
    """A mistake in the user's command or config: printed as one line, exit code 2."""


def fail(message: str, code: int = 2) -> None:
    """Print `error: message` to stderr and exit (no traceback)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


class RunInUse(Exception):
    """Another live process holds the run directory's lock."""


class EnvError(ValueError):
    """The env config names no loadable environment (one line for the user)."""


class RewardError(Exception):
    """A reward function failed or returned something that is not one score (float or None) per completion."""


class NonFiniteError(Exception):
    """NaN or inf in the loss, a gradient norm or the weights: the run stops before the optimizer step."""

    def __init__(self, what: str, value: float | None = None):
        step = current_step()
        at = f" at step {step}" if step is not None else ""
        shown = f" ({value})" if value is not None else ""
        super().__init__(
            f"{what} is not finite{shown}{at}; stopped before the optimizer step, no checkpoint holds it. "
            f"Usual causes: a learning rate too high (optim.lr), no gradient clipping (optim.max_grad_norm), "
            f"a reward returning NaN/inf, or fp16 overflow (hardware.mixed_precision=bf16 or no)")
        self.what, self.value, self.step = what, value, step


class StorageError(Exception):
    """A write met a full disk (ENOSPC), a quota (EDQUOT), a read-only file system (EROFS), a permission error
    (EACCES, EPERM) or a failing device (EIO): exit code 3. Raised by rlx/runtime/storage.py `writing`, which
    fills in what was being written and where; the command-line front adds what survived (`survived`) and the
    command that continues (`command`). str() is one line."""

    def __init__(self, code: int, path, what: str, reason: str, advice: str, done: str = ""):
        super().__init__(code, str(path), what)
        self.errno, self.path, self.what, self.reason, self.advice, self.done = (
            code, str(path), what, reason, advice, done)
        self.survived = ""  # e.g. "earlier checkpoints are intact: resume continues from step 40 (...)"
        self.command = ""  # e.g. "rlx train resume=<run>"

    def __str__(self) -> str:
        parts = [f"{self.reason} while writing {self.what} to {self.path}" + (f" ({self.done})" if self.done else "")]
        if self.survived:
            parts.append(self.survived)
        parts.append(self.advice + (f", then run: {self.command}" if self.command else ""))
        return "; ".join(parts)


CheckpointWriteError = StorageError  # its name before issue 31 (a failed checkpoint write is a storage fault)


class EpisodesFailed(Exception):
    """Every episode of `env.stop_after_failed_steps` consecutive training steps ended in an environment error:
    nothing is left to learn from (exit code 1). The front adds `survived` and `command` as for StorageError."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message, self.survived, self.command = message, "", ""

    def __str__(self) -> str:
        tail = "; ".join(p for p in (self.survived, f"then run: {self.command}" if self.command else "") if p)
        return self.message + (f"; {tail}" if tail else "")


class CheckpointDamaged(Exception):
    """A checkpoint folder whose files do not match their recorded checksums, or do not load."""


class TrainingInterrupted(Exception):
    """Raised after the checkpoint written on Ctrl-C / SIGTERM; carries the step it stopped at."""

    def __init__(self, step: int, path: Path):
        super().__init__(f"interrupted after step {step}; checkpoint {path}")
        self.step, self.path = step, path


class RolloutServerError(Exception):
    """The rollout server died, hung past its timeouts or answered garbage. `resumable`: the run can continue
    from its last checkpoint (the loop raises before the step's checkpoint, so the last one written is intact)."""

    def __init__(self, message: str, resumable: bool = True):
        super().__init__(message)
        self.resumable = resumable

    def for_run(self, run_dir) -> str:
        """The one line `rlx train` prints: the cause, and the command that continues the run."""
        if not self.resumable:
            return str(self)
        return f"{self}; the last checkpoint is intact, continue with: rlx train resume={run_dir}"


class NoServerAtVersion(RolloutServerError):
    """No live server holds the weight version a request must be drawn with (rollout.server.overlap_steps: the
    other servers already moved on to the next step's version). Here, with the leaves, because a producer catches
    it (to reclaim the servers) and producers do not import the fleet that raises it."""
