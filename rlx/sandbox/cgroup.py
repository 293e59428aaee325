"""Per-run cgroup: one bound on the memory and the processes of the whole run."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import warnings
from pathlib import Path


class Cgroup:
    """A control group made for one run: memory limit (all processes and their tmpfs files
    together; the kernel's OOM killer acts inside the group only) and process limit (pids.max,
    threads count too).  The launcher moves itself in before it forks, so everything the sample
    starts is inside, also what leaves the session; `kill` ends them all.

    Where: cgroup v2 (memory.max, pids.max, cgroup.kill) below the caller's own cgroup, whose
    cgroup.subtree_control must offer "memory pids" (a systemd unit with Delegate=yes, or a
    container's root), or below RLX_SANDBOX_CGROUP (a directory of a delegated v2 tree); else
    cgroup v1 (memory.limit_in_bytes, pids.max) below the caller's memory and pids groups, as
    root.  Neither writable (an unprivileged caller without delegation, a read-only /sys): the
    run goes on with per-process rlimits only, a warning says so once per process, and
    "cgroup" is missing from SandboxResult.isolation."""

    unavailable = ""  # why no backend works here ("" until one was tried)
    _backend = None  # (name, [parent dirs]) once found; False when none works
    _lock = threading.Lock()
    _serial = 0

    def __init__(self, kind: str, dirs: list[str], memory_bytes: int):
        self.kind, self.dirs, self.memory_bytes = kind, dirs, memory_bytes
        self.join_error = ""

    @classmethod
    def create(cls, memory_bytes: int, max_pids: int) -> Cgroup | None:
        with cls._lock:
            if cls._backend is None:
                cls._backend = cls._find_backend() or False
            if not cls._backend:
                return None
            cls._serial += 1
            name = f"rlx-sandbox-{os.getpid()}-{cls._serial}"
        kind, parents = cls._backend
        dirs = [os.path.join(parent, name) for parent in parents]
        made = []
        try:
            for directory in dirs:
                os.mkdir(directory, 0o755)
                made.append(directory)
            for key, value in _CGROUP_LIMITS[kind](memory_bytes, max_pids):
                for directory in dirs:
                    if os.path.exists(os.path.join(directory, key)):
                        Path(directory, key).write_text(str(value))
        except OSError as exc:
            for directory in reversed(made):
                _rmdir(directory)
            cls.unavailable = f"could not set up {dirs[0]}: {exc}"
            return None
        return cls(kind, dirs, memory_bytes)

    @classmethod
    def _find_backend(cls) -> tuple[str, list[str]] | None:
        reasons = []
        for kind, find in _CGROUP_BACKENDS.items():
            try:
                parents = find()
            except OSError as exc:
                reasons.append(f"{kind}: {exc}")
                continue
            if isinstance(parents, str):
                reasons.append(f"{kind}: {parents}")
                continue
            _remove_stale_groups(parents)
            return kind, parents
        cls.unavailable = "; ".join(reasons)
        return None

    def procs_files(self) -> list[str]:
        return [os.path.join(directory, "cgroup.procs") for directory in self.dirs]

    def pids(self) -> set[int]:
        found = set()
        for path in self.procs_files():
            try:
                found |= {int(line) for line in Path(path).read_text().split()}
            except OSError:
                pass
        return found

    def kill(self, settle_s: float = 1.0) -> bool:
        """SIGKILL everything in the group (cgroup.kill where the kernel has it, else pid by pid
        until empty: pids.max bounds what can appear meanwhile).  True once empty."""
        kill_file = os.path.join(self.dirs[0], "cgroup.kill")
        deadline = time.monotonic() + settle_s
        while pids := self.pids():
            if time.monotonic() > deadline:
                return False
            try:
                if os.path.exists(kill_file):
                    Path(kill_file).write_text("1")
                else:
                    for pid in pids:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            time.sleep(0.005)
        return True

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the group's memory limit."""
        for directory in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                try:
                    fields = dict(line.split() for line in Path(directory, name).read_text().splitlines())
                except (OSError, ValueError):
                    continue
                return int(fields.get("oom_kill", 0))
        return 0

    def remove(self) -> None:
        self.kill()
        for directory in self.dirs:
            _rmdir(directory)


def _rmdir(directory: str, tries: int = 50) -> None:
    """rmdir a cgroup; it fails while the last killed processes are still exiting."""
    for _ in range(tries):
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _remove_stale_groups(parents: list[str]) -> None:
    """Empty groups left by a caller that died before removing them (their pid is gone)."""
    for parent in parents:
        for entry in os.scandir(parent):
            parts = entry.name.split("-")
            if entry.name.startswith("rlx-sandbox-") and len(parts) == 4 and parts[2].isdigit():
                if not os.path.exists(f"/proc/{parts[2]}"):
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)


def _own_cgroups() -> dict[str, str]:
    """{controller or "" (v2): path} from /proc/self/cgroup."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount point, mount root, super options) of every cgroup mount."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, after = line.split(" - ", 1)
        fields, (fstype, _, options) = before.split(), after.split(" ", 2)
        if fstype in ("cgroup", "cgroup2"):
            mounts.append((fstype, fields[4], fields[3], set(options.split(","))))
    return mounts


def _below(mount_point: str, mount_root: str, path: str) -> str:
    relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
    return os.path.normpath(os.path.join(mount_point, relative))


def _find_cgroup2() -> list[str] | str:
    explicit = os.environ.get("RLX_SANDBOX_CGROUP")
    if explicit:
        parent = explicit
    else:
        own = _own_cgroups().get("")
        mounts = [m for m in _cgroup_mounts() if m[0] == "cgroup2"]
        if own is None or not mounts:
            return "no cgroup2 hierarchy"
        parent = _below(mounts[0][1], mounts[0][2], own)
    control = os.path.join(parent, "cgroup.subtree_control")
    enabled = set(Path(control).read_text().split())
    if not {"memory", "pids"} <= enabled:
        try:  # possible only for a group without processes of its own (or the root)
            Path(control).write_text("+memory +pids")
        except OSError as exc:
            return f"{parent} does not hand the memory and pids controllers to subgroups ({exc.strerror})"
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable"
    return [parent]


def _find_cgroup1() -> list[str] | str:
    own = _own_cgroups()
    parents = []
    for controller in ("memory", "pids"):
        mount = next((m for m in _cgroup_mounts() if m[0] == "cgroup" and controller in m[3]), None)
        if mount is None or controller not in own:
            return f"no {controller} controller"
        parent = _below(mount[1], mount[2], own[controller])
        if not os.access(parent, os.W_OK):
            return f"{parent} is not writable"
        parents.append(parent)
    return parents


# kind -> how to find the parent directories, and the limit files to write (in order)
_CGROUP_BACKENDS = {"cgroup2": _find_cgroup2, "cgroup1": _find_cgroup1}
_CGROUP_LIMITS = {
    "cgroup2": lambda memory, pids: [("memory.max", memory), ("memory.swap.max", 0), ("pids.max", pids)],
    "cgroup1": lambda memory, pids: [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory),
                                      ("pids.max", pids)],
}
_WARNED_NO_CGROUP = []


def warn_no_cgroup(reason: str) -> None:
    """Once per process: the run had no total bound, only per-process rlimits."""
    if not _WARNED_NO_CGROUP:
        _WARNED_NO_CGROUP.append(True)
        warnings.warn(
            "rlx sandbox: no per-run cgroup here"
            + (f" ({reason})" if reason else "")
            + "; memory and processes are bounded per process only (RLIMIT_AS x RLIMIT_NPROC), "
            "see rlx/sandbox/__init__.py", RuntimeWarning, stacklevel=3)
