"""LoRA: only adapters train, the reference is the base with the adapter off (no copy), saving."""

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlx.errors import UserError
from rlx.models.loading import load_causal_lm, load_tokenizer
from rlx.models.lora import AdapterDisabled, apply_lora, prepare_policy, reference_model, save_final
from rlx.runtime.rundir import read_metrics
from tests.conftest import only_run_dir, run_rlx

LORA = {"enabled": True, "rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear", "save_merged": True}


def _policy():
    base = load_causal_lm("builtin:tiny")
    model_cfg = OmegaConf.create({"gradient_checkpointing": False, "lora": LORA})
    policy = prepare_policy(load_causal_lm("builtin:tiny"), model_cfg,
                            OmegaConf.create({"gradient_checkpointing": False}))
    with torch.no_grad():  # a trained-looking adapter (peft starts lora_B at zero, i.e. the identity)
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    return base, policy


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_trains_adapters_and_reference_is_the_base_without_a_copy():
    base, policy = _policy()
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    reference = reference_model(policy)
    assert isinstance(reference, AdapterDisabled)
    assert {id(p) for p in reference.parameters()} == {id(p) for p in policy.parameters()}  # no second copy
    ids = torch.tensor([[5, 9, 17, 3, 12]])  # (1, T)
    assert not torch.allclose(_logits(policy, ids), _logits(base, ids), atol=1e-4)
    torch.testing.assert_close(_logits(reference, ids), _logits(base, ids))
    assert not torch.allclose(_logits(policy, ids), _logits(base, ids), atol=1e-4)  # adapter back on afterwards


def test_lora_saves_the_adapter_and_a_merged_model(tmp_path):
    _, policy = _policy()
    save_final(policy, load_tokenizer("builtin:tiny"), tmp_path, merged=True)
    adapter = load_file(tmp_path / "final" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final_merged")
    ids = torch.tensor([[5, 9, 17, 3, 12]])
    torch.testing.assert_close(_logits(merged, ids), _logits(policy, ids), atol=1e-5, rtol=1e-4)


def test_lora_unknown_target_module_is_a_user_error():
    with pytest.raises(UserError, match="target_modules"):
        apply_lora(load_causal_lm("builtin:tiny"), 4, 8, 0.0, ["no_such_proj"])


def test_lora_grpo_run_with_kl_writes_adapter_checkpoints_and_env(tmp_path):
    args = ["train", "model.lora.enabled=true", "model.lora.rank=4", "algorithm.kl_coef=0.05", "steps=2",
            "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=4", "checkpoint.every=1",
            "hardware.num_threads=1", "save.plot=false", "optim.lr=1e-2",
            # rewards that differ inside every group by construction: a well-trained tiny model may sample the same
            # answer G times, and tied groups give zero advantages (the adapter would not move on such a CPU)
            "+reward.components.alternate._target_=tests.helpers.alternating_reward",
            "+reward.components.alternate.weight=1.0"]
    result = run_rlx(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["step"] == 2 and rows[-1]["train/kl_ref"] > 0  # the adapter moved away from the base
    checkpoint = run / "checkpoints" / "step_000002"
    saved = load_file(checkpoint / "model.safetensors")
    assert saved and all("lora_" in k for k in saved)  # the frozen base is not copied into checkpoints
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()
    assert (run / "final" / "adapter_model.safetensors").is_file()
    env = (run / "env.json").read_text()
    for key in ('"git_commit"', '"peft"', '"torch"', '"command"'):
        assert key in env


@pytest.mark.long
def test_lora_resume_continues_exactly(tmp_path):
    args = ["train", "model.lora.enabled=true", "model.lora.rank=4", "algorithm.kl_coef=0.05", "prompts_per_step=2",
            "rollout.samples_per_prompt=4", "eval.size=4", "eval.every=0", "checkpoint.every=1",
            "hardware.num_threads=1", "save.plot=false", "optim.lr=1e-2", "log.samples_every=0"]
    for name in ("full", "cut"):
        (tmp_path / name).mkdir()
    full = run_rlx([*args, "steps=3"], tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    cut = run_rlx([*args, "steps=2"], tmp_path / "cut")
    assert cut.returncode == 0, cut.stderr[-3000:]
    run = only_run_dir(tmp_path / "cut")
    resumed = run_rlx(["train", f"resume={run}", "steps=3"], tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = load_file(only_run_dir(tmp_path / "full") / "final" / "adapter_model.safetensors")
    got = load_file(run / "final" / "adapter_model.safetensors")
    for key in want:
        assert torch.equal(want[key], got[key]), key


def test_ppo_critic_of_a_lora_policy_trains_its_own_adapter_only():
    from rlx.models.value import build_value_model

    _, policy = _policy()
    critic = build_value_model(policy)
    trainable = [name for name, p in critic.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name or name.startswith("head.") for name in trainable)
    policy_adapter = {id(p) for name, p in policy.named_parameters() if "lora_" in name}
    assert not policy_adapter & {id(p) for p in critic.parameters()}  # a copy: the critic never moves the policy
    ids = torch.tensor([[5, 6, 7, 8]])
    values = critic(ids[:, :2], torch.ones(1, 2, dtype=torch.long), ids[:, 2:], torch.ones(1, 2, dtype=torch.long))
    assert values.shape == (1, 2)


def test_lora_on_a_bf16_base_trains_fp32_adapters_under_autocast():
    """bf16 base weights + LoRA + bf16 autocast on the CPU (the real-model presets' setting, shrunk to the tiny
    model: CPU bf16 matmuls are slow): the adapters are fp32 (peft upcasts them, so AdamW steps them without
    master copies), two policy-gradient steps give finite losses, move every adapter and leave the bf16
    base exactly as loaded, with no gradient."""
    from rlx.models.forward import completion_logprobs
    from rlx.runtime.optim import MasterWeightAdamW, build_optimizer

    cfg = OmegaConf.create({"gradient_checkpointing": False, "lora": dict(LORA, dropout=0.05)})
    policy = prepare_policy(load_causal_lm("builtin:tiny", "bfloat16"), cfg,
                            OmegaConf.create({"gradient_checkpointing": False}))
    adapters = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    base = {n: p for n, p in policy.named_parameters() if not p.requires_grad}
    assert adapters and all("lora_" in n and p.dtype == torch.float32 for n, p in adapters.items())
    assert base and all(p.dtype == torch.bfloat16 for p in base.values())
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optim = dict(lr=1e-2, betas=[0.9, 0.99], eps=1e-8, weight_decay=0.0, schedule="constant", warmup_steps=0)
    optimizer, _ = build_optimizer(policy, 1, **optim)
    assert type(optimizer) is torch.optim.AdamW and not isinstance(optimizer, MasterWeightAdamW)  # fp32 adapters
    prompt_ids, prompt_mask = torch.tensor([[5, 9, 17, 3], [5, 9, 17, 3]]), torch.ones(2, 4, dtype=torch.long)  # (2, P)
    # (2, C)
    completion_ids, completion_mask = torch.tensor([[12, 7, 30], [8, 21, 4]]), torch.ones(2, 3, dtype=torch.long)
    advantages = torch.tensor([[1.0], [-1.0]])  # one completion rewarded, the other not
    policy.train()
    for step in range(2):  # peft starts lora_B at 0, so lora_A first gets a gradient in the second step
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, _ = completion_logprobs(policy, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                          temperature=0.7)
        loss = -(logp * advantages).mean()  # (2, C) -> ()
        assert torch.isfinite(loss), step
        loss.backward()
        assert all(p.grad is None for p in base.values())
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in adapters.values())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert all(torch.equal(p, before[n]) for n, p in base.items())  # the frozen bf16 base did not move
    assert all(not torch.equal(p, before[n]) for n, p in adapters.items())  # every adapter did
