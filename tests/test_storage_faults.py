"""Storage faults (issue 31): every writer rlx uses during a run meets a full disk (ENOSPC), a used-up quota
(EDQUOT), a read-only file system (EROFS) and a permission error (EACCES) with one StorageError naming the
path, what was written and the fix (exit code 3), or, for a writer a long run can do without, one warning;
nothing half-written stays where a resume would read it.

How each fault is made (tests/storage_helpers.py): the run directory lives on a small tmpfs mounted for the
test; ENOSPC fills it to the last byte, EROFS remounts it read-only, EACCES takes write permission off the run
directory's tree and drops this thread's CAP_DAC_OVERRIDE (root ignores permission bits otherwise), EDQUOT is
injected into Python's open/mkdir/rename under the run directory (tmpfs here has no quota support). Mounting
needs root: elsewhere these tests skip."""

import errno
import hashlib
import json
import logging
import re
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlx.errors import StorageError
from rlx.report.sweeps import record_failure, restore_result, summarize_sweep, write_result
from rlx.runtime import checkpoint as checkpoint_module
from rlx.runtime import storage
from rlx.runtime.checkpoint import Checkpointer, list_checkpoints, truncate_metrics, what_survived
from rlx.runtime.rundir import (
    MetricsLog,
    RunLock,
    plot_run,
    read_metrics,
    record_resume,
    write_run_files,
    write_samples,
)
from rlx.runtime.storage import check_writable, guard_log_files, storage_errno, writing
from rlx.runtime.tracking import write_env_info
from tests.conftest import only_run_dir, run_rlx
from tests.storage_helpers import FAULTS, Disk, storage_fault
from tests.test_run_faults import _setup, _step


@pytest.fixture
def disk(tmp_path):
    mounted = Disk(tmp_path / "disk", size_mb=8).mount()
    try:
        yield mounted
    finally:
        mounted.unmount()


@pytest.fixture(autouse=True)
def fresh_warnings():
    storage._WARNED.clear()  # optional writers warn once per process: each test starts from none said
    yield
    storage._WARNED.clear()


@pytest.fixture(scope="module")
def tiny():
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _run_dir(disk: Disk) -> Path:
    """A run directory as a run leaves it after step 2: settings, two metrics rows, an evaluation at step 2."""
    run = disk.path / "outputs" / "train" / "run"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 10\n")
    rows = [{"step": 1, "reward/total": 0.5, "train/loss": 0.1},
            {"step": 2, "reward/total": 0.7, "train/loss": 0.2, "eval/accuracy": 0.25}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


# ---- the writers, each called as a run calls it ----

@dataclass
class Writer:
    name: str
    write: Callable  # (run, fault, ctx) -> None; applies `fault()` (a context manager) where the fault should hit
    optional: bool = False  # a warning, not an error
    check: Callable | None = None  # (run, ctx) -> None: nothing half-written is left, earlier state intact


def at_start(call):
    def write(run, fault, ctx):
        with fault():
            call(run, ctx)
    return write


def checkpoint_midway(run, fault, ctx):
    """Step 1's checkpoint is written before the fault; step 2's meets it after Accelerate wrote its files,
    when the checksums are written (a partial .tmp- folder exists at that moment)."""
    acc, model, optimizer, scheduler = _setup()
    ckpt = Checkpointer(acc, run, every=1, keep=5, total_steps=10, resume=False)
    ckpt.restore(scheduler=scheduler)
    _step(model, optimizer)
    ckpt.step_done(1)
    ctx["earlier"] = _snapshot(run / "checkpoints")
    _step(model, optimizer)
    real = checkpoint_module.write_checksums
    with ExitStack() as stack:
        def faulty(folder):
            stack.enter_context(fault())
            return real(folder)

        ctx["monkeypatch"].setattr(checkpoint_module, "write_checksums", faulty)
        try:
            ckpt.step_done(2)
        finally:
            ckpt.close()


def checkpoint_left(run, ctx):
    assert [s for s, _ in list_checkpoints(run)] == [1]
    if ctx["fault"] in ("ENOSPC", "EDQUOT"):  # removable: gone (read-only: it stays as .tmp-, which nothing reads)
        assert not list((run / "checkpoints").glob(".tmp-*"))
    assert {k: v for k, v in _snapshot(run / "checkpoints").items() if k.startswith("step_")} == ctx["earlier"]
    acc, model, optimizer, scheduler = _setup(seed=5)
    resumed = Checkpointer(acc, run, every=1, keep=5, total_steps=10, resume=True)
    try:
        assert resumed.restore(scheduler=scheduler) == 1  # what `rlx train resume=` uses: the intact step 1
    finally:
        resumed.close()


def final_midway(run, fault, ctx):
    """The weights are in .tmp-final/ when the fault hits the tokenizer's files."""
    from rlx.models.lora import save_final

    model, tokenizer = ctx["tiny"]
    real = tokenizer.save_pretrained
    with ExitStack() as stack:
        def faulty(*args, **kwargs):
            stack.enter_context(fault())
            return real(*args, **kwargs)

        ctx["monkeypatch"].setattr(tokenizer, "save_pretrained", faulty)
        save_final(model, tokenizer, run, merged=False, step=2)


def final_left(run, ctx):
    from rlx.models.lora import final_is_complete

    assert not (run / "final").exists() and not final_is_complete(run)
    if ctx["fault"] in ("ENOSPC", "EDQUOT"):
        assert not (run / ".tmp-final").exists()  # resume rebuilds final/ from the checkpoint


def eval_midway(run, fault, ctx):
    """rlx eval's results file: the first batch of 8 problems is written, the fault hits the second (~4 KB: more
    than the free part of the file's last page)."""
    from rlx.config.overrides import check_overrides
    from rlx.evaluation.benchmarks import Benchmark
    from rlx.evaluation.runner import EvalPass, run_benchmark

    model, tokenizer = ctx["tiny"]
    cfg = check_overrides(["benchmark=chain_sum"], config_name="eval")
    bench = Benchmark("chain_sum", OmegaConf.to_container(cfg.benchmark.chain_sum, resolve=True))
    sampling = OmegaConf.create({"n": 0, "greedy": True, "max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0,
                                 "top_k": 0, "batch_size": 8})
    real, calls = bench.score, []
    with ExitStack() as stack:
        def faulty(*args):
            calls.append(1)
            if len(calls) == 2:
                stack.enter_context(fault())
            return real(*args)

        bench.score = faulty
        run_benchmark(model, tokenizer, bench, bench.load(16), EvalPass(run / "chain_sum" / "model.jsonl", sampling,
                                                                        chat_template=True, seed=0, label="chain_sum",
                                                                        progress=False))


def eval_left(run, ctx):
    from rlx.evaluation.runner import read_records

    lines = (run / "chain_sum" / "model.jsonl").read_text().splitlines()
    assert len(lines) == 8 and len(read_records(run / "chain_sum" / "model.jsonl")) == 8  # whole records of the
    # first batch, no half line (the append was cut back): resume generates the rest


# a row of 300 metrics (~7 KB, more than one page: a full tmpfs still takes a small append into the file's last page)
BIG_ROW = {f"train/metric_{i}": 0.123456789 for i in range(300)}


def metrics_left(run, ctx):
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]  # a line cut short is dropped


def no_file(*names):
    def check(run, ctx):
        for name in names:  # absent, or (an append met the fault) empty
            assert all(p.stat().st_size == 0 for p in run.glob(name)), list(run.glob(name))
    return check


def unchanged(name):
    def check(run, ctx):
        assert (run / name).read_text() == ctx["before"][name]
        assert not list(run.glob(f".{name}.tmp-*"))  # the temporary copy of an atomic write is gone
    return check


def hydra_cfg():
    return OmegaConf.create({"overrides": {"task": ["seed=1"]}, "job": {"num": 0}, "sweeper": {}})


def sweep_summary_left(run, ctx):
    assert not list(run.parent.glob("summary.*")) and not list(run.parent.glob(".summary.*"))


def make_trial(run):
    (run / "overrides.yaml").write_text("- seed=1\n")
    (run / "result.json").write_text(json.dumps({"status": "ok", "metrics": {"eval/accuracy": 0.5}}))


WRITERS = [
    Writer("checkpoint", checkpoint_midway, check=checkpoint_left),
    Writer("final model", final_midway, check=final_left),
    Writer("metrics row", at_start(lambda run, ctx: MetricsLog(run, 10, progress=False).write(3, BIG_ROW)),
           check=metrics_left),
    Writer("metrics cut back on resume", at_start(lambda run, ctx: truncate_metrics(run / "metrics.jsonl", 1)),
           check=unchanged("metrics.jsonl")),
    Writer("run settings", at_start(lambda run,
                                    ctx: write_run_files(run, OmegaConf.create({"steps": 20}), ["steps=20"])),
           check=unchanged("config.yaml")),
    Writer("environment record", at_start(lambda run, ctx: write_env_info(run, 1)),
           check=no_file("env.json", ".env.json.tmp-*")),
    Writer("resume record", at_start(lambda run,
                                     ctx: record_resume(run, {"steps": 10}, {"steps": 20}, 2, ["steps=20"])),
           check=no_file("resumes.jsonl")),
    Writer("run lock", at_start(lambda run, ctx: RunLock(run).acquire().release())),
    Writer("result.json", at_start(lambda run, ctx: write_result(run, {"eval/accuracy": 0.5}, "eval/accuracy")),
           check=no_file("result.json", ".result.json.tmp-*")),
    Writer("failure.json", at_start(lambda run, ctx: record_failure(run, RuntimeError("boom"), hydra_cfg())),
           check=no_file("failure.json", ".failure.json.tmp-*")),
    Writer("sweep summary", at_start(lambda run, ctx: summarize_sweep(run.parent, "eval/accuracy")),
           check=sweep_summary_left),
    Writer("eval results", eval_midway, check=eval_left),
    Writer("disk check before a run",
           at_start(lambda run, ctx: check_writable(run / "checkpoints", "the run directory"))),
    Writer("samples", at_start(lambda run, ctx: [write_samples(run, s, [{"completion": "x" * 5000}]) for s in (5, 6)]),
           optional=True, check=no_file("samples/*.jsonl")),
    Writer("plot", at_start(lambda run, ctx: [plot_run(run), plot_run(run)]), optional=True,
           check=no_file("plots/*.png")),
]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("writer", WRITERS, ids=[w.name for w in WRITERS])
def test_each_writer_meets_each_storage_fault(writer, fault, disk, monkeypatch, caplog, tiny):
    run = _run_dir(disk)
    if writer.name == "sweep summary":
        make_trial(run)
    ctx = {"monkeypatch": monkeypatch, "tiny": tiny, "fault": fault,
           "before": {p.name: p.read_text() for p in run.iterdir() if p.is_file()}}

    def fault_now():
        return storage_fault(fault, disk, run.parent.parent if writer.name == "sweep summary" else run, monkeypatch)

    with caplog.at_level(logging.WARNING, logger="rlx"):
        if writer.optional:
            writer.write(run, fault_now, ctx)  # no error: the run goes on
            said = [r.getMessage() for r in caplog.records if r.name == "rlx" and r.levelno == logging.WARNING]
            assert len(said) == 1, said  # twice written, once said
            assert fault in said[0] and str(run) in said[0] and "the run goes on" in said[0], said[0]
        else:
            with pytest.raises(StorageError) as info:
                writer.write(run, fault_now, ctx)
            message = str(info.value)
            assert info.value.errno == getattr(errno, fault) and f"({fault})" in message, message
            assert "\n" not in message and str(disk.path) in message, message
    if writer.check is not None:
        writer.check(run, ctx)


# ---- the helper itself ----

def test_a_storage_fault_is_read_from_an_errno_a_message_or_the_disk(disk):
    """torch.save reports a full disk as `RuntimeError: unexpected pos` (no errno; seen here on this tmpfs),
    safetensors as `SafetensorError: ... No space left on device (os error 28)`: the errno comes from the
    chain, else the strerror text, else a probe of the folder; a bug's exception is never taken for one."""
    target = disk.path / "x.bin"
    assert storage_errno(OSError(errno.EDQUOT, "Disk quota exceeded"), target) == errno.EDQUOT
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as cause:
            raise RuntimeError("save failed") from cause
    except RuntimeError as exc:
        assert storage_errno(exc, target) == errno.EROFS  # from the chain
    assert storage_errno(RuntimeError("I/O error: No space left on device (os error 28)"), None) == errno.ENOSPC
    assert storage_errno(RuntimeError("unexpected pos 576 vs 534"), target) is None  # the disk has room: not storage
    disk.fill()
    with pytest.raises(RuntimeError) as real:
        torch.save({"w": torch.randn(100_000)}, str(target))
    assert "No space left" not in str(real.value)  # torch's own words do not say it
    assert storage_errno(real.value, target) == errno.ENOSPC  # the probe does
    assert storage_errno(TypeError("a bug"), target) is None  # not a write failure: no probe, no disguise


def test_other_exceptions_pass_through_and_the_partial_is_removed(tmp_path):
    partial = tmp_path / ".tmp-x"
    with pytest.raises(KeyError):
        with writing(tmp_path / "x", "x", partial=partial):
            partial.mkdir()
            (partial / "a").write_text("half")
            raise KeyError("a bug")
    assert not partial.exists()


def test_an_old_checkpoint_deletion_cut_short_never_leaves_half_a_checkpoint(tmp_path, monkeypatch):
    """checkpoint.keep=1: writing step 2 deletes step 1. The process dies (here: KeyboardInterrupt) after the first
    file of that deletion: no folder counted as a checkpoint may miss a file (it is renamed to .tmp- first)."""
    from rlx.runtime.checkpoint import verify_checkpoint

    acc, model, optimizer, scheduler = _setup()
    ckpt = Checkpointer(acc, tmp_path, every=1, keep=1, total_steps=10, resume=False)
    ckpt.restore(scheduler=scheduler)
    _step(model, optimizer)
    ckpt.step_done(1)

    def killed_midway(path, *args, **kwargs):
        next(Path(path).rglob("model.safetensors")).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", killed_midway)
    _step(model, optimizer)
    with pytest.raises(KeyboardInterrupt):
        ckpt.step_done(2)
    ckpt.close()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    for _, folder in list_checkpoints(tmp_path):
        verify_checkpoint(folder)


def test_the_error_line_names_what_survived_and_the_command(tmp_path):
    with pytest.raises(StorageError) as info:
        with writing(tmp_path / "checkpoints" / ".tmp-step_000004", "the checkpoint of step 4"):
            raise OSError(errno.ENOSPC, "No space left on device")
    info.value.survived, info.value.command = "earlier checkpoints are intact", f"rlx train resume={tmp_path}"
    assert str(info.value) == (
        f"no space left on the device (ENOSPC) while writing the checkpoint of step 4 to "
        f"{tmp_path}/checkpoints/.tmp-step_000004; earlier checkpoints are intact; free space on that disk (or move "
        f"the run to a roomier one), then run: rlx train resume={tmp_path}")


def test_what_survived_names_the_checkpoint_resume_uses(tmp_path):
    assert "no checkpoint had been written yet" in what_survived(tmp_path, 10)
    for step in (2, 4):
        folder = tmp_path / "checkpoints" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
    assert what_survived(tmp_path, 10) == (f"earlier checkpoints are intact: resume continues from step 4 "
                                           f"({tmp_path}/checkpoints/step_000004)")
    assert "resume writes what is missing (final/, result.json)" in what_survived(tmp_path, 4)


def test_a_log_file_on_a_full_disk_is_said_once(disk, capsys):
    """Hydra's train.log handler: without the guard each line logged on a full disk prints a
    `--- Logging error ---` traceback."""
    handler = logging.FileHandler(disk.path / "train.log", delay=True)
    logger = logging.getLogger("rlx.test_storage_log")
    logger.addHandler(handler)
    try:
        guard_log_files()
        disk.fill()
        for i in range(3):
            logger.warning("line %d", i)
    finally:
        logger.removeHandler(handler)
        handler.close()
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err
    assert err.count("warning: could not write train.log") == 1 and "(ENOSPC)" in err, err


def test_result_json_is_restored_from_the_last_evaluation(tmp_path):
    """A storage fault after final/ (result.json not written): `rlx train resume=` of the finished run writes it
    from metrics.jsonl, whose last row with eval/* values is the final evaluation (the loops evaluate at the
    last step and write that row)."""
    rows = [{"step": 0, "eval/accuracy": 0.1, "data/rows": 5}, {"step": 1, "train/loss": 0.3},
            {"step": 2, "eval/accuracy": 0.6, "eval/reward": 1.1, "train/loss": 0.2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert restore_result(tmp_path, "eval/accuracy")
    record = json.loads((tmp_path / "result.json").read_text())
    assert record == {"status": "ok", "optimized_metric": "eval/accuracy",
                      "metrics": {"eval/accuracy": 0.6, "eval/reward": 1.1}}
    assert not restore_result(tmp_path, "eval/accuracy")  # an existing result.json is never rewritten


# ---- real runs ----

TINY = ["steps=3", "prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=2", "eval.every=3",
        "checkpoint.every=1", "checkpoint.keep=3", "hardware.num_threads=1", "log.progress=false"]


def _error_lines(result):
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


@pytest.mark.long  # two real runs, ~30 s on the shared 2-core machine
def test_a_run_whose_disk_fills_mid_checkpoint_stops_in_one_line_and_resumes(tmp_path):
    """A 16 MiB tmpfs holds the run's files and step 1's checkpoint (10.5 MiB of model and optimizer state for the
    tiny model), not step 2's: the run stops with exit code 3 and one line; the printed command, run once the
    disk is larger, finishes the run."""
    disk = Disk(tmp_path / "disk", size_mb=16).mount()
    try:
        env = {"RLX_OUTPUTS": str(disk.path / "outputs")}
        result = run_rlx(["train", *TINY], tmp_path, timeout=300, env_extra=env)
        assert result.returncode == 3, result.stderr[-3000:]
        line = _error_lines(result)
        run = only_run_dir(disk.path)
        assert line.startswith("error: no space left on the device (ENOSPC) while writing the checkpoint of step 2 "
                               f"to {run}/checkpoints/.tmp-step_000002 (its partial folder was removed)"), line
        assert f"resume continues from step 1 ({run}/checkpoints/step_000001)" in line, line
        assert [s for s, _ in list_checkpoints(run)] == [1] and not list((run / "checkpoints").glob(".tmp-*"))
        command = re.search(r"then run: (rlx train resume=\S+)$", line).group(1)
        disk.remount("size=64m")
        resumed = run_rlx(command.split()[1:], tmp_path, timeout=300, env_extra=env)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert [s for s, _ in list_checkpoints(run)] == [1, 2, 3] and (run / "final" / "rlx_complete.json").is_file()
        assert json.loads((run / "result.json").read_text())["status"] == "ok"
    finally:
        disk.unmount()


def test_a_run_on_a_read_only_disk_is_one_line_before_anything_starts(tmp_path):
    disk = Disk(tmp_path / "disk", size_mb=4).mount()
    try:
        disk.read_only()
        result = run_rlx(["train", *TINY], tmp_path, timeout=300, env_extra={"RLX_OUTPUTS": str(disk.path / "outputs")})
        assert result.returncode == 3, result.stderr[-3000:]
        line = _error_lines(result)
        assert line == (f"error: the file system is read-only (EROFS) while writing the run directory to {disk.path}; "
                        "make it writable again (or copy the run directory to a writable disk and resume the copy)")
    finally:
        disk.unmount()
