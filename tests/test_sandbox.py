"""The sandbox against hostile and broken samples.

Every hostile sample must be scored as not passed, must leave the host as it was (a sentinel
directory outside the sandbox, /tmp, this test process, no stray processes), and must not
stop the next sample from running.  Tests that take a `mode` run twice when the runner is
root: with namespaces (the normal path) and without them (uid switch + rlimits + socket guard
only, the path of a root container without CAP_SYS_ADMIN).
"""

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rlx.sandbox import SANDBOX_UIDS, check_program, run_code, run_many
from rlx.sandbox import cgroup as sandbox_cgroup
from rlx.sandbox.cgroup import Cgroup
from rlx.sandbox.uids import UID_POOL

IS_ROOT = os.geteuid() == 0
FAST = {"timeout_s": 1.5, "memory_mb": 256}


def _world_runnable(path: str) -> bool:
    """Whether a user with no special rights can execute `path` (every directory on the way
    traversable by others)."""
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [*reversed(real.parents), real])


def _world_runnable_python() -> str | None:
    for candidate in (sys.executable, "/usr/local/bin/python3", "/usr/bin/python3"):
        if os.path.exists(candidate) and _world_runnable(candidate):
            return os.path.realpath(candidate)
    return None


@pytest.fixture(scope="session")
def default_isolation() -> tuple[str, ...]:
    """The layers this machine grants by default."""
    return run_code("pass").isolation


@pytest.fixture(params=["namespaces", "no-namespaces"])
def mode(request, default_isolation) -> dict:
    """Extra run_code arguments for the isolation mode under test."""
    if request.param == "namespaces":
        if not IS_ROOT and "mountns" not in default_isolation:
            pytest.skip("no user namespaces here: a non-root sample runs as the caller")
        return {}
    if not IS_ROOT:
        pytest.skip("without root or namespaces the sample may touch the caller's own files")
    python = _world_runnable_python()
    if python is None:
        pytest.skip("no Python interpreter that an unprivileged uid may execute")
    return {"namespaces": False, "interpreter": python}


@pytest.fixture
def sentinel(tmp_path) -> Path:
    """A directory outside the sandbox that no sample may change."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    return outside


LEASED_UIDS: set[int] = set()
"""Sample uids this test process was given.  Other processes on the machine (a parallel test
run, a training run scoring code) lease other uids of the same range at the same time; their
samples are none of our business."""


@pytest.fixture(autouse=True)
def _record_leased_uids(monkeypatch):
    acquire = UID_POOL.acquire

    def recording_acquire():
        lease = acquire()
        LEASED_UIDS.add(lease.uid)
        return lease

    monkeypatch.setattr(UID_POOL, "acquire", recording_acquire)


def _live_sandbox_processes() -> list[int]:
    """Pids of live (not zombie) processes left under a sample uid that this test process
    leased.  Each uid is checked while holding its lease lock: a uid that another process
    holds right now runs that process's sample (which got the uid only after finding it
    empty), so it is skipped."""
    pids = []
    for uid in sorted(LEASED_UIDS):
        lock_fd = UID_POOL._try_lock(uid)
        if lock_fd is None:
            continue
        try:
            pids += _live_processes({uid})
        finally:
            os.close(lock_fd)
    return pids


def _live_processes(uids: set[int]) -> list[int]:
    """Live (not zombie) processes whose real uid is in `uids`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = dict(
                line.split(":", 1) for line in (entry / "status").read_text().splitlines()
            )
        except (OSError, ValueError):
            continue
        if int(status["Uid"].split()[0]) in uids and status["State"].split()[0] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def _assert_contained(sentinel: Path, mode: dict | None = None) -> None:
    """Nothing outside the sandbox changed and the next sample runs normally."""
    assert sorted(p.name for p in sentinel.iterdir()) == ["keep.txt"]
    assert (sentinel / "keep.txt").read_text() == "precious"
    if IS_ROOT:
        assert _live_sandbox_processes() == []
    after = run_code("print('next sample ok')", **(mode or {}))
    assert after.passed, after.stderr
    assert after.stdout == "next sample ok\n"


# --------------------------------------------------------------------------------------------
# Ordinary samples
# --------------------------------------------------------------------------------------------


def test_passing_sample(mode):
    result = run_code("print(sum(range(10)))", **mode)
    assert (result.passed, result.status, result.exit_code) == (True, "passed", 0)
    assert result.stdout == "45\n"
    assert result.stderr == ""
    assert 0 < result.duration_s < 5
    if IS_ROOT:
        assert "uid" in result.isolation
    if "mountns" in result.isolation:
        assert {"readonly-fs", "private-tmp"} <= set(result.isolation)
    assert ("netns" in result.isolation) != ("socket-guard" in result.isolation)


def test_assertion_error_is_failed():
    result = run_code("assert 1 + 1 == 3, 'bad arithmetic'")
    assert (result.passed, result.status, result.exit_code) == (False, "failed", 1)
    assert "AssertionError: bad arithmetic" in result.stderr


def test_syntax_error_is_failed():
    result = run_code("def f(:\n    return 1\n")
    assert (result.passed, result.status) == (False, "failed")
    assert "SyntaxError" in result.stderr


def test_exit_codes_and_signals():
    assert run_code("import sys; sys.exit(3)").exit_code == 3
    killed = run_code("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert (killed.status, killed.exit_code) == ("failed", -9)


def test_stdin_is_fed():
    result = run_code("print(input()[::-1])", stdin="abc\n")
    assert result.stdout == "cba\n"


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("RLX_TEST_SECRET_TOKEN", "hunter2")
    result = run_code("import json, os\nprint(json.dumps(dict(os.environ)))\nprint(os.getcwd())")
    env_line, cwd = result.stdout.splitlines()
    assert "hunter2" not in result.stdout
    env = json.loads(env_line)
    assert set(env) == {"PATH", "LANG", "HOME"}
    assert env["HOME"] == cwd


def test_workdir_is_fresh_and_removed(mode):
    first = run_code(
        "import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\n"
        "open('left_behind.txt', 'w').write('x')",
        **mode,
    )
    workdir, listing = first.stdout.splitlines()
    assert "'main.py'" in listing and "left_behind" not in listing
    assert not os.path.exists(workdir)
    second = run_code("import os; print(os.path.exists('left_behind.txt'), os.getcwd())", **mode)
    assert second.stdout.split()[0] == "False"
    assert second.stdout.split()[1] != workdir


def test_resource_limits_are_set():
    result = run_code(
        "import resource as r\n"
        "for name in ('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NPROC', 'RLIMIT_CORE',\n"
        "             'RLIMIT_NOFILE'):\n"
        "    print(name, *r.getrlimit(getattr(r, name)))",
        timeout_s=3,
        memory_mb=300,
        max_file_bytes=1 << 20,
        max_processes=20,
        max_open_files=100,
    )
    limits = {name: (int(soft), int(hard)) for name, soft, hard in map(str.split,
                                                                         result.stdout.splitlines())}
    assert limits["RLIMIT_CPU"] == (5, 6)  # int(timeout) + 2, hard one more
    assert limits["RLIMIT_AS"] == (300 * 2**20,) * 2
    assert limits["RLIMIT_FSIZE"] == (2**20,) * 2
    assert limits["RLIMIT_CORE"] == (0, 0)
    assert limits["RLIMIT_NOFILE"] == (100, 100)
    if IS_ROOT:  # otherwise the caller's own process count is added
        assert limits["RLIMIT_NPROC"] == (20, 20)


def test_file_size_limit():
    result = run_code("open('big.bin', 'wb').write(b'x' * (4 << 20))", max_file_bytes=1 << 20)
    assert result.status == "failed"
    assert "File too large" in result.stderr or "No space left" in result.stderr


# --------------------------------------------------------------------------------------------
# Hostile samples
# --------------------------------------------------------------------------------------------


def test_infinite_loop_times_out(sentinel, mode):
    start = time.monotonic()
    result = run_code("while True:\n    pass\n", **mode, **FAST)
    assert (result.passed, result.status, result.exit_code) == (False, "timeout", None)
    assert 1.5 <= result.duration_s < 3.0
    assert time.monotonic() - start < 4.0
    _assert_contained(sentinel, mode)


def test_fork_bomb_is_bounded_and_cleaned_up(sentinel, mode):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_code(code, max_processes=32, **mode, **FAST)
    assert not result.passed
    assert result.status == "timeout"
    _assert_contained(sentinel, mode)


def test_process_limit_bounds_forking(sentinel, mode):
    # Fork until the kernel refuses; the children wait, so they all count at once.
    code = (
        "import os, time\n"
        "count = 0\n"
        "while True:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    count += 1\n"
        "print(count)\n"
    )
    result = run_code(code, max_processes=16, **mode)
    assert result.status == "passed", result.stderr
    assert 0 < int(result.stdout) < 16  # the sample itself is one of the 16
    _assert_contained(sentinel, mode)  # and the sleeping children are gone


def test_background_process_does_not_survive(sentinel, mode):
    # A daemon that leaves the process group: only the pid namespace or the uid sweep get it.
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    result = run_code(code, **mode)
    assert result.status == "passed"
    _assert_contained(sentinel, mode)


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(8 * 1024**3)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
    ],
    ids=["one-huge-block", "grow-until-full"],
)
def test_memory_exhaustion_fails(sentinel, code):
    result = run_code(code, **FAST)
    assert result.status == "failed"
    assert "MemoryError" in result.stderr
    _assert_contained(sentinel)


def test_writing_outside_the_workdir_fails(sentinel, mode):
    for target in (sentinel / "new.txt", sentinel / "keep.txt"):
        result = run_code(f"open({str(target)!r}, 'w').write('pwned')", **mode)
        assert result.status == "failed", target
    _assert_contained(sentinel, mode)


def test_writing_to_host_tmp_does_not_reach_the_host(sentinel, default_isolation):
    # Writable for everyone on the host; the sample gets its own /tmp instead.
    if "private-tmp" not in default_isolation:
        pytest.skip("no mount namespace here: /tmp is shared with the host (documented)")
    target = Path("/tmp") / f"rlx-sandbox-escape-{uuid.uuid4().hex}"
    result = run_code(f"open({str(target)!r}, 'w').write('pwned')\nprint('wrote')")
    try:
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)
    assert result.stdout == "wrote\n"  # it wrote into its private, discarded /tmp
    _assert_contained(sentinel)


def test_deleting_files_fails(sentinel, mode):
    for code in (
        f"import os\nos.remove({str(sentinel / 'keep.txt')!r})",
        f"import shutil\nshutil.rmtree({str(sentinel)!r})",
        f"import os\nos.chmod({str(sentinel / 'keep.txt')!r}, 0)",
    ):
        result = run_code(code, **mode)
        assert result.status == "failed", code
    _assert_contained(sentinel, mode)


def test_host_filesystem_is_read_only(sentinel):
    # A world-writable directory outside /tmp that stays visible in the sandbox: neither the
    # uid nor a private tmpfs protects it, only the read-only remount of the host mounts.
    probe = Path(__file__).parent / f".rlx-sandbox-probe-{uuid.uuid4().hex}"
    try:
        probe.mkdir()
    except PermissionError:
        pytest.skip("cannot create a probe directory next to the tests")
    try:
        probe.chmod(0o777)
        (probe / "keep.txt").write_text("precious")
        (probe / "keep.txt").chmod(0o666)
        for code in (
            f"open({str(probe / 'new.txt')!r}, 'w').write('pwned')",
            f"open({str(probe / 'keep.txt')!r}, 'w').write('pwned')",
            f"import os\nos.remove({str(probe / 'keep.txt')!r})",
        ):
            result = run_code(code)
            if "readonly-fs" not in result.isolation:
                pytest.skip("this machine does not allow a read-only mount namespace")
            assert result.status == "failed", code
            # read-only remount; or, when the checkout itself lives under /tmp (a CI clone), the
            # sandbox's private /tmp hides the directory altogether
            assert "Read-only file system" in result.stderr or "No such file or directory" in result.stderr
        assert [p.name for p in probe.iterdir()] == ["keep.txt"]
        assert (probe / "keep.txt").read_text() == "precious"
    finally:
        shutil.rmtree(probe)
    _assert_contained(sentinel)


def test_network_is_unreachable(sentinel, mode):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
        )
        result = run_code(code, **mode)
        assert result.status == "failed"
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):  # nobody connected
            listener.accept()
    _assert_contained(sentinel, mode)


def test_killing_the_parent_fails(sentinel, mode):
    # Parent, this test process, every process it may signal, and its own process group.
    code = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {os.getpid()}, -1, 0):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "raise SystemExit('survived its own attempts')\n"
    )
    result = run_code(code, **mode)
    assert result.status == "failed"
    os.kill(os.getpid(), 0)  # still here
    _assert_contained(sentinel, mode)


def test_printing_megabytes_is_bounded(sentinel):
    code = "import sys\nsys.stdout.write('x' * 50_000_000)\nsys.stderr.write('y' * 5_000_000)"
    start = time.monotonic()
    result = run_code(code, max_output_bytes=1000, timeout_s=10)
    assert result.status == "passed"  # the output is drained, so the program completes
    assert result.stdout == "x" * 1000
    assert result.stderr == "y" * 1000
    assert result.output_truncated
    assert time.monotonic() - start < 5
    _assert_contained(sentinel)


def test_opening_files_without_end_fails(sentinel, mode):
    code = "files = []\nwhile True:\n    files.append(open('main.py'))\n"
    result = run_code(code, max_open_files=64, **mode, **FAST)
    assert result.status == "failed"
    assert "Too many open files" in result.stderr
    _assert_contained(sentinel, mode)


# --------------------------------------------------------------------------------------------
# The per-run cgroup: one bound on memory and processes for all processes of a run
# --------------------------------------------------------------------------------------------


@pytest.fixture
def cgroup_here(default_isolation):
    if "cgroup" not in default_isolation:
        pytest.skip(f"no writable cgroup here ({Cgroup.unavailable}); the fallback is tested below")


def _our_cgroups() -> list[str]:
    """Group directories this test process made that still exist."""
    if not Cgroup._backend:
        return []
    prefix = f"rlx-sandbox-{os.getpid()}-"
    return [os.path.join(parent, name) for parent in Cgroup._backend[1]
            for name in os.listdir(parent) if name.startswith(prefix)]


# Each child stays below the per-process address-space limit (256 MB) and touches its pages;
# together they need ~600 MB.  Passes only if every child finished.
MEMORY_HOG = (
    "import os, time\n"
    "children = []\n"
    "for _ in range(6):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        block = bytearray(100 * 2**20)\n"
    "        for i in range(0, len(block), 4096):\n"
    "            block[i] = 1\n"
    "        time.sleep(1)\n"
    "        os._exit(0)\n"
    "    children.append(pid)\n"
    "codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]\n"
    "print(codes)\n"
    "raise SystemExit(0 if codes == [0] * 6 else 1)\n"
)


def test_memory_hog_across_processes_is_stopped(sentinel, mode, cgroup_here):
    result = run_code(MEMORY_HOG, timeout_s=20, memory_mb=256, **mode)
    assert "cgroup" in result.isolation
    assert (result.passed, result.status) == (False, "failed"), result
    assert "total memory bound (256 MiB) was hit" in result.stderr
    os.kill(os.getpid(), 0)  # the caller lives on
    assert _our_cgroups() == []
    _assert_contained(sentinel, mode)


def test_process_bound_of_the_cgroup(sentinel, mode, cgroup_here, monkeypatch):
    # The cgroup alone bounds processes: RLIMIT_NPROC is left at 64, pids.max set to 8.
    create = Cgroup.create
    monkeypatch.setattr(Cgroup, "create", lambda memory, pids: create(memory, 8))
    code = (
        "import os, time\ncount = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    count += 1\nprint(count)\n"
    )
    result = run_code(code, max_processes=64, **mode)
    assert result.status == "passed", result.stderr
    # 8 = launcher + namespace init (with a pid namespace) + sample + its children
    assert 0 < int(result.stdout) <= 6
    assert _our_cgroups() == []
    _assert_contained(sentinel, mode)


@pytest.fixture
def no_cgroup_backend(monkeypatch):
    """A machine where no cgroup can be written: a fresh process that has not warned yet."""
    monkeypatch.setattr(Cgroup, "_backend", False)
    monkeypatch.setattr(Cgroup, "unavailable", "cgroup2: not writable (test)")
    monkeypatch.setattr(sandbox_cgroup, "_WARNED_NO_CGROUP", [])


def test_without_a_cgroup_runs_warn_once_and_keep_the_rlimits(sentinel, no_cgroup_backend):
    with pytest.warns(RuntimeWarning, match=r"no per-run cgroup here \(cgroup2: not writable \(test\)\)") as caught:
        first = run_code("print('ok')")
        second = run_code("x = bytearray(8 * 1024**3)", **FAST)
    assert len([w for w in caught if "cgroup" in str(w.message)]) == 1
    assert first.passed and "cgroup" not in first.isolation
    assert second.status == "failed" and "MemoryError" in second.stderr  # the per-process bound holds
    _assert_contained(sentinel)


def test_a_cgroup_the_launcher_cannot_join_falls_back_with_the_reason(sentinel, monkeypatch):
    monkeypatch.setattr(sandbox_cgroup, "_WARNED_NO_CGROUP", [])

    class Unjoinable:
        join_error = ""

        def procs_files(self):
            return ["/nonexistent-rlx-cgroup/cgroup.procs"]

        def remove(self):
            pass

    monkeypatch.setattr(Cgroup, "create", lambda memory, pids: Unjoinable())
    with pytest.warns(RuntimeWarning, match="could not join /nonexistent-rlx-cgroup/cgroup.procs"):
        result = run_code("print('ok')")
    assert result.passed and "cgroup" not in result.isolation
    _assert_contained(sentinel)


def test_cgroup_false_skips_it_silently(recwarn):
    result = run_code("print('ok')", cgroup=False)
    assert result.passed and "cgroup" not in result.isolation
    assert not [w for w in recwarn if "cgroup" in str(w.message)]


# --------------------------------------------------------------------------------------------
# Failing closed, concurrency, HumanEval
# --------------------------------------------------------------------------------------------


def test_unusable_interpreter_is_a_sandbox_error():
    result = run_code("print('ran')", interpreter="/nonexistent/bin/python3")
    assert (result.passed, result.status, result.exit_code) == (False, "sandbox_error", None)
    assert "ran" not in result.stdout


@pytest.mark.skipif(not IS_ROOT, reason="privilege drop is a root-runner feature")
def test_root_never_runs_code_it_cannot_confine(tmp_path, sentinel):
    # An interpreter under a directory closed to others (like pyenv under /root): without a
    # mount namespace the sample uid cannot execute it, so nothing runs (never as root).
    python = _world_runnable_python()
    if python is None:
        pytest.skip("no interpreter to copy")
    closed = tmp_path / "closed"
    (closed / "py" / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    private_python = closed / "py" / "bin" / "python3"
    shutil.copy2(python, private_python)
    marker = sentinel / "ran-as-root.txt"
    code = f"open({str(marker)!r}, 'w').write('x')"
    result = run_code(code, interpreter=str(private_python), namespaces=False)
    assert result.status == "sandbox_error"
    # With namespaces the prefix is bound back into view, and the sample runs confined.
    result = run_code(code, interpreter=str(private_python))
    if "mountns" in result.isolation:
        assert result.status == "failed"
        assert "uid" in result.isolation
    _assert_contained(sentinel)


def test_run_many_keeps_order_and_isolates_concurrent_samples(sentinel, mode):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    quick = "import os, time\ntime.sleep(0.2)\nprint({i}, os.getuid())"
    codes = [bomb] + [quick.format(i=i) for i in range(5)]
    results = run_many(codes, workers=3, max_processes=16, **mode, **FAST)
    assert results[0].status == "timeout"
    outputs = [r.stdout.split() for r in results[1:]]
    assert all(r.status == "passed" for r in results[1:]), [r.stderr for r in results]
    assert [int(out[0]) for out in outputs] == list(range(5))
    if IS_ROOT:
        assert all(int(out[1]) in SANDBOX_UIDS for out in outputs)
    _assert_contained(sentinel, mode)


@pytest.mark.skipif(not IS_ROOT, reason="sample uids are a root-runner feature")
def test_containment_checks_ignore_samples_of_other_processes(sentinel, tmp_path):
    # Another process on the machine (a parallel test run, a training run) has a sample running
    # under a sample uid while this test checks that nothing of its own was left behind.
    script = tmp_path / "other.py"
    script.write_text("import sys\nfrom rlx.sandbox import run_code\n"
                      "run_code('import time\\ntime.sleep(60)', timeout_s=60, namespaces=False, "
                      "interpreter=sys.argv[1])\n")
    other = subprocess.Popen([sys.executable, str(script), _world_runnable_python() or sys.executable],
                             start_new_session=True)

    def parent(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/status").read_text().split("PPid:")[1].split()[0])
        except OSError:
            return -1

    try:
        # wait until the other process's sample runs (launcher -> sample; bounded by the test's timeout)
        while not [pid for pid in _live_processes(set(SANDBOX_UIDS)) if parent(parent(pid)) == other.pid]:
            assert other.poll() is None, "the other process ended early"
            time.sleep(0.05)
        run_code("print('mine')")
        _assert_contained(sentinel)
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_check_program_humaneval_style():
    program = "def add(a, b):\n    return a + b\n"
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    assert check_program(program, test, "add", timeout_s=3).passed
    wrong = check_program(program.replace("a + b", "a - b"), test, "add", timeout_s=3)
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr
    slow = check_program("def add(a, b):\n    while True: pass\n", test, "add", timeout_s=1)
    assert slow.status == "timeout"
    with pytest.raises(ValueError):
        check_program(program, test, "add); import os; (", timeout_s=3)
