"""LoRA adapters (peft), the reference model, and memory options applied to a loaded policy.

With LoRA only the adapters train, and the frozen reference policy of the KL penalty is the same
network with the adapters switched off: no second copy of the weights is held in memory.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from rlx.config import UserError


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def apply_lora(model, rank: int, alpha: float, dropout: float, target_modules):
    """Wrap `model` with LoRA adapters on `target_modules` ("all-linear" or a list of module names)."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise UserError(f"model.lora.rank={rank} must be at least 1")
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # peft: target modules not found in the model
        raise UserError(f"model.lora.target_modules={targets}: {str(exc).splitlines()[0]}") from None


def prepare_policy(model, model_cfg, hardware_cfg):
    """LoRA and gradient checkpointing, as the config asks. Returns the (possibly wrapped) model."""
    checkpointing = model_cfg.gradient_checkpointing or hardware_cfg.gradient_checkpointing
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    lora = model_cfg.get("lora")
    if lora is not None and lora.enabled:
        if checkpointing:
            model.enable_input_require_grads()  # frozen embeddings would otherwise cut the gradient path
        model = apply_lora(model, lora.rank, lora.alpha, lora.dropout, lora.target_modules)
    return model


class AdapterDisabled(torch.nn.Module):
    """The base model of a peft policy, as a module: calls run the policy with its adapters off.

    Holds the policy by reference (not as a submodule), so no weights are copied or registered twice."""

    def __init__(self, peft_model):
        super().__init__()
        object.__setattr__(self, "policy", peft_model)

    def parameters(self, recurse: bool = True):
        return self.policy.parameters(recurse)

    def forward(self, *args, **kwargs):
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


def reference_model(policy):
    """Frozen reference for the KL penalty: the adapter-disabled base under LoRA, else a frozen copy."""
    if is_peft(policy):
        return AdapterDisabled(policy)
    return copy.deepcopy(policy).eval().requires_grad_(False)


def save_adapter(model, folder: Path) -> None:
    """With LoRA, write the adapter (peft save_pretrained format); otherwise nothing."""
    if is_peft(model):
        model.save_pretrained(folder)


def portable_base_name(model, base_name: str | None) -> None:
    """Record the base model of a LoRA adapter by its config name (builtin:tiny, a hub id, the path the
    user gave), not the absolute folder it was loaded from, so a saved adapter survives moving the run."""
    if base_name is not None and is_peft(model):
        for config in model.peft_config.values():
            config.base_model_name_or_path = str(base_name)


def save_final(model, tokenizer, run_dir: Path, merged: bool, base_name: str | None = None) -> None:
    """<run>/final: the full model, or with LoRA the adapter; with `merged`, also <run>/final_merged."""
    portable_base_name(model, base_name)
    model.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")
    if merged and is_peft(model):
        full = copy.deepcopy(model).merge_and_unload()
        full.save_pretrained(run_dir / "final_merged")
        tokenizer.save_pretrained(run_dir / "final_merged")
