"""Hardware options and trackers: what composes, what launches, what is recorded with every run."""

import importlib.util
import json

import pytest
import torch
from omegaconf import OmegaConf

from rlx.config.overrides import check_overrides
from rlx.config.rules import check_strategy
from rlx.errors import UserError
from rlx.runtime.launch import launcher_command
from rlx.runtime.rundir import read_metrics
from rlx.runtime.tracking import environment_info, flat_config, tracker_names
from tests.conftest import only_run_dir, run_rlx

FAST = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=4", "hardware.num_threads=1",
        "save.plot=false"]


@pytest.mark.parametrize(
    "option,flags",
    [
        ("ddp", ["--multi_gpu", "--num_processes 2"]),
        ("fsdp", ["--use_fsdp", "--fsdp_version 2", "--fsdp_reshard_after_forward true"]),
        ("deepspeed_zero2", ["--use_deepspeed", "--zero_stage 2"]),
        # the reference copies full weights
        ("deepspeed_zero3", ["--use_deepspeed", "--zero_stage 3", "--zero3_init_flag false"]),
    ],
)
def test_strategies_become_accelerate_launch_flags(option, flags):
    hardware = check_overrides([f"hardware={option}"]).hardware
    cmd = launcher_command(hardware, ["train", "steps=1"])
    joined = " ".join(cmd)
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and cmd[-4:] == ["-m", "rlx", "train", "steps=1"]
    for flag in flags:
        assert flag in joined, joined


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPUs")
def test_sharded_strategies_without_a_gpu_stop_with_the_alternative(tmp_path):
    with pytest.raises(UserError, match="hardware=fsdp without a GPU needs hardware.cpu=true"):
        check_strategy(check_overrides(["hardware=fsdp"]).hardware)
    check_strategy(check_overrides(["hardware=fsdp", "hardware.cpu=true"]).hardware)  # FSDP2 on gloo: no error
    # DeepSpeed runs on the CPU (gloo); without the package installed it is one line naming the extra
    if importlib.util.find_spec("deepspeed") is None:
        with pytest.raises(UserError, match=r"pip install 'rlx\[deepspeed\]'"):
            check_strategy(check_overrides(["hardware=deepspeed_zero3"]).hardware)
    else:
        check_strategy(check_overrides(["hardware=deepspeed_zero3"]).hardware)
    check_strategy(check_overrides(["hardware=ddp"]).hardware)  # DDP runs on CPU: no error
    result = run_rlx(["train", "hardware=fsdp", "hardware.num_processes=2", *FAST], tmp_path)
    assert result.returncode == 2 and "needs hardware.cpu=true" in result.stderr and "Traceback" not in result.stderr


def test_multinode_needs_the_main_address_and_passes_the_machine_layout():
    hardware = check_overrides(["hardware=multinode", "hardware.main_process_ip=10.0.0.1",
                                "hardware.machine_rank=1"]).hardware
    joined = " ".join(launcher_command(hardware, ["train"]))
    for piece in ("--num_processes 16", "--num_machines 2", "--machine_rank 1", "--main_process_ip 10.0.0.1",
                  "--main_process_port 29500"):
        assert piece in joined
    missing = OmegaConf.merge(hardware, {"main_process_ip": None})
    with pytest.raises(UserError, match="main_process_ip is required"):
        launcher_command(missing, ["train"])


def test_trackers_are_checked_and_config_is_flattened():
    with pytest.raises(UserError, match="valid choices: tensorboard, wandb, mlflow, trackio"):
        tracker_names(OmegaConf.create({"trackers": ["tensorbored"]}))
    flat = flat_config(check_overrides(["seed=3"]))
    assert flat["seed"] == 3 and flat["optim/lr"] == 1e-4 and flat["optim/betas"] == "[0.9, 0.99]"
    info = environment_info(2)
    assert info["processes"] == 2 and info["packages"]["torch"] == torch.__version__
    assert info["git_commit"] is None or len(info["git_commit"]) == 40


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_tracker_receives_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = run_rlx(["train", *FAST, "logger=tensorboard"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    events = list((run / "rlx").rglob("events.out.tfevents.*")) + list(run.rglob("events.out.tfevents.*"))
    assert events, sorted(str(p) for p in run.rglob("*"))
    scalars = {}
    for path in set(events):
        acc = EventAccumulator(str(path))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars[tag] = [e.value for e in acc.Scalars(tag)]
    rows = read_metrics(run / "metrics.jsonl")
    assert scalars["reward/total"] == pytest.approx([r["reward/total"] for r in rows if "reward/total" in r])
    env = json.loads((run / "env.json").read_text())
    assert env["packages"]["tensorboard"] and "logger=tensorboard" in " ".join(env["command"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (hardware=gpu, bf16); see README")
def test_gpu_bf16_default_recipe_runs(tmp_path):
    result = run_rlx(["train", "hardware=gpu", "steps=3", "eval.size=16", "save.plot=false"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    assert "mixed_precision: bf16" in (run / "config.yaml").read_text()
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["step"] == 3 and rows[-1]["eval/accuracy"] is not None
