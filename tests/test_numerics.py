"""Numerics of training real models on one device: log-probs at the sampling temperature, bf16 (weights
and autocast, on the CPU), fp32 master weights, train mode during updates, chunked entropy, per-model
learning rates. Each test failed on the code before these fixes (the reason is in its docstring)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlx.algorithms.logprobs import chunked_linear_logprobs, token_entropy, token_logprobs
from rlx.config.settings import checked_settings
from rlx.models.forward import LogprobSettings, completion_logprobs

ROOT = Path(__file__).resolve().parent.parent


def _tiny_llama(vocab_size: int = 50, dtype=torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM(config).to(dtype).eval()


def _batch(vocab_size: int = 50, n: int = 3, p: int = 4, c: int = 6):
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(1, vocab_size, (n, p), generator=g)  # (N, P)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[0, :2] = 0
    completion_ids = torch.randint(1, vocab_size, (n, c), generator=g)  # (N, C)
    completion_mask = torch.ones(n, c, dtype=torch.long)
    completion_mask[1, 4:] = 0
    return prompt_ids, prompt_mask, completion_ids, completion_mask


# ---------------------------------------------------------------- temperature


def test_chunked_logprobs_and_entropy_at_a_temperature_with_gradients():
    """log softmax(z / T) and its entropy, values and gradients of both, equal autograd on the full logits.
    Failed before: no temperature (and no entropy gradient) in the chunked path."""
    torch.manual_seed(0)
    temperature = 0.7
    hidden = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)  # (M, H)
    weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)  # (V, H)
    bias = torch.randn(13, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (10,))
    g_logp, g_entropy = torch.randn(10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)

    logits = ((hidden @ weight.t() + bias) / temperature).unsqueeze(0)  # (1, M, V)
    naive, naive_entropy = token_logprobs(logits, targets.unsqueeze(0))[0], token_entropy(logits)[0]
    naive_grads = torch.autograd.grad((naive * g_logp + naive_entropy * g_entropy).sum(), (hidden, weight, bias))
    chunked, entropy = chunked_linear_logprobs(hidden, weight, targets, bias=bias, chunk_tokens=3, with_entropy=True,
                                               temperature=temperature)
    chunked_grads = torch.autograd.grad((chunked.double() * g_logp + entropy.double() * g_entropy).sum(),
                                        (hidden, weight, bias))
    assert torch.allclose(chunked.double(), naive, atol=1e-5)
    assert torch.allclose(entropy.double(), naive_entropy, atol=1e-5)
    for got, want in zip(chunked_grads, naive_grads):
        assert torch.allclose(got, want, atol=1e-4)
    # by hand: logits [0, ln 3] at T = 1/2 are [0, ln 9]: q = [1/10, 9/10]
    two = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    lp, h = chunked_linear_logprobs(torch.tensor([[0.0, math.log(3.0)]]), two, torch.tensor([1]), with_entropy=True,
                                    temperature=0.5)
    assert abs(lp.item() - math.log(0.9)) < 1e-6
    assert abs(h.item() - -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))) < 1e-6


@pytest.mark.parametrize("chunked", [True, False])
def test_completion_logprobs_score_the_tempered_distribution(chunked):
    """completion_logprobs(temperature=T) = log softmax(logits / T) at the completion tokens, on both
    paths; the entropy is the tempered distribution's. Failed before: the argument did not exist."""
    model = _tiny_llama()
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    logp, entropy = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                        with_entropy=True, temperature=0.6, settings=LogprobSettings(chunked=chunked))
    ids, attention = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention,
                       position_ids=(attention.cumsum(1) - 1).clamp(min=0)).logits
    tempered = logits[:, prompt_ids.shape[1] - 1 : -1] / 0.6  # (N, C, V)
    want = torch.log_softmax(tempered, -1).gather(-1, completion_ids[..., None])[..., 0]
    keep = completion_mask.bool()
    assert torch.allclose(logp[keep], want[keep], atol=1e-5)
    assert torch.allclose(entropy[keep], token_entropy(tempered)[keep], atol=1e-5)
    assert not torch.allclose(logp[keep],
                              torch.log_softmax(logits[:, 3:-1],
                                                -1).gather(-1, completion_ids[..., None])[..., 0][keep])


def test_entropy_bonus_never_builds_full_logits():
    """An entropy bonus (entropy_grad=True) keeps O(chunk x V) for backward, like the log-probs alone.
    Failed before: entropy_grad switched to the full-logits path ((N, C, V) saved for backward)."""
    model = _tiny_llama(vocab_size=4000)
    batch = _batch(4000, n=8, c=32)

    def saved_bytes(entropy_grad: bool) -> int:
        total = 0

        def pack(tensor):
            nonlocal total
            total += tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, entropy = completion_logprobs(model, *batch, with_entropy=True,
                                                settings=LogprobSettings(entropy_grad=entropy_grad))
        (logp.sum() + entropy.sum()).backward()
        return total

    full_logits = 8 * 32 * 4000 * 4  # (N, C, V) float32
    assert saved_bytes(True) < full_logits / 2
    assert saved_bytes(True) < 1.5 * saved_bytes(False)


def test_policy_gradient_and_ppo_loops_score_at_the_sampling_temperature_in_train_mode(monkeypatch, tmp_path):
    """Every log-prob the GRPO and PPO loops compute (old, reference, update) uses rollout.temperature;
    update passes run in train mode (where gradient checkpointing acts), the others in eval mode.
    Failed before: temperature absent (log-probs of softmax(z), not of softmax(z/T)); the model was never
    put in train mode."""
    import rlx.loops.common as common
    import rlx.loops.policy_gradient as pg
    import rlx.loops.ppo as ppo
    from rlx.cli.training import run
    from rlx.config.overrides import check_overrides

    calls = []
    real = completion_logprobs

    def recording(model, *args, **kwargs):
        calls.append((kwargs.get("temperature", 1.0), torch.is_grad_enabled(), model.training))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(pg, "completion_logprobs", recording)
    monkeypatch.setattr(ppo, "completion_logprobs", recording)
    monkeypatch.setattr(common, "completion_logprobs", recording)  # batched_logprobs: old and reference passes
    common = ["steps=1", "prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=6",
              "rollout.temperature=0.7", "eval.every=0", "eval.at_start=false", "save.final=false", "save.plot=false",
              "log.progress=false", "checkpoint.every=0", "algorithm.kl_coef=0.05"]
    for algorithm in ("grpo", "ppo"):
        calls.clear()
        run(check_overrides([f"algorithm={algorithm}", *common]), tmp_path / algorithm, [])
        assert {temperature for temperature, _, _ in calls} == {0.7}
        assert any(grad for _, grad, _ in calls) and any(not grad for _, grad, _ in calls)  # update, old/ref
        assert all(training == grad for _, grad, training in calls), calls


# ---------------------------------------------------------------- bf16 on the CPU


def test_chunked_head_runs_in_the_compute_dtype():
    """fp32 hidden states (Accelerate converts outputs to fp32) against bf16 weights, and fp32 weights
    under bf16 autocast, give the fp32 result within bf16 rounding, with gradients in each input's dtype.
    Failed before: `expected m1 and m2 to have the same dtype` in the first case."""
    torch.manual_seed(0)
    hidden = torch.randn(7, 16, requires_grad=True)
    weight32 = torch.randn(40, 16)
    targets = torch.randint(0, 40, (7,))
    want, _ = chunked_linear_logprobs(hidden, weight32, targets, chunk_tokens=3)
    weight16 = weight32.to(torch.bfloat16).requires_grad_(True)
    got, _ = chunked_linear_logprobs(hidden, weight16, targets, chunk_tokens=3, temperature=1.0)
    got.sum().backward()
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=0.2)
    assert weight16.grad.dtype == torch.bfloat16 and hidden.grad.dtype == torch.float32
    weight = weight32.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, _ = chunked_linear_logprobs(hidden, weight, targets, chunk_tokens=3)
    mixed.sum().backward()
    assert torch.allclose(mixed, want, atol=0.2) and not torch.equal(mixed, want)  # bf16 product, fp32 lse
    assert weight.grad.dtype == torch.float32


def test_decode_step_follows_a_bf16_autocast_prefill():
    """A prefill under bf16 autocast over fp32 weights fills a bf16 value cache; the hand-written decode
    step then runs under the same autocast and gives the transformers step's logits. Failed before:
    `expected m1 and m2 to have the same dtype` in the decode step."""
    from rlx.engines.fast_decode import decode_step_for
    from rlx.engines.hf import generation_cache

    model = _tiny_llama()
    prompt = torch.randint(1, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompt)
    position = torch.arange(5).expand(2, 5)
    caches = []
    with torch.no_grad():
        for _ in range(2):
            cache = generation_cache(model, 4)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(input_ids=prompt, attention_mask=mask, position_ids=position, past_key_values=cache,
                      use_cache=True)
            caches.append(cache)
        token, attention = torch.tensor([3, 7]), torch.ones(2, 6, dtype=torch.long)
        fast = decode_step_for(model)(token, torch.tensor([5, 5]), attention, caches[0])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            slow = model(input_ids=token[:, None], attention_mask=attention, position_ids=torch.tensor([[5], [5]]),
                         past_key_values=caches[1], use_cache=True).logits[:, -1]
    assert caches[0].layers[0].values.dtype == torch.bfloat16
    assert torch.allclose(fast.float(), slow.float(), atol=0.05)


def _rlx_train(tmp_path: Path, *overrides: str, timeout: int = 300) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlx", "train", "steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=2",
         "rollout.max_new_tokens=6", "eval.every=2", "eval.at_start=false", "eval.size=4", "save.plot=false",
         "log.progress=false", "checkpoint.every=0", f"hydra.run.dir={run_dir}", *overrides],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long  # ~25-50 s each on 2 busy cores (CPU bf16 matmuls are slow)
@pytest.mark.parametrize("overrides", [
    ("model.dtype=bfloat16", "hardware.mixed_precision=bf16"),  # the model presets on hardware=gpu
    # hardware=gpu, fp32 weights
    ("model.dtype=float32", "hardware.mixed_precision=bf16", "algorithm.entropy_coef=0.01"),
    ("model.dtype=bfloat16", "algorithm.entropy_coef=0.01"),  # bf16 weights, no autocast
], ids=["bf16_weights_autocast", "fp32_weights_autocast", "bf16_weights"])
def test_grpo_trains_in_bf16_on_the_cpu(tmp_path, overrides):
    """Two GRPO steps and a greedy evaluation with bf16 weights and/or CPU bf16 autocast, with KL to a
    reference (and an entropy bonus in two cases). Failed before: bf16 weights + autocast, a dtype error
    in the chunked output head (fp32 hidden states x bf16 weights); fp32 weights + autocast, a dtype error
    in the decode step. bf16 weights without autocast ran before too (kept as a regression check)."""
    rows = _rlx_train(tmp_path, *overrides, "algorithm.kl_coef=0.05")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) and math.isfinite(r["train/kl_ref"]) for r in rows)
    assert "eval/accuracy" in rows[-1]


# ---------------------------------------------------------------- fp32 master weights


def test_master_weights_keep_small_updates_of_bf16_parameters():
    """At lr 1e-6 a bf16 weight of 1.0 never moves under plain AdamW (each Adam step is ~lr, below half a
    bf16 ulp, 2^-9 just under 1); with fp32 masters the steps add up: after n steps w32 = 1 - n lr, and
    the bf16 weight becomes the nearest bf16 value (1 - 2^-8 once n lr > 2^-9 + a bit).
    Failed before: build_optimizer gave a plain AdamW over the bf16 parameters."""

    from rlx.runtime.optim import MasterWeightAdamW, build_optimizer

    optim = dict(lr=1e-6, betas=[0.9, 0.99], eps=1e-12, weight_decay=0.0, schedule="constant", warmup_steps=0)

    def train(model, steps: int):
        optimizer, _ = build_optimizer(model, steps, **optim)
        for _ in range(steps):
            model.weight.grad = torch.ones_like(model.weight)  # constant gradient: Adam steps by lr each time
            optimizer.step()
            optimizer.zero_grad()
        return optimizer

    model = torch.nn.Linear(1, 3, bias=False).to(torch.bfloat16)
    torch.nn.init.ones_(model.weight)
    optimizer = train(model, 3000)
    assert isinstance(optimizer, MasterWeightAdamW)
    # fp32 rounding of 3000 sums
    assert torch.allclose(optimizer.masters[0], torch.full((3, 1), 1 - 3000e-6), atol=2e-4)
    assert torch.equal(model.weight, torch.full((3, 1), 1 - 2**-8, dtype=torch.bfloat16))
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))], lr=1e-6, eps=1e-12)
    for _ in range(100):
        plain.param_groups[0]["params"][0].grad = torch.ones(3, dtype=torch.bfloat16)
        plain.step()
    assert torch.equal(plain.param_groups[0]["params"][0].detach(), torch.ones(3, dtype=torch.bfloat16))
    # the masters travel with the state dict (a resumed run continues from the fp32 values)
    fresh = torch.nn.Linear(1, 3, bias=False).to(torch.bfloat16)
    restored, _ = build_optimizer(fresh, 1, **optim)
    restored.load_state_dict(optimizer.state_dict())
    assert torch.equal(restored.masters[0], optimizer.masters[0])
    assert isinstance(build_optimizer(torch.nn.Linear(1, 3), 1, **optim)[0], torch.optim.AdamW)


# ---------------------------------------------------------------- defaults


def test_model_presets_carry_their_own_learning_rate():
    """optim.lr follows the model preset (1e-4 was tuned on the 0.9M-parameter tiny model); a command-line
    optim.lr still wins. Failed before: every preset trained at 1e-4."""
    from rlx.config.overrides import check_overrides

    assert check_overrides([]).optim.lr == 1e-4
    for preset in ("qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct", "qwen3-0.6b", "llama-3.2-1b-instruct"):
        assert check_overrides([f"model={preset}"]).optim.lr == 1e-6, preset
    assert check_overrides(["model=qwen3-0.6b", "optim.lr=3e-6"]).optim.lr == 3e-6


def test_zero_temperature_is_refused_for_training():
    from rlx.config.overrides import check_overrides
    from rlx.config.rules import check_settings
    from rlx.errors import UserError

    with pytest.raises(UserError, match="rollout.temperature"):
        check_settings(checked_settings(check_overrides(["rollout.temperature=0"])))


def test_gpu_smoke_without_cuda_fails_with_one_line():
    """`make test-gpu` on a machine without CUDA: exit code 2 and one line saying why, no traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_smoke.py")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no CUDA device" in proc.stderr


def test_lora_reference_with_checkpointing_does_not_share_prompt_caches():
    """With gradient checkpointing, a LoRA reference (the policy with its adapter off) must not take the
    KV-cache prompt-sharing path: in train mode transformers turns the cache off under checkpointing.
    Failed before: the check did not look through the reference wrapper to the policy."""
    from omegaconf import OmegaConf

    from rlx.models.forward import _can_share_prompts
    from rlx.models.lora import prepare_policy, reference_model

    lora = {"enabled": True, "rank": 2, "alpha": 4, "dropout": 0.0, "target_modules": "all-linear"}
    policy = prepare_policy(_tiny_llama(), OmegaConf.create({"gradient_checkpointing": True, "lora": lora}),
                            OmegaConf.create({"gradient_checkpointing": False}))
    assert not _can_share_prompts(reference_model(policy))
    plain = prepare_policy(_tiny_llama(), OmegaConf.create({"gradient_checkpointing": False, "lora": lora}),
                           OmegaConf.create({"gradient_checkpointing": False}))
    assert _can_share_prompts(reference_model(plain))


def test_master_weights_follow_their_parameters_to_another_device():
    """The optimizer is built before `accelerator.prepare` moves the model to the GPU: the fp32 masters (and
    AdamW's moments) must follow their bf16 parameters, or the first step fails with "attempting to assign a
    gradient with device type 'cuda' to a tensor with device type 'cpu'" (seen on an H100). CI has no second
    device, so the move is played with a parameter on the meta device standing in for the moved one."""
    from rlx.runtime.optim import MasterWeightAdamW

    weight = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16))
    optimizer = MasterWeightAdamW([weight], lr=0.1)
    moved = torch.nn.Parameter(torch.empty(4, 3, dtype=torch.bfloat16, device="meta"))
    optimizer.model_params[0] = moved  # what module.to(device) does to the parameter the optimizer holds
    moved.grad = torch.ones(4, 3, dtype=torch.bfloat16, device="meta")
    optimizer.step()
    master = optimizer.masters[0]
    assert master.device.type == "meta" and master.dtype == torch.float32
    assert optimizer.param_groups[0]["params"][0] is master
    assert optimizer.state[master]["exp_avg"].device.type == "meta"
    optimizer.load_state_dict(optimizer.state_dict())  # a resume after the move keeps the masters there
    assert optimizer.masters[0].device.type == "meta"


def test_fp32_policies_step_with_the_fused_adamw_and_it_matches_the_loop(monkeypatch):
    """build_optimizer gives plain fp32 CPU parameters torch's fused AdamW (the per-parameter loop is ~6x slower
    at the 0.5B shape), and three of its steps land where three steps of the loop do, to float rounding; under
    an engine that steps its own states (DeepSpeed / FSDP launch) it stays unfused."""
    from rlx.runtime.optim import build_optimizer

    def run(fused_expected: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        optimizer, _ = build_optimizer(model, 10, lr=1e-2, betas=[0.9, 0.99], eps=1e-8, weight_decay=0.1,
                                       schedule="constant", warmup_steps=0)
        assert bool(optimizer.defaults["fused"]) is fused_expected
        data = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
        initial = [p.detach().clone() for p in model.parameters()]
        for _ in range(3):
            optimizer.zero_grad()
            model(data).pow(2).mean().backward()
            optimizer.step()
        assert all((p.detach() - q).abs().max() > 1e-3 for p, q in zip(model.parameters(), initial))  # it moved
        return [p.detach().clone() for p in model.parameters()]

    fused = run(True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    loop = run(False)
    for a, b in zip(fused, loop):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()
