"""FSDP2 (torch's fully_shard through Accelerate) on the CPU: the pure pieces (fast) and real runs (slow).

Accelerate 1.15 picks FSDP only on accelerators; rlx forces its FSDP2 path onto CPU processes (gloo,
rlx.runtime.parallel.use_fsdp_on_cpu). The slow runs prove the parameters are DTensor shards, that generation keeps
the ranks in lockstep, and that GRPO with 2 processes (and with 1 launched process) trains, evaluates,
checkpoints (one shard file per rank), resumes and saves final/ exactly like a plain 1-process run.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlx.config.overrides import check_overrides
from rlx.config.paths import ASSETS_DIR
from rlx.config.settings import checked_settings
from rlx.runtime.launch import launcher_command, needs_launch
from rlx.runtime.parallel import fsdp_plugin, full_state_dict
from tests.conftest import REPO, run_rlx
from tests.parallel_helpers import QUIET, SENSITIVE, assert_same_parameters

# ---------------------------------------------------------------- fast


def test_fsdp_preset_builds_an_fsdp2_plugin():
    hardware = check_overrides(["hardware=fsdp", "hardware.cpu=true"]).hardware
    plugin = fsdp_plugin(hardware.fsdp)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT" and not plugin.cpu_ram_efficient_loading
    zero2_like = fsdp_plugin(OmegaConf.merge(hardware.fsdp, {"reshard_after_forward": False}))
    assert zero2_like.reshard_after_forward is False
    with pytest.raises(ValueError, match="hardware.fsdp.version=1; rlx runs FSDP2 only"):
        fsdp_plugin(OmegaConf.merge(hardware.fsdp, {"version": 1}))


def test_fsdp_is_launched_even_with_one_process():
    """FSDP2 shards over a process group, which only the launcher's workers have: a 1-process run in the
    parent would train unsharded, silently."""
    one = check_overrides(["hardware=fsdp", "hardware.num_processes=1", "hardware.cpu=true"]).hardware
    assert needs_launch(one)
    assert not needs_launch(check_overrides(["hardware=cpu"]).hardware)
    joined = " ".join(launcher_command(one, ["train"]))
    assert "--use_fsdp --fsdp_version 2" in joined and "--num_processes 1" in joined


def test_full_state_dict_writes_a_tied_weight_once():
    """Gathered shards are separate tensors, so save_pretrained no longer sees the output head as the
    embeddings: full_state_dict drops the tied name (the tiny model ties them) and keeps every other."""
    from rlx.models.tiny import build_model, build_tokenizer

    model = build_model(build_tokenizer(["a b c"], 40), hidden_size=16, num_layers=1, num_heads=2,
                        intermediate_size=32, max_position_embeddings=32, seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight

    class Gathered:  # what a sharded engine's get_state_dict returns: full copies, no shared storage
        def get_state_dict(self, m):
            return {k: v.clone() for k, v in m.state_dict().items()}

        def unwrap_model(self, m):
            return m

    state = full_state_dict(Gathered(), model)
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state
    assert set(state) == set(model.state_dict()) - {"lm_head.weight"}


def test_what_fsdp_does_not_run_stops_with_the_fix(tmp_path):
    """PPO prepares two models (Accelerate's FSDP2 takes one) and vLLM would read DTensor shards: one line, exit 2."""
    result = run_rlx(["train", "algorithm=ppo", *FSDP_CPU, "hardware.num_processes=2"], tmp_path)
    assert result.returncode == 2 and "Accelerate's FSDP2 prepares one" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    from rlx.config.rules import check_sharded_settings
    from rlx.errors import UserError

    with pytest.raises(UserError, match="without fp32 master copies"):  # FSDP2 keeps masters only under mixed precision
        check_sharded_settings(checked_settings(check_overrides([*FSDP_CPU, "model.dtype=bfloat16"])))
    check_sharded_settings(checked_settings(check_overrides(["hardware=fsdp", "hardware.cpu=true",
                                                             "hardware.mixed_precision=bf16",
                                            "model.dtype=bfloat16"])))


# ---------------------------------------------------------------- slow: processes on the CPU

GRPO = ["steps=3", "prompts_per_step=4", "rollout.samples_per_prompt=4", "micro_batch_size=4",
        "algorithm.scale=batch", "algorithm.kl_coef=0.1", *SENSITIVE, "optim.lr=0.2", "optim.max_grad_norm=0.05",
        *[q for q in QUIET if not q.startswith(("eval.", "checkpoint."))], "eval.size=5", "eval.every=3",
        "eval.at_start=false", "checkpoint.every=1", "checkpoint.keep=3"]
FSDP_CPU = ["hardware=fsdp", "hardware.cpu=true", "hardware.mixed_precision=no"]


def _run_dir(tmp_path, name):
    runs = sorted((tmp_path / "outputs" / "train").glob(f"*_{name}"))
    assert len(runs) == 1, runs
    return runs[0]


def _max_gap(one: dict, other: dict) -> float:
    assert set(one) == set(other), set(one) ^ set(other)
    return max((one[k] - other[k]).abs().max().item() for k in one)


def _eval_of(run) -> dict:
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return {k: v for k, v in row.items() if k.startswith("eval/")}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """GRPO on one plain process (no FSDP): 4 micro-batches per step, KL to a reference, clipped at 0.05,
    evaluated on 5 held-out rows at the end."""
    tmp = tmp_path_factory.mktemp("one")
    result = run_rlx(["train", *GRPO, "name=one"], tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    run = _run_dir(tmp, "one")
    return load_file(run / "final" / "model.safetensors"), _eval_of(run)


@pytest.mark.long
def test_fsdp2_shards_and_generates_in_lockstep(tmp_path):
    """~15 s: 2 ranks; every parameter of the policy and of the KL reference is a DTensor holding half of
    dim 0; greedy completions of 13 and 24 tokens equal the unsharded model's (the rank that finishes
    first keeps joining the all-gathers), and the sharded reference scores like the unsharded model."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                             str(port), str(REPO / "tests" / "fsdp_generate_worker.py")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert result.stdout.count(" ok") == 2, result.stdout[-2000:]


@pytest.mark.slow
def test_fsdp_two_processes_match_one_and_resume(tmp_path, one_process):
    """~1 min on 2 cores: GRPO under FSDP2 on 2 gloo processes (2 micro-batches per process and step, the
    reference sharded too) equals the 1-process run: final weights within 1e-6, the same evaluation. Each
    rank wrote its own half of the weights and optimizer state; the last step redone from the step-2
    checkpoint ends equal again."""
    one, one_eval = one_process
    start = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    moved = max((one[k] - start[k]).abs().max().item() for k in one)
    result = run_rlx(["train", *GRPO, *FSDP_CPU, "hardware.num_processes=2", "name=fsdp"], tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    run = _run_dir(tmp_path, "fsdp")
    final = load_file(run / "final" / "model.safetensors")
    gap = _max_gap(one, final)
    assert moved > 100 * 1e-6, f"training barely moved the weights ({moved:.2e})"
    assert gap < 1e-6, f"FSDP2 with 2 processes differs from 1 process by {gap:.2e} (moved {moved:.2e})"
    assert _eval_of(run) == pytest.approx(one_eval)
    # sharded checkpoint: torch.distributed.checkpoint, one file per rank, each about half of the weights
    step2 = run / "checkpoints" / "step_000002"
    full_bytes = sum(t.numel() * t.element_size() for t in final.values())
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        files = sorted(p.name for p in (step2 / folder).glob("*.distcp"))
        assert files == ["__0_0.distcp", "__1_0.distcp"], (folder, files)
    for shard in (step2 / "pytorch_model_fsdp_0").glob("*.distcp"):
        assert 0.4 * full_bytes < shard.stat().st_size < 0.6 * full_bytes, (shard, shard.stat().st_size, full_bytes)
    # resume: drop the last checkpoint and final/, continue from step 2
    shutil.rmtree(run / "checkpoints" / "step_000003")
    shutil.rmtree(run / "final")
    resumed = run_rlx(["train", f"resume={run}"], tmp_path, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    gap = _max_gap(one, load_file(run / "final" / "model.safetensors"))
    assert gap < 1e-6, f"FSDP2 resumed from step 2 differs from 1 process by {gap:.2e}"
    assert _eval_of(run) == pytest.approx(one_eval)


@pytest.mark.long
def test_fsdp_one_launched_process_matches_plain_one(tmp_path, one_process):
    """~25 s: hardware=fsdp with one process is launched (a 1-rank process group), sharded over that rank,
    and trains exactly like the plain process (the path `make test-gpu` takes on one GPU)."""
    one, one_eval = one_process
    result = run_rlx(["train", *GRPO, *FSDP_CPU, "hardware.num_processes=1", "name=fsdp1"], tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "launching 1 processes" in result.stderr + result.stdout
    run = _run_dir(tmp_path, "fsdp1")
    assert (run / "checkpoints" / "step_000003" / "pytorch_model_fsdp_0" / "__0_0.distcp").is_file()
    assert _max_gap(one, load_file(run / "final" / "model.safetensors")) < 1e-6
    assert _eval_of(run) == pytest.approx(one_eval)



@pytest.mark.long
@pytest.mark.parametrize("family", [
    ["algorithm=sft", "steps=2", "algorithm.batch_size=8", "micro_batch_size=2"],
    ["algorithm=dpo", "data=prefs", "steps=2", "algorithm.batch_size=8", "micro_batch_size=2",
     "algorithm.reference=model"],
], ids=["sft", "dpo"])
def test_other_loops_under_fsdp_match_one_process(tmp_path, family):
    """SFT (~25 s) and DPO (~55 s; its reference model kept and sharded like the policy, instead of the default
    precomputed reference log-probs) on 2 FSDP2 processes end with the 1-process weights."""
    assert_same_parameters(tmp_path, family, strategy="fsdp", atol=1e-5)


@pytest.mark.long
def test_lora_under_fsdp_matches_one_process(tmp_path):
    """~40 s: GRPO with LoRA on 2 FSDP2 processes (base and adapter sharded, the KL reference the policy with
    the adapter off): the adapter in final/ and in the last checkpoint's adapter/ (gathered from the shards)
    equals the 1-process adapter."""
    args = ["steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=4", "algorithm.kl_coef=0.1",
            "model.lora.enabled=true", "model.lora.rank=4", "checkpoint.every=2", *SENSITIVE,
            *[q for q in QUIET if not q.startswith("checkpoint.")]]
    for name, extra in (("one", []), ("many", [*FSDP_CPU, "hardware.num_processes=2"])):
        result = run_rlx(["train", *args, *extra, f"name={name}"], tmp_path, timeout=400)
        assert result.returncode == 0, result.stderr[-4000:]
    one = load_file(_run_dir(tmp_path, "one") / "final" / "adapter_model.safetensors")
    many = _run_dir(tmp_path, "many")
    # the adapter trained (B starts at 0)
    assert max(v.abs().max().item() for k, v in one.items() if "lora_B" in k) > 1e-4
    assert _max_gap(one, load_file(many / "final" / "adapter_model.safetensors")) < 1e-6
    checkpoint = load_file(many / "checkpoints" / "step_000002" / "adapter" / "adapter_model.safetensors")
    assert _max_gap(one, checkpoint) < 1e-6


@pytest.mark.long
def test_fsdp_bf16_weights_train_fp32_masters(tmp_path):
    """~30 s: bf16 weights under hardware.mixed_precision=bf16 (what the GPU presets run) on 2 FSDP2 processes:
    FSDP2 upcasts the trainable weights to fp32 masters and computes in bf16, so final/ is fp32, every step's
    loss is finite, and the weights move by updates far below a bf16 ulp (lr 1e-5: plain bf16 AdamW would
    round most of them away)."""
    args = ["steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=4", "algorithm.kl_coef=0.1",
            "optim.lr=1e-5", "optim.warmup_steps=0", "model.dtype=bfloat16", "hardware=fsdp", "hardware.cpu=true",
            "hardware.mixed_precision=bf16", "hardware.num_processes=2", "name=bf16",
            *[q for q in QUIET if not q.startswith("checkpoint.")], "checkpoint.every=2"]
    result = run_rlx(["train", *args], tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    run = _run_dir(tmp_path, "bf16")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/loss"] == r["train/loss"] for r in rows)  # not NaN
    final = load_file(run / "final" / "model.safetensors")
    start = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    assert {t.dtype for t in final.values()} == {torch.float32}
    moved = [(final[k] - start[k].to(torch.bfloat16).float()).abs() for k in final if k in start]
    changed = sum(int((m > 0).sum()) for m in moved) / sum(m.numel() for m in moved)
    assert changed > 0.5, f"only {changed:.1%} of the weights changed: the updates were rounded away"
