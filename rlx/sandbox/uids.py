"""Sample uids (root runner only): each run leases its own unprivileged uid, and every process of it is killed
after the run."""

from __future__ import annotations

import fcntl
import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

SANDBOX_UIDS = range(60000, 60256)
"""uids (and the gids of the same number) leased to samples when the runner is root.  Reserve
them for this purpose: after each run every process of the leased uid is killed."""


@dataclass
class Lease:
    uid: int
    lock_fd: int
    clean: bool = True  # False if processes of this uid may outlive the run


class UidPool:
    """Hands out sample uids, each to one run at a time: a set guards this process's threads,
    an exclusive flock on a per-uid file guards other processes (the kernel drops it if this
    process dies).  A uid is used only if it has no passwd entry and no task runs under it
    when first used, or again after a run whose sweep could not confirm it empty (killed
    processes stay zombies, still counted by RLIMIT_NPROC, until the host's init reaps them)."""

    def __init__(self, uids: range):
        self.uids = uids
        self.busy: set[int] = set()
        self.clean: set[int] = set()
        self.cond = threading.Condition()
        self.lock_dir = os.path.join(tempfile.gettempdir(), "rlx-sandbox-uid-locks")

    def acquire(self) -> Lease:
        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        with self.cond:
            while True:
                for uid in self.uids:
                    if uid in self.busy or not self._is_clean(uid):
                        continue
                    lock_fd = self._try_lock(uid)
                    if lock_fd is not None:
                        self.busy.add(uid)
                        return Lease(uid, lock_fd)
                self.cond.wait(timeout=0.1)

    def release(self, lease: Lease) -> None:
        os.close(lease.lock_fd)
        with self.cond:
            self.busy.discard(lease.uid)
            if not lease.clean:
                self.clean.discard(lease.uid)
            self.cond.notify()

    def _is_clean(self, uid: int) -> bool:
        if uid not in self.clean and not _has_passwd_entry(uid) and count_tasks(uid) == 0:
            self.clean.add(uid)
        return uid in self.clean

    def _try_lock(self, uid: int) -> int | None:
        fd = os.open(os.path.join(self.lock_dir, str(uid)), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd


UID_POOL = UidPool(SANDBOX_UIDS)


def _has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


# Runs as root, switches to the uid and kills all its processes.  kill(-1) signals every
# process the caller may signal except itself; for a non-root caller that is exactly the
# processes of its own uid.  Exit 0: something was killed, 3: nothing was there.
_KILL_ALL_OF_UID = """\
import os, signal, sys
uid = int(sys.argv[1])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
try:
    os.kill(-1, signal.SIGKILL)
except ProcessLookupError:
    sys.exit(3)
"""


def kill_all_of_uid(uid: int, settle_s: float = 0.25) -> bool:
    """SIGKILL every process of `uid`.  Returns True once no task of `uid` is left (waiting
    up to settle_s for the dead to be reaped), False if some remain."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _KILL_ALL_OF_UID, str(uid)],
        env={}, stdin=subprocess.DEVNULL, capture_output=True, check=False,
    )
    if done.returncode == 3:
        return True
    deadline = time.monotonic() + settle_s
    while count_tasks(uid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def count_tasks(uid: int) -> int:
    """Tasks (processes and threads) whose real uid is `uid`: what RLIMIT_NPROC counts."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total
