"""Launcher side: runs as `python -I -S launcher.py CONFIG` in a fresh single-threaded process, sets up the
isolation (cgroup, namespaces, mounts, uid, rlimits; rlx/sandbox/__init__.py) and becomes the sample.

Standard library only: it runs in isolated mode, where rlx is not importable. The caller (parent.py) imports
it for LAUNCHER (this file's path) and MAIN (the sample's file name)."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import stat
import sys
from pathlib import Path

LAUNCHER = os.path.abspath(__file__)
MAIN = "main.py"
LAUNCH_FAILED = 126  # launcher exit code when setup failed (details go to the report pipe)

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
sys.argv = [{MAIN!r}]
runpy.run_path({MAIN!r}, run_name="__main__")
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
        code = Path(config["workdir"], MAIN).read_bytes()
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
        os._exit(LAUNCH_FAILED)


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
    main = os.path.join(workdir, MAIN)
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
        return [config["interpreter"], "-I", MAIN]
    isolation.append("socket-guard")
    return [config["interpreter"], "-I", "-c", _SOCKET_GUARD]


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))
