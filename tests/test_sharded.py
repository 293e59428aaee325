"""Sharded and multi-process training: the pure pieces (fast) and real runs on the CPU (slow).

Slow runs compare a 1-process run with the same global batch trained by 2 gloo processes under
DeepSpeed ZeRO-2 / ZeRO-3 (DS_ACCELERATOR=cpu), by two `rlx train` launches as on two machines
(loopback), and with forking tokens; every run checkpoints, one is resumed, and the final weights
must agree within float tolerance.
"""

import shutil

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlx.algorithms.losses import entropy_threshold, top_entropy_mask
from rlx.config.overrides import check_overrides
from rlx.config.paths import ASSETS_DIR
from rlx.config.rules import check_batch
from rlx.config.settings import checked_settings
from rlx.evaluation.tasks import eval_shard
from rlx.runtime.parallel import ZeroSettings, deepspeed_config, micro_batches_per_step
from tests.conftest import run_rlx
from tests.parallel_helpers import QUIET, SENSITIVE, assert_same_parameters

# ---------------------------------------------------------------- fast: pure functions


def test_deepspeed_config_has_real_numbers_and_rlx_clipping():
    config = deepspeed_config(ZeroSettings(2), micro_batch_size=2, accumulation=4, world_size=2, max_grad_norm=0.5)
    assert config["train_batch_size"] == 16  # 2 x 4 x 2: no "auto" left for a dataloader to fill
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 0.5  # optim.max_grad_norm, not DeepSpeed's 1.0
    assert config["zero_optimization"] == {"stage": 2}
    assert not config["bf16"]["enabled"] and not config["fp16"]["enabled"]
    assert "auto" not in str(config)
    assert "stage3_param_persistence_threshold" not in str(config)  # DeepSpeed's default unless asked
    assert deepspeed_config(ZeroSettings(3, param_persistence_threshold=0), 1, 1, 1, 1.0)["zero_optimization"][
        "stage3_param_persistence_threshold"] == 0
    three = deepspeed_config(ZeroSettings(3, offload_optimizer="cpu", offload_param="cpu"), 1, 1, 4, None, "bf16")
    assert three["gradient_clipping"] == 0.0  # max_grad_norm null: no clipping
    assert three["train_batch_size"] == 4 and three["bf16"]["enabled"]
    zero = three["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_gather_16bit_weights_on_model_save"]  # final/ gets full weights
    assert zero["offload_optimizer"] == {"device": "cpu"} and zero["offload_param"] == {"device": "cpu"}
    with pytest.raises(ValueError, match="zero_stage=4"):
        deepspeed_config(ZeroSettings(4), 1, 1, 1, 1.0)


def test_micro_batches_per_step():
    assert micro_batches_per_step(8, 2) == 4
    assert micro_batches_per_step(7, 2) == 4  # a shorter last micro-batch still counts
    assert micro_batches_per_step(1, 4) == 1


def test_median_batch_check_counts_the_pivot():
    # advantage=median samples G + 1 = 3 completions per prompt: 2 prompts x 3 = 6 split into 3 mini-batches
    cfg = check_overrides(["algorithm.advantage=median", "prompts_per_step=2", "rollout.samples_per_prompt=2",
                           "algorithm.mini_batches=3", "micro_batch_size=2"])
    assert check_batch(checked_settings(cfg), 1) == 2  # samples per optimizer step on the process
    cfg = check_overrides(["algorithm.advantage=median", "prompts_per_step=4", "rollout.samples_per_prompt=2",
                           "algorithm.mini_batches=1"])
    assert check_batch(checked_settings(cfg), 2) == 6  # 2 prompts x (2 + 1) on each of 2 processes


def test_forking_threshold_of_the_global_batch():
    # two "processes" whose entropies differ: rho = 0.5 keeps the 3 highest of all 6 valid tokens
    first, second = torch.tensor([[0.1, 0.2, 0.3]]), torch.tensor([[0.7, 0.8, 0.9]])
    mask = torch.ones(1, 3)
    threshold = entropy_threshold(torch.cat([first, second]), torch.cat([mask, mask]), 0.5)
    assert threshold.item() == pytest.approx(0.7)
    assert top_entropy_mask(first, mask, 0.5, threshold).tolist() == [[False, False, False]]
    assert top_entropy_mask(second, mask, 0.5, threshold).tolist() == [[True, True, True]]
    # a per-process threshold would keep tokens of both (what 2 processes did before)
    assert top_entropy_mask(first, mask, 0.5).sum() == 2
    assert entropy_threshold(first, torch.zeros(1, 3), 0.5) is None


class _Acc:
    def __init__(self, rank, processes):
        self.process_index, self.num_processes = rank, processes


def test_eval_shard_pads_every_process_to_the_same_rows():
    # 5 rows over 2 processes: blocks of 3, the second padded with one copy
    assert eval_shard(5, _Acc(0, 2)) == (slice(0, 3), 0)
    assert eval_shard(5, _Acc(1, 2)) == (slice(3, 5), 1)
    # more processes than rows: the last ones generate padding only
    assert [eval_shard(2, _Acc(r, 3)) for r in range(3)] == [(slice(0, 1), 0), (slice(1, 2), 0), (slice(2, 2), 1)]
    assert eval_shard(4, None) == (slice(0, 4), 0)


def test_reference_is_placed_like_the_policy():
    from rlx.models.lora import AdapterDisabled, place_reference, reference_model
    from rlx.models.tiny import build_model, build_tokenizer

    policy = build_model(build_tokenizer(["a b c"], 40), hidden_size=16, num_layers=1, num_heads=2,
                         intermediate_size=32, max_position_embeddings=32, seed=0).to(torch.bfloat16)
    acc = OmegaConf.create({"device": "meta", "state": {}})  # a stand-in accelerator whose device is not the CPU
    reference = place_reference(reference_model(policy), acc)
    param = next(reference.parameters())
    assert param.device.type == "meta" and param.dtype == torch.bfloat16 and not param.requires_grad
    from rlx.models.lora import apply_lora

    lora = apply_lora(policy, 2, 4, 0.0, "all-linear")
    assert isinstance(place_reference(reference_model(lora), acc), AdapterDisabled)  # no second copy


def test_no_loop_builds_its_own_reference():
    """PPO took a deepcopy of the (peft) policy: a second full model under LoRA, left on the CPU. Now the
    one builder (rlx.build.build_parts) makes every reference; no loop copies a model."""
    from rlx.loops import agent_sft, policy_gradient, ppo, preference, reward_model, sft

    for loop in (agent_sft, policy_gradient, ppo, preference, reward_model, sft):
        source = open(loop.__file__).read()
        assert "deepcopy" not in source and "reference_model(" not in source, loop.__name__


# ---------------------------------------------------------------- slow: 2 processes on the CPU


def _runs(tmp_path):
    return tmp_path / "outputs" / "train"


def _run_dir(tmp_path, name):
    runs = sorted(_runs(tmp_path).glob(f"*_{name}"))
    assert len(runs) == 1, runs
    return runs[0]


def _max_gap(one: dict, other: dict) -> float:
    return max((one[k] - other[k]).abs().max().item() for k in one)


GRPO = ["steps=3", "prompts_per_step=4", "rollout.samples_per_prompt=4", "micro_batch_size=4",
        "algorithm.scale=batch", "algorithm.kl_coef=0.1", *SENSITIVE, "optim.lr=0.2", "optim.max_grad_norm=0.05",
        *[q for q in QUIET if not q.startswith(("eval.", "checkpoint."))], "eval.size=5", "eval.every=3",
        "eval.at_start=false", "checkpoint.every=1", "checkpoint.keep=3"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: GRPO on one process, 4 micro-batches per step, clipped at 0.05 (every step's norm is
    larger), evaluated on 5 held-out rows at the end."""
    tmp = tmp_path_factory.mktemp("one")
    result = run_rlx(["train", *GRPO, "name=one"], tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    run = _run_dir(tmp, "one")
    metrics = [line for line in (run / "metrics.jsonl").read_text().splitlines()]
    return load_file(run / "final" / "model.safetensors"), metrics[-1]


def _eval_of(line: str) -> dict:
    import json

    row = json.loads(line)
    return {k: v for k, v in row.items() if k.startswith("eval/")}


@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.long)])
def test_deepspeed_two_processes_match_one_and_resume(tmp_path, one_process, stage):
    """~2.5 min per stage on 2 cores: a 2-process run (2 micro-batches per process and step), its
    last step redone from the step-2 checkpoint, both equal to the 1-process run."""
    pytest.importorskip("deepspeed")
    one, one_last = one_process
    start = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    moved = max((one[k] - start[k]).abs().max().item() for k in one)
    args = ["train", *GRPO, "name=ds", f"hardware=deepspeed_zero{stage}", "hardware.mixed_precision=no"]
    if stage == 3:  # partition every parameter (DeepSpeed keeps ones under 1e5 elements whole: all of the tiny model's)
        args.append("hardware.deepspeed.param_persistence_threshold=0")
    result = run_rlx(args, tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    run = _run_dir(tmp_path, "ds")
    step2 = run / "checkpoints" / "step_000002"
    # ZeRO: each process wrote its own optimizer-state partition
    assert sorted(p.name for p in (step2 / "pytorch_model").glob("*optim_states.pt")) == [
        f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    first = load_file(run / "final" / "model.safetensors")
    gap = _max_gap(one, first)
    assert moved > 100 * 1e-6, f"training barely moved the weights ({moved:.2e})"
    assert gap < 1e-6, f"ZeRO-{stage} with 2 processes differs from 1 process by {gap:.2e} (moved {moved:.2e})"
    assert _eval_of(one_last) == pytest.approx(_eval_of((run / "metrics.jsonl").read_text().splitlines()[-1]))
    # resume: drop the last checkpoint and final/, continue from step 2
    shutil.rmtree(run / "checkpoints" / "step_000003")
    shutil.rmtree(run / "final")
    resumed = run_rlx(["train", f"resume={run}"], tmp_path, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    again = load_file(run / "final" / "model.safetensors")
    gap = _max_gap(one, again)
    assert gap < 1e-6, f"ZeRO-{stage} resumed from step 2 differs from 1 process by {gap:.2e}"


@pytest.mark.long
def test_forking_tokens_two_processes_match_one(tmp_path):
    """~40 s: the top-20% entropy threshold is one over the global batch (per-process thresholds: 1.0e-5)."""
    assert_same_parameters(tmp_path, ["steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=4",
                                      "algorithm.forking_rho=0.2"], atol=1e-6)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_machines(tmp_path, args_of_machine, timeout=400):
    """Start `rlx train <args>` for machine 0 and machine 1 at once, as on two hosts; wait for both."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, RLX_OUTPUTS=str(tmp_path / "outputs"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    procs = [subprocess.Popen([sys.executable, "-m", "rlx", "train", *args_of_machine(rank)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"machine {rank}:\n{out[-4000:]}"
    return outputs


@pytest.mark.long
def test_two_machines_on_loopback_match_one_process_and_resume(tmp_path, one_process):
    """~2.5 min: the README's multi-node command on each "machine" (1 process each, gloo on 127.0.0.1, a
    shared run directory), then both resumed from the step-2 checkpoint; equal to the 1-process run."""
    one, one_last = one_process
    run = tmp_path / "shared" / "runs" / "exp1"
    # README: rlx train hardware=multinode hardware.main_process_ip=10.0.0.1 hardware.machine_rank=0
    # hydra.run.dir=/shared/runs/exp1
    readme = ["hardware=multinode", "hardware.main_process_ip=127.0.0.1", f"hydra.run.dir={run}"]
    cpu = ["hardware.num_processes=1", "hardware.cpu=true", "hardware.mixed_precision=no"]
    port = _free_port()
    _two_machines(tmp_path, lambda rank: [*readme, f"hardware.machine_rank={rank}", *cpu,
                                          f"hardware.main_process_port={port}", *GRPO, "name=mn"])
    gap = _max_gap(one, load_file(run / "final" / "model.safetensors"))
    assert gap < 1e-6, f"2 machines differ from 1 process by {gap:.2e}"
    assert _eval_of(one_last) == pytest.approx(_eval_of((run / "metrics.jsonl").read_text().splitlines()[-1]))
    shutil.rmtree(run / "checkpoints" / "step_000003")
    shutil.rmtree(run / "final")
    # resume on each machine: the saved overrides come back; this machine's rank and a fresh port replace theirs
    port = _free_port()
    outputs = _two_machines(tmp_path, lambda rank: [f"resume={run}", f"hardware.machine_rank={rank}",
                                                    f"hardware.main_process_port={port}"])
    assert "resumed from" in outputs[0]
    gap = _max_gap(one, load_file(run / "final" / "model.safetensors"))
    assert gap < 1e-6, f"2 machines resumed from step 2 differ from 1 process by {gap:.2e}"


@pytest.mark.long
def test_generation_on_zero3_keeps_ranks_in_lockstep(tmp_path):
    """~40 s: 2 ranks with every parameter partitioned generate completions of different lengths (13 and
    24 tokens); the rank that stops first keeps stepping, and both equal the unsharded model. Without
    the lockstep the longer rank waits in a parameter gather forever (seen: killed at the timeout)."""
    pytest.importorskip("deepspeed")
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                             str(_free_port()), str(REPO / "tests" / "zero3_generate_worker.py")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert result.stdout.count(" ok") == 2, result.stdout[-2000:]


SFT = ["algorithm=sft", "steps=2", "algorithm.batch_size=8", "micro_batch_size=2"]
DPO = ["algorithm=dpo", "data=prefs", "steps=2", "algorithm.batch_size=8", "micro_batch_size=2"]
RM = ["algorithm=reward_model", "data=prefs", "steps=2", "algorithm.batch_size=8", "micro_batch_size=2"]
EVERY_PARAMETER = "hardware.deepspeed.param_persistence_threshold=0"  # ZeRO-3 partitions even the tiny model's


@pytest.mark.long
@pytest.mark.parametrize("family, strategy", [
    (SFT, "deepspeed_zero2"), (DPO, "deepspeed_zero2"), (RM, "deepspeed_zero2"),
    (SFT, "deepspeed_zero3"), (DPO, "deepspeed_zero3"),
], ids=["sft-zero2", "dpo-zero2", "rm-zero2", "sft-zero3", "dpo-zero3"])
def test_sft_dpo_and_reward_model_under_deepspeed_match_one_process(tmp_path, family, strategy):
    """~30-60 s each: SFT, DPO (precomputed reference log-probs) and the reward model on 2 DeepSpeed processes
    (CPU, gloo; 2 micro-batches per process and step) end with the 1-process weights (ZeRO-2: measured 3e-8
    and 7e-9 for SFT and DPO)."""
    pytest.importorskip("deepspeed")
    assert_same_parameters(tmp_path, family, strategy=strategy, atol=1e-6,
                           many_args=[EVERY_PARAMETER] if strategy == "deepspeed_zero3" else [])
