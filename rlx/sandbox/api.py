"""The sandbox's entry points: run a program (run_code, run_many) or check one against HumanEval-style tests
(check_program). What rewards, verifiers and environments call."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlx.sandbox.cgroup import Cgroup, warn_no_cgroup
from rlx.sandbox.launcher import MAIN
from rlx.sandbox.parent import launch_and_collect
from rlx.sandbox.result import SandboxResult
from rlx.sandbox.uids import UID_POOL, count_tasks


@dataclass(frozen=True)
class SandboxLimits:
    """run_code's further limits and switches (keywords of run_code, run_many and check_program).

    max_processes: RLIMIT_NPROC (threads count too).
    max_file_bytes: RLIMIT_FSIZE, and the size of each private tmpfs.
    max_open_files: RLIMIT_NOFILE (file descriptors per process).
    total_memory_mb: memory of the whole run, all its processes and private tmpfs files together
    (the per-run cgroup's memory limit; default memory_mb).  The cgroup also bounds the run's
    processes to max_processes (+ 2 for the launcher and the namespace init).
    namespaces: try Linux namespaces (set False to exercise the fallback).
    cgroup: try a per-run cgroup (set False to exercise the fallback; see Cgroup).
    interpreter: the Python that runs the sample (default: this one with symlinks resolved)."""

    max_processes: int = 64
    max_file_bytes: int = 16 * 2**20
    max_open_files: int = 256
    total_memory_mb: int | None = None
    namespaces: bool = True
    cgroup: bool = True
    interpreter: str | None = None


def run_code(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 64_000,
    *,
    stdin: str = "",
    **limits,
) -> SandboxResult:
    """Run `code` as the main script of a fresh interpreter inside the sandbox.

    timeout_s: wall-clock limit (the CPU-time rlimit, int(timeout_s) + 2 s, comes later).
    memory_mb: address-space limit of each process.  max_output_bytes: kept per stream.
    stdin: text fed to the program.
    limits: the fields of SandboxLimits by keyword (max_processes, max_file_bytes, max_open_files,
    total_memory_mb, namespaces, cgroup, interpreter); an unknown one is a TypeError.
    Thread-safe; see run_many.
    """
    lim = SandboxLimits(**limits)
    max_processes, cgroup = lim.max_processes, lim.cgroup
    interpreter = os.path.realpath(lim.interpreter or sys.executable)
    workdir = tempfile.mkdtemp(prefix="rlx-sandbox-")
    lease = group = None
    try:
        if cgroup:
            total = (lim.total_memory_mb or memory_mb) * 2**20
            group = Cgroup.create(total, max_processes + 2)
        if os.geteuid() == 0:
            lease = UID_POOL.acquire()
        Path(workdir, MAIN).write_text(code, encoding="utf-8")
        if lease is not None:
            for path in (workdir, os.path.join(workdir, MAIN)):
                os.chown(path, lease.uid, lease.uid)
        # RLIMIT_NPROC counts every process of the uid; a non-root caller's own ones too.
        nproc = max_processes if lease is not None else count_tasks(os.getuid()) + max_processes
        config = {
            "workdir": workdir,
            "interpreter": interpreter,
            "uid": None if lease is None else lease.uid,
            "namespaces": lim.namespaces,
            "timeout_s": timeout_s,
            "memory_bytes": memory_mb * 2**20,
            "max_file_bytes": lim.max_file_bytes,
            "max_processes": nproc,
            "max_open_files": lim.max_open_files,
            "cgroup_procs": [] if group is None else group.procs_files(),
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir},
        }
        result = launch_and_collect(config, lease, timeout_s, max_output_bytes, stdin.encode("utf-8"), group)
        if cgroup and "cgroup" not in result.isolation and result.status != "sandbox_error":
            warn_no_cgroup(Cgroup.unavailable if group is None else group.join_error)
        return result
    finally:
        if group is not None:
            group.remove()
        if lease is not None:
            UID_POOL.release(lease)
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
