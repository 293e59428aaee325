"""Faults never destroy or silently change a run: finished runs, final/, the run lock, resume overrides,
damaged checkpoints, a full disk, half-written metrics and non-finite numbers (issue 17)."""

import errno
import hashlib
import json
import logging
import math
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rlx.errors import CheckpointDamaged, NonFiniteError, RunInUse, StorageError
from rlx.runtime.checkpoint import Checkpointer, list_checkpoints, truncate_metrics, what_survived
from rlx.runtime.optim import optimizer_step
from rlx.runtime.rundir import MetricsLog, RunLock, read_metrics
from tests.conftest import only_run_dir, run_rlx

TINY = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=2", "eval.every=2",
        "checkpoint.every=1", "checkpoint.keep=3", "hardware.num_threads=1", "save.plot=false", "log.progress=false",
        "log.samples_every=0"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One real 2-step GRPO run on the tiny model (~10 s), copied by each test that changes it."""
    where = tmp_path_factory.mktemp("finished")
    result = run_rlx(["train", *TINY], where, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(where)


def _copy(run, tmp_path):
    target = tmp_path / "outputs" / "train" / run.name
    shutil.copytree(run, target)
    return target


def _snapshot(run, everything=False):
    """Every file of the run -> sha256 (unless `everything`: not the lock and Hydra's log and config copies)."""
    skip = () if everything else (".lock", "train.log")
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name not in skip and (everything or ".hydra" not in p.parts)}


def _one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---- finished runs and final/ ----

def test_resuming_a_finished_run_changes_nothing(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    before = _snapshot(run)
    assert json.loads((run / "result.json").read_text())["metrics"]  # the real final metrics
    result = run_rlx(["train", f"resume={run}"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already finished" in result.stdout + result.stderr
    assert _snapshot(run) == before  # result.json keeps its metrics; nothing rewritten


def test_a_partial_final_is_rebuilt_from_the_last_checkpoint(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    want = load_file(run / "final" / "model.safetensors")
    shutil.rmtree(run / "final")
    (run / "final").mkdir()  # what a kill during the old save_final left behind (a missing one is the same case)
    metrics_before = (run / "metrics.jsonl").read_text()
    result = run_rlx(["train", f"resume={run}"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rebuilding it from checkpoint step 2" in result.stdout + result.stderr
    got = load_file(run / "final" / "model.safetensors")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert (run / "metrics.jsonl").read_text() == metrics_before
    assert json.loads((run / "result.json").read_text())["metrics"]
    assert not list(run.glob(".tmp-final*"))


# ---- resume overrides ----

@pytest.mark.parametrize("override,key", [
    ("algorithm=sft", "algorithm.family"), ("seed=7", "seed"), ("model.lora.enabled=true", "model.lora.enabled"),
    ("model=tiny_scratch", "model"),
])
def test_incompatible_resume_overrides_are_refused_before_anything_is_written(finished_run, tmp_path, override, key):
    run = _copy(finished_run, tmp_path)
    before = _snapshot(run, everything=True)
    result = run_rlx(["train", f"resume={run}", override, "steps=4"], tmp_path, timeout=120)
    _one_line_error(result, "resume cannot change", key)
    assert _snapshot(run, everything=True) == before  # not even Hydra's copies or the log


def test_compatible_resume_overrides_are_applied_and_recorded_with_their_step(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    result = run_rlx(["train", f"resume={run}", "steps=3", "optim.lr=0.125", "optim.warmup_steps=0",
                      "optim.schedule=constant"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["train/lr"] == pytest.approx(0.125)  # the new rate, not the restored scheduler's
    records = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["checkpoint_step"] == 2 and records[0]["from_step"] == 3
    assert records[0]["changed"]["optim.lr"][1] == 0.125 and records[0]["changed"]["steps"] == [2, 3]
    assert "steps=3" in yaml.safe_load((run / "overrides.yaml").read_text())


# ---- the run lock ----

def test_a_second_process_on_the_same_run_is_refused_naming_the_holder(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    lock = RunLock(run).acquire()
    before = _snapshot(run, everything=True)  # this test process plays the running trainer
    try:
        result = run_rlx(["train", f"resume={run}", "steps=4"], tmp_path, timeout=120)
    finally:
        lock.release()
    import os

    _one_line_error(result, "is in use by", f"pid {os.getpid()}")
    assert _snapshot(run, everything=True) == before


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    (tmp_path / ".lock").write_text("pid 999999999 on gone-host since 2026-01-01 00:00:00\n")
    lock = RunLock(tmp_path).acquire()  # no live flock: taken over
    assert f"pid {__import__('os').getpid()}" in (tmp_path / ".lock").read_text()
    with pytest.raises(RunInUse, match="is in use by pid"):
        RunLock(tmp_path).acquire()
    lock.release()
    RunLock(tmp_path).acquire().release()


# ---- metrics files ----

def test_a_half_written_last_metrics_line_is_dropped_on_resume(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "x": 1.0}) + "\n" + json.dumps({"step": 1, "x": 2.0}) + "\n"
                    + '{"step": 2, "x"')
    with caplog.at_level(logging.WARNING, logger="rlx"):
        assert [r["step"] for r in read_metrics(path)] == [0, 1]
        assert truncate_metrics(path, 5) == 2
    assert "cut short" in caplog.text
    assert path.read_text().endswith("}\n") and len(path.read_text().splitlines()) == 2
    path.write_text('{"step": 0}\n{"step": 1, "x\n{"step": 2}\n')  # damage in the middle is not a crash artefact
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)


def test_non_finite_metrics_stay_visible_and_never_break_the_console(tmp_path, caplog):
    log = MetricsLog(tmp_path, total_steps=2, progress=False)
    with caplog.at_level(logging.INFO, logger="rlx"):
        log.write(1, {"train/loss": float("nan"), "reward/total": torch.tensor(float("inf")), "eval/accuracy": None})
        log.show(1, {"train/loss": float("nan"), "reward/total": float("-inf"), "eval/accuracy": "n/a"})
    row = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert math.isnan(row["train/loss"]) and row["reward/total"] == math.inf and row["eval/accuracy"] is None
    assert "loss nan" in caplog.text and "reward -inf" in caplog.text


# ---- checkpoints: checksums, damage, disk full, non-finite weights ----

def _setup(seed=0):
    from accelerate import Accelerator

    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    acc = Accelerator(cpu=True)
    model, optimizer = acc.prepare(model, optimizer)
    return acc, model, optimizer, scheduler


def _step(model, optimizer):
    model(torch.randn(4, 3)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _three_checkpoints(tmp_path):
    acc, model, optimizer, scheduler = _setup()
    ckpt = Checkpointer(acc, tmp_path, every=1, keep=5, total_steps=10, resume=False)
    ckpt.restore(scheduler=scheduler)
    weights = {}
    for step in (1, 2, 3):
        _step(model, optimizer)
        ckpt.step_done(step)
        weights[step] = [p.detach().clone() for p in model.parameters()]
    ckpt.close()
    return weights


def _restore(tmp_path):
    acc, model, optimizer, scheduler = _setup(seed=5)
    ckpt = Checkpointer(acc, tmp_path, every=1, keep=5, total_steps=10, resume=True)
    try:
        return ckpt.restore(scheduler=scheduler), [p.detach() for p in model.parameters()]
    finally:
        ckpt.close()


def test_checkpoints_record_checksums_of_every_file(tmp_path):
    _three_checkpoints(tmp_path)
    folder = list_checkpoints(tmp_path)[-1][1]
    recorded = json.loads((folder / "checksums.json").read_text())
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"checksums.json"}
    assert set(recorded) == files and {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= files
    assert recorded["model.safetensors"]["sha256"] == hashlib.sha256((folder
                                                                      / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize("damage",
                         ["truncate:model.safetensors", "delete:optimizer.bin", "flip:custom_checkpoint_0.pkl",
                                    "delete:random_states_0.pkl", "delete:checksums.json+trainer_state"])
def test_a_damaged_latest_checkpoint_is_named_and_the_previous_one_used(tmp_path, caplog, damage):
    weights = _three_checkpoints(tmp_path)
    latest = list_checkpoints(tmp_path)[-1][1]
    how, name = damage.split(":")
    if name == "checksums.json+trainer_state":  # an incomplete folder is not a checkpoint at all
        (latest / "trainer_state.json").unlink()
        name = "trainer_state.json"
    target = latest / name
    if how == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif how == "delete" and target.exists():
        target.unlink()
    elif how == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="rlx"):
        step, params = _restore(tmp_path)
    assert step == 2
    assert all(torch.equal(a, b) for a, b in zip(params, weights[2]))
    if name != "trainer_state.json":
        assert "step 3 is damaged" in caplog.text and name in caplog.text


def test_an_rng_state_that_fails_to_load_is_never_swallowed(tmp_path, caplog):
    """Accelerate logs 'Could not load random states' at INFO and carries on: the checkpoint must not count,
    even when its checksums were recorded over the broken file."""
    from rlx.runtime.checkpoint import write_checksums

    _three_checkpoints(tmp_path)
    latest = list_checkpoints(tmp_path)[-1][1]
    (latest / "random_states_0.pkl").write_bytes(b"not a pickle")
    (latest / "checksums.json").unlink()
    write_checksums(latest)
    with caplog.at_level(logging.WARNING, logger="rlx"):
        step, _ = _restore(tmp_path)
    assert step == 2 and "random_states_0.pkl" in caplog.text


def test_no_loadable_checkpoint_is_one_error(tmp_path):
    _three_checkpoints(tmp_path)
    for _, folder in list_checkpoints(tmp_path):
        (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointDamaged, match="no checkpoint of .* loads"):
        _restore(tmp_path)


def test_disk_full_while_checkpointing_removes_the_partial_folder_and_keeps_earlier_ones(tmp_path):
    acc, model, optimizer, scheduler = _setup()
    ckpt = Checkpointer(acc, tmp_path, every=1, keep=5, total_steps=10, resume=False)
    ckpt.restore(scheduler=scheduler)
    _step(model, optimizer)
    ckpt.step_done(1)
    earlier = _snapshot(tmp_path / "checkpoints")
    real_save = acc.save_state

    def full_disk(output_dir, **kwargs):
        real_save(output_dir, **kwargs)  # most files land, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    acc.save_state = full_disk
    _step(model, optimizer)
    with pytest.raises(StorageError) as info:
        ckpt.step_done(2)
    # as rlx train
    info.value.survived, info.value.command = what_survived(tmp_path, 10), f"rlx train resume={tmp_path}"
    message = str(info.value)
    assert "no space left on the device (ENOSPC)" in message and f"rlx train resume={tmp_path}" in message
    assert "checkpoint of step 2" in message and "resume continues from step 1" in message and "\n" not in message
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert _snapshot(tmp_path / "checkpoints") == earlier


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    acc, model, optimizer, scheduler = _setup()
    ckpt = Checkpointer(acc, tmp_path, every=1, keep=5, total_steps=10, resume=False)
    ckpt.restore(scheduler=scheduler)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="weight"):
        ckpt.step_done(1)
    ckpt.close()
    assert not list_checkpoints(tmp_path) and not list((tmp_path / "checkpoints").glob("*"))


@pytest.mark.parametrize("max_grad_norm", [1.0, None])
def test_a_non_finite_gradient_stops_before_the_optimizer_step(tmp_path, max_grad_norm):
    acc, model, optimizer, scheduler = _setup()
    ckpt = Checkpointer(acc, tmp_path, every=100, keep=5, total_steps=10, resume=False)
    ckpt.restore(scheduler=scheduler)  # step 1 is in progress
    ckpt.close()
    before = [p.detach().clone() for p in model.parameters()]
    (model(torch.randn(2, 3)).sum() * float("nan")).backward()
    with pytest.raises(NonFiniteError) as info:
        optimizer_step(acc, model, optimizer, scheduler, max_grad_norm)
    assert "at step 1" in str(info.value) and "gradient norm" in str(info.value)
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    assert scheduler.last_epoch == 0


# ---- collapse and no-signal warnings ----

def test_no_signal_and_entropy_collapse_are_each_said_once(tmp_path, caplog):
    log = MetricsLog(tmp_path, total_steps=20, progress=False)
    with caplog.at_level(logging.WARNING, logger="rlx"):
        for step in range(1, 4):  # a short streak is not worth a warning
            log.show(step, {"train/frac_zero_std_groups": 1.0, "train/entropy": 0.5})
        log.show(4, {"train/frac_zero_std_groups": 0.5, "train/entropy": 0.5})
        assert "identical rewards" not in caplog.text
        for step in range(5, 20):
            log.show(step, {"train/frac_zero_std_groups": 1.0, "train/entropy": 0.001})
    assert caplog.text.count("identical rewards") == 1 and "rollout.temperature" in caplog.text
    assert caplog.text.count("entropy stayed below") == 1
    assert "step 9: every group" in caplog.text  # steps 5..9 are the five in a row
