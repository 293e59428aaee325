"""README commands a new user runs first: reasoning-gym tasks, rlx eval of a checkpoint and of a LoRA
run (moved elsewhere), resume=auto, hardware=gpu on a machine without one."""

import json
import shutil

import pytest
import torch
from omegaconf import OmegaConf

from rlx.runtime.launch import resolve_resume
from tests.conftest import only_run_dir, run_rlx

TINY = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=4", "eval.every=2",
        "rollout.max_new_tokens=8", "log.samples_every=0", "save.plot=false", "hardware.num_threads=1"]
EVAL = ["limit=3", "sampling.n=0", "plot=false", "hardware.num_threads=1"]


@pytest.mark.long  # three 1-step trials in one process (~1 min on 2 busy cores)
def test_reasoning_gym_tasks_train(tmp_path):
    result = run_rlx(["train", "-m", "data=reasoning_gym", "data.task=leg_counting,gcd,basic_arithmetic", "steps=1",
                      "data.train_size=40", "data.eval_size=4", *[a for a in TINY if not a.startswith("steps=")],
                      "save.final=false"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "multirun").iterdir()
    tasks = {OmegaConf.load(p).data.task for p in sweep.glob("*/config.yaml")}
    assert tasks == {"leg_counting", "gcd", "basic_arithmetic"}
    assert len(list(sweep.glob("*/result.json"))) == 3 and not list(sweep.glob("*/failure.json"))


def test_reasoning_gym_config_has_no_chain_sum_options():
    from rlx.config.overrides import check_overrides

    cfg = check_overrides(["data=reasoning_gym", "data.task=gcd"])
    assert cfg.data.task_config is None and cfg.data.name == "gcd"


@pytest.mark.long  # a 2-step run and three evaluations each (~1.5 min on 2 busy cores)
@pytest.mark.parametrize("lora", [False, True])
def test_eval_of_a_checkpoint_and_of_the_final_model_of_a_moved_run(tmp_path, lora):
    extra = ["model.lora.enabled=true", "model.lora.rank=4", "optim.lr=1e-2"] if lora else []
    result = run_rlx(["train", *TINY, "checkpoint.every=1", "checkpoint.keep=2", *extra], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    if lora:
        adapter = json.loads((run / "final" / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == "builtin:tiny"  # no absolute path to the loaded folder
    moved = tmp_path / "moved" / run.name
    shutil.move(str(run), moved)
    for checkpoint in ("step_1", "step_000002", "final"):
        evaluated = run_rlx(["eval", f"run={moved}", f"checkpoint={checkpoint}", *EVAL], tmp_path)
        assert evaluated.returncode == 0, f"{checkpoint}: {evaluated.stderr[-3000:]}"
    summaries = sorted((tmp_path / "outputs" / "eval").glob("*/summary.json"))
    assert len(summaries) == 3
    missing = run_rlx(["eval", f"run={moved}", "checkpoint=step_7", *EVAL], tmp_path)
    assert missing.returncode == 2 and "valid choices: final, step_000001, step_000002" in missing.stderr


def test_checkpoint_weights_are_the_trained_ones(tmp_path):
    from safetensors.torch import load_file

    from rlx.models.loading import load_run_model

    result = run_rlx(["train", *TINY, "checkpoint.every=1", "optim.lr=1e-2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    model, tokenizer = load_run_model(run / "checkpoints" / "step_000002")
    final = load_file(run / "final" / "model.safetensors")
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in final.items())  # step 2 is the last step: same weights
    base, _ = load_run_model(run / "checkpoints" / "step_000001")
    assert any(not torch.equal(base.state_dict()[k], v) for k, v in final.items())


def test_resume_auto_skips_runs_without_a_checkpoint(tmp_path, monkeypatch):
    outputs = tmp_path / "outputs" / "train"
    with_checkpoint = outputs / "2026-01-01_00-00-00.000000_grpo"
    crashed = outputs / "2026-01-02_00-00-00.000000_grpo"  # newer, but died before its first checkpoint
    for run in (with_checkpoint, crashed):
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("name: grpo\n")
        (run / "overrides.yaml").write_text("[]\n")
    step = with_checkpoint / "checkpoints" / "step_000010"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 10}))
    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))
    args = resolve_resume(["resume=auto", "steps=20"])
    assert f"hydra.run.dir='{with_checkpoint.resolve()}'" in args
    shutil.rmtree(with_checkpoint / "checkpoints")
    assert resolve_resume(["resume=auto", "steps=20"]) == ["steps=20"]  # nothing to resume: a new run


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
@pytest.mark.parametrize("command", [["train", "hardware=gpu", "steps=1"], ["eval", "hardware=gpu", "limit=1"]])
def test_hardware_gpu_without_a_gpu_is_one_line(tmp_path, command):
    result = run_rlx(command, tmp_path, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: hardware=gpu needs a GPU and torch sees none"), result.stderr


def test_report_of_a_sweep_with_test_seeds_finds_every_run(tmp_path):
    """`rlx report <sweep>` after `rlx sweep retest` (trials 0/, 1/ beside test_seeds/0/) lists every run."""
    from rlx.report.runs import find_runs

    for trial in ("0", "1", "10", "test_seeds/0"):
        (tmp_path / trial).mkdir(parents=True)
        (tmp_path / trial / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    names = [str(run.path.relative_to(tmp_path)) for run in find_runs([tmp_path])]
    assert names == ["0", "1", "10", "test_seeds/0"]
