"""What one sandboxed run returns (see rlx/sandbox/__init__.py for the isolation layers it names)."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("passed", "failed", "timeout", "sandbox_error")


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
