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
``run_code`` writes the code to ``main.py`` in a fresh temporary directory and starts launcher.py
as a script (``python -I -S launcher.py CONFIG``: the "launcher") in a new session with a
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

- ``"cgroup"``: a control group per run (cgroup v2, or v1 on a hybrid host; see cgroup.py ``Cgroup``)
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

The parts
---------
api.py (run_code, run_many, check_program: what rewards, verifiers and environments call), result.py
(SandboxResult), parent.py (the caller's side: start the launcher, stream its output, the deadline, the
clean-up), launcher.py (the launcher script: namespaces, mounts, limits, then the sample; standard library
only, it runs under ``python -I -S``), cgroup.py (the per-run control group), uids.py (the sample uids of a
root runner).
"""

from rlx.sandbox.api import SandboxLimits, check_program, run_code, run_many
from rlx.sandbox.result import STATUSES, SandboxResult
from rlx.sandbox.uids import SANDBOX_UIDS

__all__ = ["SANDBOX_UIDS", "STATUSES", "SandboxLimits", "SandboxResult", "check_program", "run_code", "run_many"]
