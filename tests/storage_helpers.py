"""Real storage faults for tests (issue 31): a small tmpfs filled to the last byte (ENOSPC) or remounted
read-only (EROFS), a folder made read-only by chmod with the test thread's CAP_DAC_OVERRIDE dropped, so that
root meets EACCES like any user, and, where no file system here can produce it, EDQUOT injected into Python's
file calls. Mounting needs root (CAP_SYS_ADMIN): `Disk.mount` skips the test where it is not allowed."""

from __future__ import annotations

import builtins
import ctypes
import errno
import io
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

FAULTS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES")


class Disk:
    """A tmpfs of `size_mb` mounted at `path` for one test; `unmount` (lazy when busy) on every exit path."""

    def __init__(self, path: Path, size_mb: int):
        self.path, self.size_mb = Path(path), size_mb

    def mount(self) -> Disk:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): storage faults need "
                        "root")
        return self

    def unmount(self) -> None:
        self.writable()
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def remount(self, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(self.path)], check=True, capture_output=True)

    def read_only(self) -> None:
        self.remount("ro")

    def writable(self) -> None:
        self.remount("rw")

    def fill(self) -> None:
        """Take every free byte (the filler grows until the kernel refuses it)."""
        chunk = bytes(1 << 16)
        with open(self.path / ".filler", "ab", buffering=0) as handle:
            for size in (1 << 16, 4096, 512, 1):
                try:
                    while True:
                        handle.write(chunk[:size])
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc

    def unfill(self) -> None:
        (self.path / ".filler").unlink(missing_ok=True)

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize


# ---- EACCES as root: chmod, and the thread's CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH dropped ----

class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAP_V3 = 0x20080522
_DAC_BITS = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


@contextmanager
def without_dac_override():
    """This thread obeys file permission bits (root otherwise ignores them); restored on exit. The effective
    set only: the permitted set keeps the capabilities, so they can be raised again."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        pytest.skip("capget failed: cannot drop CAP_DAC_OVERRIDE here")
    saved = data[0].effective
    data[0].effective = saved & ~_DAC_BITS
    if libc.capset(ctypes.byref(header), data) != 0:
        pytest.skip("capset failed: cannot drop CAP_DAC_OVERRIDE here")
    try:
        yield
    finally:
        data[0].effective = saved
        assert libc.capset(ctypes.byref(header), data) == 0, "could not restore CAP_DAC_OVERRIDE"


def _chmod_tree(folder: Path, writable: bool) -> None:
    for path in [folder, *folder.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


@contextmanager
def read_only_tree(folder: Path):
    """Every file and folder under `folder` without write permission, for this thread (see without_dac_override)."""
    _chmod_tree(folder, writable=False)
    try:
        with without_dac_override():
            yield
    finally:
        _chmod_tree(folder, writable=True)


# ---- EDQUOT: injected (tmpfs here has no quota support) ----

@contextmanager
def quota_exceeded(monkeypatch, folder: Path):
    """Creating, opening for writing, renaming into or making a folder under `folder` fails with EDQUOT, as on
    a file system whose quota is used up. Python-level calls only: a library writing from C (torch.save) meets
    it when it creates its folder or file through Python first."""
    root = str(Path(folder).absolute())

    def under(path) -> bool:
        try:
            return os.path.abspath(os.fsdecode(path)).startswith(root)
        except TypeError:  # a file descriptor
            return False

    def refuse(path):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), os.fsdecode(path))

    real_open, real_os_open, real_mkdir, real_replace = io.open, os.open, os.mkdir, os.replace

    def fake_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and under(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and under(path):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if under(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def fake_replace(src, dst, *args, **kwargs):
        if under(dst):
            refuse(dst)
        return real_replace(src, dst, *args, **kwargs)

    with monkeypatch.context() as patch:
        for target in (builtins, io):
            patch.setattr(target, "open", fake_open)
        patch.setattr(os, "open", fake_os_open)
        patch.setattr(os, "mkdir", fake_mkdir)
        patch.setattr(os, "replace", fake_replace)
        yield


@contextmanager
def storage_fault(kind: str, disk: Disk, folder: Path, monkeypatch):
    """The fault `kind` (FAULTS) on `folder` (on `disk`) while the block runs; undone on exit."""
    if kind == "ENOSPC":
        disk.fill()
        try:
            yield
        finally:
            disk.unfill()
    elif kind == "EROFS":
        disk.read_only()
        try:
            yield
        finally:
            disk.writable()
    elif kind == "EACCES":
        with read_only_tree(folder):
            yield
    elif kind == "EDQUOT":
        with quota_exceeded(monkeypatch, folder):
            yield
    else:
        raise ValueError(kind)
