"""Multi-process fault paths (issue 17): with `hardware=ddp hardware.num_processes=2` on gloo, a worker that fails
stops the whole run with one `error:` line (no traceback, no hang), leaves no process behind, keeps its
checkpoints, and the run resumes. Also SIGTERM to the `rlx train` process that launched the workers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlx.runtime.checkpoint import list_checkpoints
from tests.conftest import REPO, only_run_dir, run_rlx

pytestmark = pytest.mark.long  # ~1-2 min each on 2 busy cores: two or three 2-process runs

DDP = ["hardware=ddp", "hardware.num_processes=2", "hardware.cpu=true", "hardware.mixed_precision=no", "steps=4",
       "prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=2", "eval.every=0", "eval.at_start=false",
       "checkpoint.every=1", "checkpoint.keep=5", "hardware.num_threads=1", "save.plot=false", "log.progress=false",
       "log.samples_every=0"]


def _reward(function):
    return [f"+reward.components.probe._target_=tests.helpers.{function}", "+reward.components.probe.weight=1.0"]


def _processes_of(run: Path) -> list[int]:
    """Live processes whose command line names the run directory (the workers carry hydra.run.dir=<run>)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and str(run) in cmdline and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def _assert_stopped_cleanly_and_resumes(tmp_path, result, checkpoints):
    run = only_run_dir(tmp_path)
    assert _processes_of(run) == []
    assert [step for step, _ in list_checkpoints(run)] == checkpoints
    assert f"continue with: rlx train resume={run}" in result.stderr
    resumed = run_rlx(["train", f"resume={run}"], tmp_path)  # the fault is gone (no RLX_TEST_FAIL_FROM_CALL)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [step for step, _ in list_checkpoints(run)] == [*checkpoints, *range(checkpoints[-1] + 1, 5)]
    assert (run / "final" / "model.safetensors").is_file()
    steps = [json.loads(line).get("step") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({s for s in steps if s is not None}) == [1, 2, 3, 4]


def test_an_exception_on_one_rank_stops_the_run_with_one_line(tmp_path):
    # rank 1's reward raises from its third call (step 3); rank 0 meanwhile waits in a collective
    result = run_rlx(["train", *DDP, *_reward("fail_on_rank_one")], tmp_path,
                     env_extra={"RLX_TEST_FAIL_FROM_CALL": "3"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "reward crashed on rank 1 only" in _one_error_line(result.stderr)
    _assert_stopped_cleanly_and_resumes(tmp_path, result, [1, 2])


def test_a_non_finite_loss_on_one_rank_stops_every_rank_with_one_line(tmp_path):
    result = run_rlx(["train", *DDP, *_reward("nan_on_rank_one")], tmp_path, env_extra={"RLX_TEST_FAIL_FROM_CALL": "3"})
    assert result.returncode == 1, result.stderr[-3000:]
    line = _one_error_line(result.stderr)  # both ranks find it after the gradient all-reduce: said once
    assert "step 3" in line and ("NaN" in line or "non-finite" in line or "inf" in line), line
    _assert_stopped_cleanly_and_resumes(tmp_path, result, [1, 2])


@pytest.mark.slow  # in CI (make test-slow)
def test_a_rank_killed_without_a_word_is_named_with_its_signal(tmp_path):
    result = run_rlx(["train", *DDP, *_reward("killed_on_rank_one")], tmp_path,
                     env_extra={"RLX_TEST_FAIL_FROM_CALL": "3"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "rank 1 was killed by signal 9" in _one_error_line(result.stderr)
    run = only_run_dir(tmp_path)
    assert _processes_of(run) == []
    assert [step for step, _ in list_checkpoints(run)] == [1, 2]


def test_sigterm_to_the_launching_process_checkpoints_and_leaves_nothing_behind(tmp_path):
    env = dict(os.environ, RLX_OUTPUTS=str(tmp_path / "outputs"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=str(REPO))
    parent = subprocess.Popen([sys.executable, "-m", "rlx", "train", *DDP, "steps=50"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not list((tmp_path / "outputs" / "train").glob("*/checkpoints/step_000001")):
            assert parent.poll() is None, parent.stderr.read()[-3000:]
            time.sleep(0.2)
        parent.send_signal(signal.SIGTERM)  # only this process: the workers must hear it from it
        _, stderr = parent.communicate(timeout=300)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 130, stderr[-3000:]
    run = only_run_dir(tmp_path)
    assert _processes_of(run) == []
    stopped_at = max(step for step, _ in list_checkpoints(run))
    assert 1 <= stopped_at < 50
    resumed = run_rlx(["train", f"resume={run}", f"steps={stopped_at + 1}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert max(step for step, _ in list_checkpoints(run)) == stopped_at + 1
