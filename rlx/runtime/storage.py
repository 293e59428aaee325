"""Writes that meet a full disk, a quota, a read-only file system or a permission error (issue 31).

Every file rlx writes during a run goes through one context manager:

    with writing(run_dir / "metrics.jsonl", "the metrics row of step 12"):
        ...append the row...

A storage fault inside the block (ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EIO) becomes one StorageError (exit
code 3) naming the path, what was being written and the fix; `partial=` names the file or folder the block was
building, removed before the error goes up so that nothing half-written stays where a resume could take it,
and the space comes back. Any other exception passes through untouched (the partial is removed all the same).
`optional="samples"` marks a writer a week-long run can do without (samples, plots, caches, train.log): the
fault is a warning, given once per writer and process, and the run goes on. Which writer does what, and why:
docs/reliability-storage.md.

Libraries do not always raise an OSError: torch.save reports a full disk as `RuntimeError: [enforce fail at
inline_container.cc] unexpected pos`, safetensors as `SafetensorError: ... No space left on device (os error
28)`. The errno is then read from the message (the C library's strerror text), and failing that the folder is
probed while the partial write still holds its space: the read-only flag, then a 4 KiB probe file written and
fsynced.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from rlx.errors import StorageError

log = logging.getLogger("rlx")

# errno -> (what happened, what the user does about it); {folder}: the folder that could not be written
STORAGE_FAULTS = {
    errno.ENOSPC: ("no space left on the device", "free space on that disk (or move the run to a roomier one)"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota (or have it raised)"),
    errno.EROFS: ("the file system is read-only",
                  "make it writable again (or copy the run directory to a writable disk and resume the copy)"),
    errno.EACCES: ("permission denied", "give this user write access to {folder}"),
    errno.EPERM: ("operation not permitted", "give this user write access to {folder} (and lift any immutable flag)"),
    errno.EIO: ("input/output error: the disk or its network mount failed",
                "check the disk (dmesg) or the network mount"),
}
PROBE_BYTES = 4096
_WARNED: set[str] = set()  # optional writers already warned about in this process


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it was raised from or during, outermost first."""
    found = []
    while exc is not None and all(exc is not seen for seen in found):
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


def _may_hide_errno(exc: BaseException) -> bool:
    """Exceptions a library raises for a failed write without an errno (torch: RuntimeError, safetensors)."""
    return isinstance(exc, (OSError, RuntimeError)) or "Safetensor" in type(exc).__name__


def existing_folder(path) -> Path:
    """The folder a write to `path` lands in: path itself when it is a folder, else its nearest existing parent."""
    folder = Path(path).absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def probe(path) -> int | None:
    """The storage errno that a small write next to `path` meets now, or None when it succeeds."""
    folder = existing_folder(path)
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return errno.EROFS
    except OSError:
        pass
    name = folder / f".rlx-write-probe-{os.getpid()}"
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = memoryview(bytes(PROBE_BYTES))
            while left:  # a nearly full disk takes part of a write, then refuses the rest
                left = left[os.write(fd, left):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno if exc.errno in STORAGE_FAULTS else None
    finally:
        try:
            name.unlink(missing_ok=True)
        except OSError:
            pass
    return None


def storage_errno(exc: BaseException, path=None) -> int | None:
    """The storage errno behind a failed write to `path` (see STORAGE_FAULTS), or None when `exc` is not a
    storage fault: an OSError's errno in its chain, else the strerror text in a library's message, else
    (for exceptions a library raises instead of an OSError) a probe of the folder."""
    chain = _chain(exc)
    for item in chain:
        if isinstance(item, OSError) and item.errno in STORAGE_FAULTS:
            return item.errno
    text = " ".join(str(item) for item in chain)
    for code in STORAGE_FAULTS:
        if os.strerror(code) in text:
            return code
    if path is not None and any(_may_hide_errno(item) for item in chain):
        return probe(path)
    return None


def storage_fault(code: int, path, what: str, done: str = "") -> StorageError:
    """The StorageError of errno `code` met writing `what` to `path` (one line; see rlx.errors.StorageError)."""
    reason, advice = STORAGE_FAULTS[code]
    folder = existing_folder(Path(path).parent if not Path(path).is_dir() else path)
    return StorageError(code, path, what, f"{reason} ({errno.errorcode[code]})", advice.format(folder=folder), done)


def _remove(partial: Path) -> str:
    """Remove a half-written file or folder; says what became of it (for the error line)."""
    kind = "folder" if partial.is_dir() else "file"
    if not partial.exists():
        return ""
    try:
        if partial.is_dir():
            shutil.rmtree(partial)
        else:
            partial.unlink()
    except OSError as exc:
        return f"its partial {kind} {partial.name} could not be removed ({exc.strerror}); nothing reads it"
    return f"its partial {kind} was removed"


@contextmanager
def writing(path, what: str, *, partial=None, optional: str | None = None):
    """Run a write of `what` to `path`; a storage fault in it raises StorageError (or, for an `optional`
    writer, is warned about once and dropped). `partial`: the file or folder being built, removed when the
    block fails (any exception). See the module docstring."""
    try:
        yield
    except Exception as exc:
        code = storage_errno(exc, partial if partial is not None else path)  # before the partial gives space back
        done = _remove(Path(partial)) if partial is not None else ""
        if code is None:
            raise
        fault = storage_fault(code, path, what, done)
        if optional is None:
            raise fault from exc
        if optional not in _WARNED:
            _WARNED.add(optional)
            log.warning("could not write %s: %s; the run goes on without %s (said once)", optional, fault, optional)


def check_writable(folder, what: str) -> None:
    """Raise StorageError when a small write into `folder` (or the nearest parent that exists) fails now:
    the check a command makes before it starts, so a full or read-only disk is one line, not a traceback
    from Hydra creating the run directory."""
    code = probe(folder)
    if code is not None:
        raise storage_fault(code, existing_folder(folder), what)


def guard_log_files() -> None:
    """Log files (Hydra's train.log): a storage fault while writing a line is said once on stderr, and the
    console keeps every line, instead of a `--- Logging error ---` traceback for each line logged."""
    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    for handler in {h for logger in loggers for h in logger.handlers}:
        if isinstance(handler, logging.FileHandler) and not getattr(handler, "rlx_guarded", False):
            handler.handleError = _guarded_handle_error(handler, handler.handleError)
            handler.rlx_guarded = True


def _guarded_handle_error(handler: logging.FileHandler, original):
    def handle_error(record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        code = storage_errno(exc, handler.baseFilename) if exc is not None else None
        if code is None:
            return original(record)
        fault = storage_fault(code, handler.baseFilename, "a log line")
        print(f"warning: could not write {Path(handler.baseFilename).name}: {fault}; log lines go to the console "
              "only from here on", file=sys.stderr)
        handler.emit = lambda record: None  # the file is given up: no failing write per line, none at exit
        stream, handler.stream = handler.stream, None
        try:
            if stream is not None:
                stream.close()  # the fd is closed even when flushing what it buffered fails
        except (OSError, ValueError):
            pass
        return None

    return handle_error
