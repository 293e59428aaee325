"""Checkpoints (atomic, last K kept, exact restore), resume, the batch arithmetic check, Ctrl-C and SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlx.config.overrides import check_overrides
from rlx.config.rules import check_batch
from rlx.config.settings import checked_settings
from rlx.data.sources import PromptStream
from rlx.errors import UserError
from rlx.runtime.checkpoint import Checkpointer, GeneratorState, list_checkpoints, truncate_metrics
from rlx.runtime.launch import resolve_resume
from rlx.runtime.rundir import read_metrics
from tests.conftest import REPO, only_run_dir, run_rlx


def _tiny_setup(seed):
    from accelerate import Accelerator

    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    acc = Accelerator(cpu=True)
    model, optimizer = acc.prepare(model, optimizer)
    return acc, model, optimizer, scheduler


def _train_step(model, optimizer, scheduler, stream):
    batch = torch.tensor([float(len(r)) for r in stream.take(2)]).repeat(3, 1).T  # (2, 3) from the data
    loss = model(batch + torch.randn(2, 3)).pow(2).mean()  # the global torch RNG takes part in the step
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_checkpoints_keep_last_k_ignore_partial_and_restore_exactly(tmp_path):
    rows = ["a", "bb", "ccc", "dddd", "eeeee"]
    acc, model, optimizer, scheduler = _tiny_setup(0)
    stream, gen = PromptStream(rows, 0), torch.Generator().manual_seed(1)
    ckpt = Checkpointer(acc, tmp_path, every=1, keep=2, total_steps=10, resume=False)
    assert ckpt.restore(scheduler=scheduler, data=stream, shuffle=GeneratorState(gen)) == 0
    for step in range(1, 4):
        _train_step(model, optimizer, scheduler, stream)
        ckpt.step_done(step)
    ckpt.close()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]  # keep=2
    # a crash mid-write leaves a .tmp- folder, even one holding every file, that never counts
    partial = tmp_path / "checkpoints" / ".tmp-step_000004"
    partial.mkdir()
    (partial / "trainer_state.json").write_text("{}")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    # continue the original two more steps: the reference
    _train_step(model, optimizer, scheduler, stream)
    _train_step(model, optimizer, scheduler, stream)
    expected = [p.detach().clone() for p in model.parameters()]

    acc2, model2, optimizer2, scheduler2 = _tiny_setup(99)  # different initial weights and RNG
    stream2, gen2 = PromptStream(rows, 0), torch.Generator().manual_seed(7)
    resumed = Checkpointer(acc2, tmp_path, every=1, keep=2, total_steps=10, resume=True)
    assert resumed.restore(scheduler=scheduler2, data=stream2, shuffle=GeneratorState(gen2)) == 3
    resumed.close()
    assert stream2.state_dict() == {"epoch": 1, "index": 1}  # 6 rows taken from 5: one into the second epoch
    assert torch.equal(gen2.get_state(), gen.get_state())
    assert scheduler2.last_epoch == 3
    _train_step(model2, optimizer2, scheduler2, stream2)  # without the restored RNG the noise would differ
    _train_step(model2, optimizer2, scheduler2, stream2)
    for got, want in zip(model2.parameters(), expected):
        assert torch.equal(got.detach(), want)


def test_truncate_metrics_drops_rows_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s * 1.5}) + "\n" for s in (0, 1, 2, 3, 4)))
    assert truncate_metrics(path, 2) == 3
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]


def _cfg(*overrides):
    return check_overrides(list(overrides))


@pytest.mark.parametrize(
    "overrides,processes,needle",
    [
        (["prompts_per_step=3"], 2, "make prompts_per_step a multiple of 2"),
        (["prompts_per_step=4", "rollout.samples_per_prompt=3", "algorithm.mini_batches=4"], 2,
         "algorithm.mini_batches=4 does not divide"),
        (["prompts_per_step=4", "rollout.samples_per_prompt=4", "hardware.gradient_accumulation_steps=3",
          "micro_batch_size=2"], 2, "gradient_accumulation_steps=3 x micro_batch_size=2 must equal"),
        (["algorithm=sft", "algorithm.batch_size=5"], 2, "algorithm.batch_size=5 does not split over 2"),
    ],
)
def test_batch_arithmetic_names_the_numbers_to_change(overrides, processes, needle):
    with pytest.raises(UserError) as info:
        check_batch(checked_settings(_cfg(*overrides)), processes)
    assert needle in str(info.value)


def test_batch_arithmetic_accepts_even_splits():
    check_batch(checked_settings(_cfg("prompts_per_step=4", "rollout.samples_per_prompt=4",
                                      "hardware.gradient_accumulation_steps=2",
                     "micro_batch_size=4")), 2)  # 2 prompts x 4 samples = 8 per process = 2 x 4
    check_batch(checked_settings(_cfg("algorithm=sft", "algorithm.batch_size=8")), 4)


def _fake_run(tmp_path, overrides, step):
    run = tmp_path / "outputs" / "train" / "2026-01-01_00-00-00.000000_grpo"
    (run / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
    (run / "checkpoints" / f"step_{step:06d}" / "trainer_state.json").write_text(json.dumps({"step": step}))
    (run / "config.yaml").write_text("name: grpo\n")
    (run / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    return run


def test_resume_reuses_the_run_overrides_and_directory(tmp_path, monkeypatch):
    run = _fake_run(tmp_path, ["steps=2", "seed=4", "resume=old"], 2)
    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))
    args = resolve_resume([f"resume={run}", "steps=5"])
    assert args[:2] == ["seed=4", "steps=5"]  # saved overrides first; the new steps replaces the saved one
    assert args[2:] == [f"resume='{run.resolve()}'", f"hydra.run.dir='{run.resolve()}'"]
    assert resolve_resume(["resume=auto"])[-1] == f"hydra.run.dir='{run.resolve()}'"
    assert resolve_resume(["seed=1"]) == ["seed=1"]
    assert resolve_resume([f"resume='{run}'"])[-1] == f"hydra.run.dir='{run.resolve()}'"  # quoted as Hydra allows
    monkeypatch.setenv("RLX_RUN_DIR", str(run))  # a worker of a multi-process run: already resolved by its parent
    assert resolve_resume([f"resume='{run}'", "seed=1"]) == [f"resume='{run}'", "seed=1"]


def test_resume_of_a_finished_run_exits_0_without_training(tmp_path):
    run = _fake_run(tmp_path, ["steps=2"], 2)
    (run / "final").mkdir()
    (run / "final" / "rlx_complete.json").write_text("{}")  # a complete final/: nothing to rebuild
    result = run_rlx(["train", f"resume={run}"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "already finished" in result.stdout + result.stderr
    assert not (run / "metrics.jsonl").exists() and not (run / "result.json").exists()
    bad = run_rlx(["train", f"resume={tmp_path}"], tmp_path, timeout=120)
    assert bad.returncode == 2 and "is not a run directory" in bad.stderr and "Traceback" not in bad.stderr


# ---- long checks (make test-slow): real runs killed and resumed ----

RUN = ["prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=4", "eval.every=3", "checkpoint.every=2",
       "hardware.num_threads=1", "save.plot=false", "log.samples_every=0", "log.progress=false"]


def _popen(args, tmp_path):
    env = dict(os.environ, RLX_OUTPUTS=str(tmp_path / "outputs"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "rlx", "train", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_step(process, tmp_path, step, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = list((tmp_path / "outputs" / "train").glob("*")) if (tmp_path / "outputs" / "train").exists() else []
        if runs and any(r["step"] >= step for r in read_metrics(runs[0] / "metrics.jsonl")):
            return runs[0]
        assert process.poll() is None, process.stdout.read()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no metrics row for step {step} within {timeout} s")


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "time"} for r in rows]


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    steps = ["steps=8"]
    (tmp_path / "full").mkdir()
    full = run_rlx(["train", *RUN, *steps], tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    full_run = only_run_dir(tmp_path / "full")

    (tmp_path / "cut").mkdir()
    process = _popen([*RUN, *steps], tmp_path / "cut")
    run = _wait_for_step(process, tmp_path / "cut", 3)  # past the first checkpoint (step 2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = read_metrics(run / "metrics.jsonl")[-1]["step"]
    assert killed_at < 8, "the run finished before it could be killed"
    assert list_checkpoints(run), "no checkpoint was written before the kill"

    resumed = run_rlx(["train", f"resume={run}"], tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _comparable(read_metrics(run / "metrics.jsonl")) == _comparable(read_metrics(full_run / "metrics.jsonl"))
    want, got = load_file(full_run / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    for key in want:
        assert torch.equal(want[key], got[key]), key
    again = run_rlx(["train", f"resume={run}"], tmp_path / "cut")
    assert again.returncode == 0 and "already finished" in again.stdout + again.stderr


@pytest.mark.long
def test_ctrl_c_writes_a_checkpoint_and_resume_finishes(tmp_path):
    args = [*RUN, "steps=6", "checkpoint.every=0"]  # only the Ctrl-C checkpoint and the final one
    process = _popen(args, tmp_path)
    run = _wait_for_step(process, tmp_path, 1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "resume=" in output
    stopped = list_checkpoints(run)
    assert len(stopped) == 1 and stopped[0][0] < 6
    assert read_metrics(run / "metrics.jsonl")[-1]["step"] == stopped[0][0]
    resumed = run_rlx(["train", "resume=auto"], tmp_path)  # the latest run named grpo
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(0, 7))


def stream_state(checkpoint):
    """The prompt stream's saved position: the registered object whose state has an epoch and an index (its
    custom_checkpoint_N number depends on what else the loop registers)."""
    states = [torch.load(f, weights_only=False) for f in sorted(checkpoint.glob("custom_checkpoint_*.pkl"))]
    (state,) = [s for s in states if isinstance(s, dict) and {"epoch", "index"} <= set(s)]
    return state


@pytest.mark.long
def test_resume_across_a_data_epoch_boundary(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) + "\n" for i in range(12)))
    args = [*RUN, "data=file", f"data.train_path={data}", "data.eval_size=4", "steps=4", "checkpoint.every=2"]
    first = run_rlx(["train", *args, "steps=2"], tmp_path)  # 2 steps x 2 prompts = 4 rows; 8 training rows left
    assert first.returncode == 0, first.stderr[-3000:]
    run = only_run_dir(tmp_path)
    state = stream_state(list_checkpoints(run)[-1][1])
    assert state == {"epoch": 0, "index": 4}
    more = run_rlx(["train", f"resume={run}", "steps=6"], tmp_path)  # crosses the end of the 8-row epoch
    assert more.returncode == 0, more.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(0, 7))
    state = stream_state(list_checkpoints(run)[-1][1])
    assert state == {"epoch": 1, "index": 4}


@pytest.mark.parametrize("content", [b"\x00\x01garbage", b"- a list\n- not settings\n"])
def test_resume_of_a_run_with_a_damaged_config_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, content):
    run = _fake_run(tmp_path, ["steps=2"], 1)
    (run / "config.yaml").write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        resolve_resume([f"resume={run}"])
    assert exit_info.value.code == 2
    assert f"error: {run / 'config.yaml'} is damaged (" in capsys.readouterr().err


def test_resume_of_a_run_saved_with_another_familys_knob_leaves_it_out(tmp_path, monkeypatch):
    """Runs made when grpo.yaml still carried PPO's critic knobs could pass `algorithm.vf_coef=...` to grpo
    (no effect); grpo's schema now refuses it, so a resume drops the saved override instead of failing."""
    from rlx.config.overrides import check_overrides
    from rlx.config.rules import check_settings

    run = _fake_run(tmp_path, ["algorithm=grpo", "algorithm.value_model=builtin:tiny", "algorithm.vf_coef=0.1",
                               "algorithm.clip_high=0.28", "steps=2"], 2)
    (run / "config.yaml").write_text("name: grpo\nalgorithm: {name: grpo, family: policy_gradient, vf_coef: 0.1,"
                                     " value_model: builtin:tiny, gamma: 1.0}\n")
    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))
    args = resolve_resume([f"resume={run}"])
    assert args[:3] == ["algorithm=grpo", "algorithm.clip_high=0.28", "steps=2"]
    check_settings(checked_settings(check_overrides(args[:3])))  # what the resumed run composes passes grpo's schema
    ppo = _fake_run(tmp_path / "ppo", ["algorithm=ppo", "algorithm.vf_coef=0.1"], 2)
    (ppo / "config.yaml").write_text("algorithm: {name: ppo, family: ppo}\n")
    assert resolve_resume([f"resume={ppo}"])[:2] == ["algorithm=ppo", "algorithm.vf_coef=0.1"]  # its own knob stays


@pytest.mark.long
def test_a_grpo_run_saved_with_the_old_critic_knobs_resumes(tmp_path):
    """A real run whose config.yaml and overrides.yaml have the shape of runs made before grpo.yaml lost the
    critic's knobs (they sat in every policy-gradient config, and could be overridden) resumes and finishes."""
    first = run_rlx(["train", *RUN, "steps=2", "save.final=false"], tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    run = only_run_dir(tmp_path)
    config = OmegaConf.load(run / "config.yaml")
    config.algorithm.update({"value_model": None, "value_lr": None, "value_lr_ratio": 5.0, "vf_coef": 0.5,
                             "value_clip": 0.2, "gamma": 1.0, "lam": 0.95, "whiten_advantages": True})
    OmegaConf.save(config, run / "config.yaml")
    saved = OmegaConf.to_container(OmegaConf.load(run / "overrides.yaml"))
    OmegaConf.save(OmegaConf.create([*saved, "algorithm.vf_coef=0.1"]), run / "overrides.yaml")
    resumed = run_rlx(["train", f"resume={run}", "steps=3"], tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "train/loss" in r] == [1, 2, 3]


def test_at_end_false_skips_only_the_last_steps_checkpoint(tmp_path):
    """checkpoint.at_end=false (sweeps that need scores, not resumable state): the periodic checkpoints are
    written as before, the one at the last step is not; at_end=true (the default) writes it."""
    for at_end, want in ((True, [2, 3]), (False, [2])):
        acc, model, optimizer, scheduler = _tiny_setup(0)
        stream = PromptStream(["a", "bb"], 0)
        run = tmp_path / str(at_end)
        ckpt = Checkpointer(acc, run, every=2, keep=5, total_steps=3, resume=False, at_end=at_end)
        ckpt.restore(scheduler=scheduler, data=stream)
        for step in range(1, 4):
            _train_step(model, optimizer, scheduler, stream)
            ckpt.step_done(step)
        ckpt.close()
        assert [s for s, _ in list_checkpoints(run)] == want


def test_resume_of_a_run_finished_without_its_last_checkpoint_neither_retrains_nor_extends(tmp_path):
    """checkpoint.at_end=false: the finished run has result.json and final/ but no checkpoint of its last step.
    Resuming it trains nothing (not from step 0 over its files); asking for more steps stops with one line."""
    run = tmp_path / "outputs" / "train" / "2026-01-01_00-00-00.000000_grpo"
    (run / "final").mkdir(parents=True)
    (run / "final" / "rlx_complete.json").write_text("{}")
    (run / "config.yaml").write_text("name: grpo\nsteps: 2\ncheckpoint:\n  at_end: false\n")
    (run / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(["steps=2", "checkpoint.at_end=false"])))
    (run / "result.json").write_text(json.dumps({"metrics": {"eval/accuracy": 0.5}}))
    result = run_rlx(["train", f"resume={run}"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "already finished" in result.stdout + result.stderr
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    longer = run_rlx(["train", f"resume={run}", "steps=4"], tmp_path, timeout=300)
    assert longer.returncode == 2 and "checkpoint.at_end=false" in longer.stderr and "Traceback" not in longer.stderr
    assert not (run / "metrics.jsonl").exists()


MIXTURE = ["data=reasoning_gym", "data.task=[chain_sum,leg_counting]", "data.train_size=64", "data.eval_size=8",
           "mixture.rule=recap", "mixture.window=4", "steps=4", "prompts_per_step=4", "rollout.samples_per_prompt=4",
           "eval.size=4", "eval.every=0", "eval.at_start=false", "checkpoint.every=2", "checkpoint.keep=2",
           "save.final=false", "save.plot=false", "log.samples_every=0", "log.progress=false",
           "hardware.num_threads=1"]


def test_a_recap_mixture_run_logs_moving_weights_and_resumes_exactly(tmp_path):
    """Two reasoning-gym objectives on the tiny model, weights moved online: every step logs each objective's weight
    and signals under stable names, the weights move, and a run resumed from its step-2 checkpoint (the mixer's
    windows restored with it) logs the same rows as the straight run, bit for bit."""
    import shutil

    (tmp_path / "straight").mkdir()
    straight = run_rlx(["train", *MIXTURE], tmp_path / "straight", timeout=600)
    assert straight.returncode == 0, straight.stderr[-3000:]
    run = only_run_dir(tmp_path / "straight")
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    names = {f"mixture/{kind}/{task}" for kind in ("weight", "signal") for task in ("chain_sum", "leg_counting")}
    for row in rows:
        logged = {k for k in row if k.startswith("mixture/")}
        assert {f"mixture/weight/{t}" for t in ("chain_sum", "leg_counting")} <= logged
        assert {f"mixture/signal/{t}/{s}" for t in ("chain_sum", "leg_counting")
                for s in ("convergence", "instability")} <= logged
        assert all(any(k.startswith(n) for n in names) for k in logged)
        assert sum(row[f"mixture/weight/{t}"] for t in ("chain_sum", "leg_counting")) == pytest.approx(2.0)
    weights = [row["mixture/weight/chain_sum"] for row in rows]
    assert weights[0] == 1.0 and max(abs(w - 1.0) for w in weights) > 0.05, weights  # equal at first, then moved

    resumed_run = tmp_path / "resumed" / run.name
    shutil.copytree(run, resumed_run)
    shutil.rmtree(resumed_run / "checkpoints" / "step_000004")  # as if killed during step 3 or 4
    (resumed_run / "result.json").unlink()
    resumed = run_rlx(["train", f"resume={resumed_run}"], tmp_path / "resumed", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr + resumed.stdout
    assert _comparable(read_metrics(resumed_run / "metrics.jsonl")) == _comparable(rows)
