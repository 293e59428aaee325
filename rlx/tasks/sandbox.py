"""Run untrusted, model-written Python code: HumanEval checks and code-execution rewards.

Threat model
------------
The code comes from a policy under training.  It is not written by an attacker, but RL finds
whatever the reward allows, and sampled code is often plainly broken.  We defend against
*accidents and reward hacking*: infinite loops, fork bombs, allocating all memory, printing
gigabytes, writing or deleting files, opening sockets, killing the parent, leaving processes
behind.  We do NOT defend against a deliberate attacker with a kernel exploit: there is no
seccomp filter, the sample talks to the host kernel directly, and anything world-readable on
the host is readable.  For hostile code use a VM or gVisor.

How one sample runs
-------------------
``run_code`` writes the code to ``main.py`` in a fresh temporary directory and starts this very
file as a script (``python -I -S sandbox.py CONFIG``: the "launcher") in a new session with a
scrubbed environment (PATH, LANG, HOME=workdir; nothing inherited).  The launcher sets up the
isolation below, forks, and the child becomes the sample, ``python -I main.py`` under resource
limits; the launcher waits and passes the exit status on.  The caller's thread streams
stdout/stderr, keeping the first ``max_output_bytes`` of each and discarding the rest (the
sample is never blocked on a full pipe), SIGKILLs the whole process group at the wall-clock
deadline or once the launcher exits, and removes the directory.  In every mode a sample gets:

- rlimits: CPU seconds, address space (memory), file size, processes, open files, no core
  dumps;
- ``PR_SET_NO_NEW_PRIVS`` (setuid binaries cannot raise privileges) and a parent-death signal;
- its own session, killed as a whole when the run ends or times out;
- a parent inside the sandbox (launcher or namespace init), so ``os.kill(os.getppid(), 9)``
  cannot reach the caller.

Layers that depend on the machine (listed in ``SandboxResult.isolation``):

- ``"cgroup"``: a control group per run (cgroup v2, or v1 on a hybrid host; see ``_Cgroup``)
  that the launcher enters before it forks: the memory of all processes of the run and of their
  private tmpfs files together is bounded (``total_memory_mb``, default ``memory_mb``; the
  kernel's OOM killer acts inside the group and the result's stderr says so), so is the number
  of processes and threads (``max_processes`` + 2), and every process in it is killed at the end,
  also one that left the session.  Without a writable cgroup (non-root without delegation,
  read-only /sys) the run goes on without it and a RuntimeWarning says so once per process:
  memory is then bounded only per process, up to ``memory_mb`` x ``max_processes`` in total.

- ``"uid"`` (runner is root): the sample runs as an unprivileged uid/gid from ``SANDBOX_UIDS``
  (60000..60255; uids with a passwd entry or with running processes are skipped).  Each run
  leases its own uid, exclusively within the process (a pool) and across processes (an
  flock), so RLIMIT_NPROC, which root ignores and which counts per uid, bounds this sample
  alone.  When the pid namespace cannot vouch that nothing is left (a timeout, or no pid
  namespace), a helper switches to that uid and calls ``kill(-1, SIGKILL)``: it kills every
  process of the sample, also those that left its process group, and cannot hit another
  sample because no other run holds that uid.
- ``"userns"`` (runner is not root, unprivileged user namespaces usable): a user namespace in
  which the launcher may create the namespaces below; the sample keeps the caller's uid.
- ``"netns"``: an empty network namespace (loopback down): no connection at all, not even to
  127.0.0.1.  Without it a prelude makes ``socket.socket`` refuse internet sockets, reported
  as ``"socket-guard"``; this is best effort (``_socket``, ctypes or a subprocess get around it).
- ``"ipcns"``: System V IPC objects of the host are out of reach.
- ``"mountns"``, ``"readonly-fs"``, ``"private-tmp"``: a private mount namespace in which every
  host mount is re-marked read-only and nosuid (mount_setattr, Linux >= 5.12), and fresh
  size-limited tmpfs cover /tmp, /var/tmp, /dev/shm and the working directory (discarded with
  the namespace); /run/user is hidden.  When root's interpreter lies below a directory the
  sample uid cannot enter (pyenv under /root, mode 700), that directory is covered by an empty
  tmpfs and only the interpreter prefix (the directory above bin/) is bound back, read-only.
- ``"pidns"``, ``"private-proc"``: the sample runs under an init of its own pid namespace with
  its own /proc: it cannot see or signal host processes, and when it ends the kernel kills
  everything it started.

Guarantees
----------
Root with namespaces (CAP_SYS_ADMIN, Linux >= 5.12; our CI): the sample cannot create, change,
delete or chmod anything on the host, cannot reach the network, cannot see or signal host
processes, and leaves no process behind; memory, CPU time, processes, open files, file sizes,
its private disk and the captured output are bounded, memory and processes also in total for
the run (with a cgroup).  Root without namespaces (e.g. Docker's default
capabilities): the uid still protects root's files and other processes and the sweep still
removes strays, but world-writable places such as /tmp stay writable and the network is only
guarded by the prelude.  If root cannot switch to the sample uid, or that uid cannot execute
the interpreter, the run fails closed with status "sandbox_error": sample code never runs as
root.  Non-root with user namespaces: as root with namespaces, except that RLIMIT_NPROC also
counts the caller's own processes (we allow their current number + ``max_processes``).
Non-root without user namespaces: rlimits, session and socket guard only; the sample can then
change anything the caller can.

Not guaranteed: confidentiality of world-readable host files; isolation from host unix-domain
sockets the sample may connect to by file permissions; a bound on total disk use without a
mount namespace (only per file).  The sample runs the *base* interpreter (this interpreter with
symlinks resolved, so outside any virtualenv): it gets the standard library, not the project's
packages.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import pwd
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UIDS = range(60000, 60256)
"""uids (and the gids of the same number) leased to samples when the runner is root.  Reserve
them for this purpose: after each run every process of the leased uid is killed."""

STATUSES = ("passed", "failed", "timeout", "sandbox_error")

_LAUNCHER = os.path.abspath(__file__)
_MAIN = "main.py"
_STDIN = "stdin.txt"
_LAUNCH_FAILED = 126  # launcher exit code when setup failed (details go to the report pipe)


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    """True iff the program exited with code 0 before the deadline."""
    status: str
    """"passed"; "failed" (ran and exited non-zero or was killed by a signal/rlimit: exceptions,
    failed asserts, syntax errors, MemoryError); "timeout" (wall-clock deadline); or
    "sandbox_error" (the sandbox could not start the program; not the sample's fault)."""
    exit_code: int | None
    """Exit code; -N when killed by signal N; None on timeout or when it never started."""
    stdout: str
    """The first max_output_bytes of stdout, decoded as UTF-8 with replacement."""
    stderr: str
    """The first max_output_bytes of stderr (or the sandbox's own error message)."""
    duration_s: float
    """Wall-clock seconds from start to exit (includes ~50 ms of interpreter start-up)."""
    output_truncated: bool = False
    """True if stdout or stderr was longer than max_output_bytes."""
    isolation: tuple[str, ...] = ()
    """The isolation layers that were in place (see the module docstring)."""


# ============================================================================================
# Public API
# ============================================================================================


def run_code(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 64_000,
    *,
    stdin: str = "",
    max_processes: int = 64,
    max_file_bytes: int = 16 * 2**20,
    max_open_files: int = 256,
    total_memory_mb: int | None = None,
    namespaces: bool = True,
    cgroup: bool = True,
    interpreter: str | None = None,
) -> SandboxResult:
    """Run `code` as the main script of a fresh interpreter inside the sandbox.

    timeout_s: wall-clock limit (the CPU-time rlimit, int(timeout_s) + 2 s, comes later).
    memory_mb: address-space limit of each process.  max_output_bytes: kept per stream.
    stdin: text fed to the program.  max_processes: RLIMIT_NPROC (threads count too).
    max_file_bytes: RLIMIT_FSIZE, and the size of each private tmpfs.
    max_open_files: RLIMIT_NOFILE (file descriptors per process).
    total_memory_mb: memory of the whole run, all its processes and private tmpfs files together
    (the per-run cgroup's memory limit; default memory_mb).  The cgroup also bounds the run's
    processes to max_processes (+ 2 for the launcher and the namespace init).
    namespaces: try Linux namespaces (set False to exercise the fallback).
    cgroup: try a per-run cgroup (set False to exercise the fallback; see _Cgroup).
    interpreter: the Python that runs the sample (default: this one with symlinks resolved).
    Thread-safe; see run_many.
    """
    interpreter = os.path.realpath(interpreter or sys.executable)
    workdir = tempfile.mkdtemp(prefix="rlx-sandbox-")
    lease = group = None
    try:
        if cgroup:
            total = (total_memory_mb or memory_mb) * 2**20
            group = _Cgroup.create(total, max_processes + 2)
        if os.geteuid() == 0:
            lease = _UID_POOL.acquire()
        Path(workdir, _MAIN).write_text(code, encoding="utf-8")
        if lease is not None:
            for path in (workdir, os.path.join(workdir, _MAIN)):
                os.chown(path, lease.uid, lease.uid)
        # RLIMIT_NPROC counts every process of the uid; a non-root caller's own ones too.
        nproc = max_processes if lease is not None else _count_tasks(os.getuid()) + max_processes
        config = {
            "workdir": workdir,
            "interpreter": interpreter,
            "uid": None if lease is None else lease.uid,
            "namespaces": namespaces,
            "timeout_s": timeout_s,
            "memory_bytes": memory_mb * 2**20,
            "max_file_bytes": max_file_bytes,
            "max_processes": nproc,
            "max_open_files": max_open_files,
            "cgroup_procs": [] if group is None else group.procs_files(),
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir},
        }
        result = _launch_and_collect(config, lease, timeout_s, max_output_bytes, stdin.encode("utf-8"), group)
        if cgroup and "cgroup" not in result.isolation and result.status != "sandbox_error":
            _warn_no_cgroup(_Cgroup.unavailable if group is None else group.join_error)
        return result
    finally:
        if group is not None:
            group.remove()
        if lease is not None:
            _UID_POOL.release(lease)
        shutil.rmtree(workdir, ignore_errors=True)


def run_many(codes: list[str], workers: int | None = None, **run_kwargs) -> list[SandboxResult]:
    """run_code over many programs, `workers` at a time (default: CPU count), results in input
    order.  Threads suffice: each run is its own process and the threads only wait on pipes.
    Concurrent runs never share a sample uid, so cleanup of one cannot touch another."""
    from concurrent.futures import ThreadPoolExecutor

    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlx-sandbox") as pool:
        return list(pool.map(lambda code: run_code(code, **run_kwargs), codes))


def check_program(
    program: str, test: str, entry_point: str, timeout_s: float = 5.0, **run_kwargs
) -> SandboxResult:
    """HumanEval-style functional check (Chen et al. 2021): the program (prompt + completion),
    then the test code that defines `check(candidate)`, then `check(<entry_point>)`.
    passed == all asserts held within the time limit AND the harness reached its end: it prints a
    fresh token (read from the stdin pipe before the sample runs) only after check() returned and
    every value the candidate returned was plain data; the exit status alone never passes."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    import secrets

    token = secrets.token_hex(16)  # fresh per run, reaches the harness through the stdin pipe only
    code = _HARNESS.format(program=json.dumps(program), test=json.dumps(test), entry_point=json.dumps(entry_point),
                          mark=json.dumps(_PASS_MARK))
    result = run_code(code, timeout_s=timeout_s, stdin=token + "\n", **run_kwargs)
    if result.status != "passed":
        return result
    reached_end = f"{_PASS_MARK}{token}" in result.stdout
    if reached_end:
        return result
    # exit status 0 without the token: the program left before the checks finished (sys.exit(0),
    # os._exit(0), atexit tricks...) or returned objects that override comparison
    import dataclasses

    return dataclasses.replace(result, passed=False, status="failed",
                               stderr=result.stderr + "\nrlx: the test harness did not reach its end")


_PASS_MARK = "rlx-harness-passed:"

# The harness reads the token from stdin before any sample code runs and keeps it in a closure; the
# program and tests run in their own namespace; the token is written with the saved os.write only
# when check() returned normally and every value the candidate returned was plain data.
_HARNESS = """
def _rlx_harness():
    import os, sys
    write, token = os.write, sys.stdin.readline().strip()
    plain = (int, float, complex, str, bytes, bool, type(None))
    containers = (list, tuple, set, frozenset, dict)

    def is_plain(value, depth=0):
        kind = type(value)
        if kind in plain:
            return True
        if kind in containers and depth < 50:
            items = value.items() if kind is dict else value
            if kind is dict:
                return all(is_plain(k, depth + 1) and is_plain(v, depth + 1) for k, v in items)
            return all(is_plain(v, depth + 1) for v in items)
        return False

    namespace = {{"__name__": "__main__"}}
    exec(compile({program}, "main.py", "exec"), namespace)
    exec(compile({test}, "test.py", "exec"), namespace)
    function, returned_plain = namespace[{entry_point}], [True]

    def candidate(*args, **kwargs):
        value = function(*args, **kwargs)
        if not is_plain(value):
            returned_plain[0] = False
            raise AssertionError("the candidate returned an object that is not plain data")
        return value

    try:
        namespace["check"](candidate)
    except SystemExit:
        raise AssertionError("the program exited before the checks finished") from None
    if returned_plain[0]:
        write(1, ("\\n" + {mark} + token + "\\n").encode())


_rlx_harness()
"""


# ============================================================================================
# Parent side
# ============================================================================================


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):  # the sample closed its stdin or ended: fine
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _launch_and_collect(
    config: dict, lease: _Lease | None, timeout_s: float, max_output_bytes: int, stdin: bytes = b"",
    group: _Cgroup | None = None,
) -> SandboxResult:
    """Start the launcher, stream its output until exit or deadline, then clean up.  stdin is a pipe
    (never a host file the sample could reopen through /proc/self/fd/0), fed by a thread."""
    workdir = config["workdir"]
    report_read, report_write = os.pipe()
    config["report_fd"] = report_write
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _LAUNCHER, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=config["env"],
            start_new_session=True,
            pass_fds=(report_write,),
        )
    except OSError as exc:
        os.close(report_read)
        return SandboxResult(False, "sandbox_error", None, "", f"could not start: {exc}", 0.0)
    finally:
        os.close(report_write)
    threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    streams = {proc.stdout.fileno(): _CappedBuffer(max_output_bytes),
               proc.stderr.fileno(): _CappedBuffer(max_output_bytes)}
    timed_out = True  # until shown otherwise; an interrupted wait still gets a full cleanup
    try:
        timed_out = _stream_until_exit(proc.pid, streams, start + timeout_s)
        duration = time.monotonic() - start
    finally:
        # The session id equals the launcher's pid; it stays reserved while any member lives.
        _signal_group(proc.pid)
        proc.wait()
        report = _read_report(report_read)
        if group is not None:
            group.join_error = report.get("cgroup_error", "")
        if group is not None and "cgroup" in report.get("isolation", ()):
            group.kill()  # also what left the session, before the uid sweep below
            if group.oom_kills():
                streams[proc.stderr.fileno()].add(
                    f"\nrlx: the run's total memory bound ({group.memory_bytes >> 20} MiB) was hit; "
                    "the kernel killed a process\n".encode())
        # With a pid namespace, a launcher that exited on its own means the namespace's init
        # exited, and the kernel killed everything inside first; otherwise sweep the uid.
        if lease is not None and (timed_out or "pidns" not in report.get("isolation", ())):
            lease.clean = _kill_all_of_uid(lease.uid)
        for fd, buffer in streams.items():
            _drain(fd, buffer, max_reads=64)  # bounded: an escaped writer may still be there
        proc.stdout.close()
        proc.stderr.close()
    return _make_result(proc.returncode, timed_out, streams, report, duration)


def _make_result(
    returncode: int, timed_out: bool, streams: dict, report: dict, duration: float
) -> SandboxResult:
    stdout, stderr = (buffer.text() for buffer in streams.values())
    truncated = any(buffer.truncated for buffer in streams.values())
    isolation = tuple(report.get("isolation", ()))
    if "error" in report or "isolation" not in report:
        message = report.get("error", "the sandbox launcher did not report")
        stderr = f"sandbox error: {message}\n{stderr}"
        return SandboxResult(False, "sandbox_error", None, stdout, stderr, duration, truncated)
    if timed_out:
        return SandboxResult(False, "timeout", None, stdout, stderr, duration, truncated, isolation)
    if "signal" in report:  # the launcher exits 128 + N when the sample died by signal N
        returncode = -int(report["signal"])
    status = "passed" if returncode == 0 else "failed"
    return SandboxResult(
        returncode == 0, status, returncode, stdout, stderr, duration, truncated, isolation
    )


class _CappedBuffer:
    """Keeps the first `limit` bytes of a stream and counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.data, self.total = limit, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _drain(fd: int, buffer: _CappedBuffer, max_reads: int = 16) -> bool:
    """Read what `fd` has without blocking.  False at end of file.  max_reads bounds one call
    so that a sample printing without end cannot starve the deadline check."""
    reads = 0
    while reads < max_reads:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        buffer.add(chunk)
        reads += 1
    return True


def _has_exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pid must stay valid for killpg)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _stream_until_exit(pid: int, streams: dict, deadline: float) -> bool:
    """Copy output into the buffers until the launcher exits (returns False) or the deadline
    passes (returns True: timed out).  A pidfd wakes us on exit; without one we poll (20 ms)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ)
        try:
            while not _has_exited(pid):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return True
                wait = remaining if pidfd is not None else min(remaining, 0.02)
                for key, _ in selector.select(wait):
                    if key.fd in streams and not _drain(key.fd, streams[key.fd]):
                        selector.unregister(key.fd)
        finally:
            if pidfd is not None:
                os.close(pidfd)
    return False


def _signal_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_report(fd: int) -> dict:
    """The launcher's JSON lines merged: {"isolation": [...]}, {"error": "..."}, {"signal": N}."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    report: dict = {}
    for line in b"".join(chunks).decode("utf-8", errors="replace").splitlines():
        report.update(json.loads(line))
    return report


# --------------------------------------------------------------------------------------------
# Per-run cgroup: one bound on the memory and the processes of the whole run
# --------------------------------------------------------------------------------------------


class _Cgroup:
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
    def create(cls, memory_bytes: int, max_pids: int) -> _Cgroup | None:
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


def _warn_no_cgroup(reason: str) -> None:
    """Once per process: the run had no total bound, only per-process rlimits."""
    if not _WARNED_NO_CGROUP:
        _WARNED_NO_CGROUP.append(True)
        warnings.warn(
            "rlx sandbox: no per-run cgroup here"
            + (f" ({reason})" if reason else "")
            + "; memory and processes are bounded per process only (RLIMIT_AS x RLIMIT_NPROC), "
            "see rlx/tasks/sandbox.py", RuntimeWarning, stacklevel=3)



# --------------------------------------------------------------------------------------------
# Sample uids (root runner only)
# --------------------------------------------------------------------------------------------


@dataclass
class _Lease:
    uid: int
    lock_fd: int
    clean: bool = True  # False if processes of this uid may outlive the run


class _UidPool:
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

    def acquire(self) -> _Lease:
        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        with self.cond:
            while True:
                for uid in self.uids:
                    if uid in self.busy or not self._is_clean(uid):
                        continue
                    lock_fd = self._try_lock(uid)
                    if lock_fd is not None:
                        self.busy.add(uid)
                        return _Lease(uid, lock_fd)
                self.cond.wait(timeout=0.1)

    def release(self, lease: _Lease) -> None:
        os.close(lease.lock_fd)
        with self.cond:
            self.busy.discard(lease.uid)
            if not lease.clean:
                self.clean.discard(lease.uid)
            self.cond.notify()

    def _is_clean(self, uid: int) -> bool:
        if uid not in self.clean and not _has_passwd_entry(uid) and _count_tasks(uid) == 0:
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


_UID_POOL = _UidPool(SANDBOX_UIDS)


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


def _kill_all_of_uid(uid: int, settle_s: float = 0.25) -> bool:
    """SIGKILL every process of `uid`.  Returns True once no task of `uid` is left (waiting
    up to settle_s for the dead to be reaped), False if some remain."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _KILL_ALL_OF_UID, str(uid)],
        env={}, stdin=subprocess.DEVNULL, capture_output=True, check=False,
    )
    if done.returncode == 3:
        return True
    deadline = time.monotonic() + settle_s
    while _count_tasks(uid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _count_tasks(uid: int) -> int:
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


# ============================================================================================
# Launcher side: runs as `python -I sandbox.py CONFIG` in a fresh single-threaded process
# ============================================================================================

_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_SYS_MOUNT_SETATTR = 442  # same number on every architecture (added in Linux 5.12)
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID = 0x1, 0x2

# Prelude for runs without a network namespace.  Only a guard against accidents.
_SOCKET_GUARD = f"""\
import runpy, socket, sys
def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the rlx sandbox")
class _NoSocket(socket.socket):  # a class, so that modules subclassing socket still import
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and family != socket.AF_UNIX:  # socketpair() and pipes still work
            _no_network()
        super().__init__(family, type, proto, fileno)
socket.socket = socket.SocketType = _NoSocket
for _name in ("create_connection", "create_server", "getaddrinfo"):
    setattr(socket, _name, _no_network)
sys.argv = [{_MAIN!r}]
runpy.run_path({_MAIN!r}, run_name="__main__")
"""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _Libc:
    """The few syscalls Python 3.11 lacks (unshare, mount, mount_setattr, prctl)."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"{what}: {os.strerror(code)}")

    def unshare(self, flags: int) -> None:
        self._check(self.libc.unshare(flags), "unshare")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int,
              data: str | None = None) -> None:
        source_b, fstype_b, data_b = (None if s is None else s.encode()
                                      for s in (source, fstype, data))
        result = self.libc.mount(source_b, target.encode(), fstype_b, ctypes.c_ulong(flags), data_b)
        self._check(result, f"mount {target}")

    def make_all_mounts_readonly(self) -> None:
        attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID)
        result = self.libc.syscall(
            ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(_AT_FDCWD), b"/",
            ctypes.c_uint(_AT_RECURSIVE), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
        )
        self._check(result, "mount_setattr")

    def prctl(self, option: int, value: int) -> None:
        self._check(self.libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), "prctl")


def _launch(config: dict) -> None:
    """Set up isolation, fork the sample, wait for it and exit with its exit code.

    With a pid namespace the process tree is: launcher (host namespace) -> init (pid 1 of the
    new namespace; mounts /proc, reaps orphans) -> sample.  Without one: launcher -> sample.
    The process that waits for the sample reports a death by signal on the report pipe.
    """
    report_fd = config["report_fd"]
    os.set_inheritable(report_fd, False)  # the sample must not inherit the report pipe
    os.umask(0o022)
    try:
        libc = _Libc()
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the caller
        code = Path(config["workdir"], _MAIN).read_bytes()
        isolation = _join_cgroup(config, report_fd)  # first: all that follows is inside
        isolation += _enter_namespaces(libc, config)
        if "mountns" in isolation:
            isolation += _isolate_filesystem(libc, config, code)
        if "pidns" in isolation:
            init = os.fork()
            if init:
                os.close(report_fd)
                _wait_and_exit_like(init, None)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # fork cleared it
            try:
                libc.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
                isolation.append("private-proc")
            except OSError:
                pass
        sample = os.fork()
        if sample:
            _wait_and_exit_like(sample, report_fd)
        argv = _become_sample(libc, config, isolation)
        _report(report_fd, {"isolation": isolation})
        try:
            os.execve(argv[0], argv, config["env"])
        except PermissionError as exc:
            raise PermissionError(f"{exc} (the sample's uid {os.getuid()} may not execute it: "
                                  "pass a world-readable interpreter= or allow namespaces)") from None
    except BaseException as exc:  # report, never fall through to running code unconfined
        _report(report_fd, {"error": f"{type(exc).__name__}: {exc}"})
        os._exit(_LAUNCH_FAILED)


def _report(fd: int, message: dict) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _wait_and_exit_like(child: int, report_fd: int | None) -> None:
    """Reap children until `child` ends, then exit with its code.  Reaping every child matters
    for pid 1 of a namespace: orphans become its children, and zombies count against
    RLIMIT_NPROC.  A death by signal N is reported on the pipe and exits with 128 + N (pid 1
    cannot re-raise a signal on itself)."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    if os.WIFSIGNALED(status) and report_fd is not None:
        _report(report_fd, {"signal": os.WTERMSIG(status)})
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _join_cgroup(config: dict, report_fd: int) -> list[str]:
    """Move this process into the run's cgroup(s), before any fork.  A failure is reported, and
    the run goes on without (the caller warns)."""
    if not config["cgroup_procs"]:
        return []
    try:
        for path in config["cgroup_procs"]:
            Path(path).write_text(str(os.getpid()))
    except OSError as exc:
        _report(report_fd, {"cgroup_error": f"could not join {path}: {exc.strerror}"})
        return []
    return ["cgroup"]


def _enter_namespaces(libc: _Libc, config: dict) -> list[str]:
    """Unshare what the machine permits; each namespace is optional."""
    isolation = []
    if not config["namespaces"]:
        return isolation
    if config["uid"] is None:  # not root: a user namespace grants the rights for the rest
        if not _user_namespace_works(libc):
            return isolation
        _enter_user_namespace(libc)
        isolation.append("userns")
    for flag, name in ((_CLONE_NEWNET, "netns"), (_CLONE_NEWIPC, "ipcns"),
                       (_CLONE_NEWNS, "mountns"), (_CLONE_NEWPID, "pidns")):
        try:
            libc.unshare(flag)
            isolation.append(name)
        except OSError:
            pass
    return isolation


def _enter_user_namespace(libc: _Libc) -> None:
    """A user namespace in which we keep our uid/gid (mapped to themselves)."""
    uid, gid = os.getuid(), os.getgid()
    libc.unshare(_CLONE_NEWUSER)
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def _user_namespace_works(libc: _Libc) -> bool:
    """Try it in a throwaway child first: some systems (Ubuntu 24.04's AppArmor policy) allow
    unshare(CLONE_NEWUSER) but withhold the capabilities inside, and there is no way back."""
    probe = os.fork()
    if probe == 0:
        try:
            _enter_user_namespace(libc)
            libc.unshare(_CLONE_NEWNS)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(probe, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _isolate_filesystem(libc: _Libc, config: dict, code: bytes) -> list[str]:
    """In the new mount namespace: host mounts read-only, private tmpfs for the writable
    places, the interpreter reachable by the sample uid.  Returns the layers added."""
    isolation = []
    # Opened before any mount can hide it (an interpreter under /tmp, say).
    hidden_prefix = _open_hidden_prefix(config["interpreter"]) if config["uid"] is not None else None
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing propagates back to the host
    try:
        libc.make_all_mounts_readonly()
        isolation.append("readonly-fs")
    except OSError:
        pass
    # Mounted after the read-only pass, so these stay writable.
    size = max(config["max_file_bytes"], 1 << 20)
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(shared):
            libc.mount("tmpfs", shared, "tmpfs", _MS_NOSUID | _MS_NODEV,
                       f"size={size},nr_inodes=4096,mode=1777")
    if os.path.isdir("/run/user"):  # per-user sockets (D-Bus, ssh-agent, systemd --user)
        libc.mount("tmpfs", "/run/user", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
    workdir = config["workdir"]  # usually under /tmp, hence gone now; recreate it
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    owner = config["uid"] if config["uid"] is not None else os.getuid()
    libc.mount("tmpfs", workdir, "tmpfs", _MS_NOSUID | _MS_NODEV,
               f"size={size},nr_inodes=4096,mode=0700,uid={owner},gid={owner}")
    main = os.path.join(workdir, _MAIN)
    Path(main).write_bytes(code)
    os.chown(main, owner, owner)
    if hidden_prefix is not None:
        _expose_prefix(libc, *hidden_prefix)
    return [*isolation, "private-tmp"]


def _open_hidden_prefix(interpreter: str) -> tuple[str, int] | None:
    """(prefix, O_PATH fd) if a directory above the interpreter's prefix (the directory above
    bin/) is closed to others, e.g. pyenv under /root (mode 700); None if it is reachable."""
    prefix = os.path.dirname(os.path.dirname(interpreter))
    if _first_closed_dir(prefix) is None:
        return None
    return prefix, os.open(prefix, os.O_PATH | os.O_DIRECTORY)


def _first_closed_dir(path: str) -> str | None:
    """The topmost existing directory on the way to `path` that others cannot traverse."""
    for directory in _ancestors(path):
        try:
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return directory
        except FileNotFoundError:
            return None
    return None


def _expose_prefix(libc: _Libc, prefix: str, prefix_fd: int) -> None:
    """Make the prefix reachable at its own path: cover the closed directory above it with an
    empty tmpfs (which also hides the rest of it) and bind the prefix back, read-only."""
    closed = _first_closed_dir(prefix)
    if closed is not None:
        libc.mount("tmpfs", closed, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    os.makedirs(prefix, mode=0o755, exist_ok=True)
    libc.mount(f"/proc/self/fd/{prefix_fd}", prefix, None, _MS_BIND | _MS_REC)
    libc.mount(None, prefix, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID)
    os.close(prefix_fd)


def _ancestors(path: str) -> list[str]:
    """"/a/b/c" -> ["/a", "/a/b", "/a/b/c"]."""
    parts = Path(path).parts[1:]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _become_sample(libc: _Libc, config: dict, isolation: list[str]) -> list[str]:
    """In the forked child: drop privileges, apply limits, return the sample's argv."""
    uid = config["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
            raise PermissionError("could not switch to the sample uid")
        try:
            os.setuid(0)
        except PermissionError:
            isolation.append("uid")
        else:
            raise PermissionError("privileges could be regained after the switch")
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # reset by the uid switch; set it again
    cpu_s = int(config["timeout_s"]) + 2  # > the wall-clock limit: the deadline fires first
    limits = {
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),  # SIGXCPU at soft, SIGKILL at hard
        resource.RLIMIT_AS: (config["memory_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (config["max_file_bytes"],) * 2,
        resource.RLIMIT_NPROC: (config["max_processes"],) * 2,
        resource.RLIMIT_NOFILE: (config["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for kind, (soft, hard) in limits.items():
        resource.setrlimit(kind, (soft, hard))
    os.chdir(config["workdir"])
    if "netns" in isolation:
        return [config["interpreter"], "-I", _MAIN]
    isolation.append("socket-guard")
    return [config["interpreter"], "-I", "-c", _SOCKET_GUARD]


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))
