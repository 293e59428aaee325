"""The caller's side of one run: start the launcher in its own session, feed its stdin, stream its output
into capped buffers until it exits or the deadline passes, then kill what is left (process group, cgroup, the
sample uid) and read the launcher's report."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time

from rlx.sandbox.cgroup import Cgroup
from rlx.sandbox.launcher import LAUNCHER
from rlx.sandbox.result import SandboxResult
from rlx.sandbox.uids import Lease, kill_all_of_uid


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


def launch_and_collect(
    config: dict, lease: Lease | None, timeout_s: float, max_output_bytes: int, stdin: bytes = b"",
    group: Cgroup | None = None,
) -> SandboxResult:
    """Start the launcher, stream its output until exit or deadline, then clean up.  stdin is a pipe
    (never a host file the sample could reopen through /proc/self/fd/0), fed by a thread."""
    workdir = config["workdir"]
    report_read, report_write = os.pipe()
    config["report_fd"] = report_write
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", LAUNCHER, json.dumps(config)],
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
            lease.clean = kill_all_of_uid(lease.uid)
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
