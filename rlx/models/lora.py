"""LoRA adapters (peft), the reference model, and memory options applied to a loaded policy.

With LoRA only the adapters train, and the frozen reference policy of the KL penalty is the same
network with the adapters switched off: no second copy of the weights is held in memory.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from rlx.errors import UserError


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


def disable_dropout(model) -> None:
    """Dropout off in every module (nn.Dropout p=0 and the attention-probability dropout of transformers'
    attention modules). rlx puts the policy in train mode for its update passes, where gradient
    checkpointing acts; with dropout on, the same tokens would then score differently in the update than
    when sampled or scored for the old and reference log-probs (an importance ratio != 1 on-policy, a
    noisy KL). TRL's trainers default to the same. LoRA's own dropout (model.lora.dropout) is applied
    after this and stays as configured: it acts in the update passes only. The model's config (and so a
    saved checkpoint) keeps its dropout settings."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def prepare_policy(model, model_cfg, hardware_cfg):
    """Dropout off, then LoRA and gradient checkpointing as the config asks. Returns the (possibly
    wrapped) model."""
    disable_dropout(model)
    checkpointing = model_cfg.gradient_checkpointing or hardware_cfg.gradient_checkpointing
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    lora = getattr(model_cfg, "lora", None)
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
    """Frozen reference for the KL penalty: the adapter-disabled base under LoRA, else a frozen copy.
    Call it before `accelerator.prepare` (the copy is taken from the full weights, not ZeRO-3 shards),
    then `place_reference`."""
    if is_peft(policy):
        return AdapterDisabled(policy)
    return copy.deepcopy(policy).eval().requires_grad_(False)


def place_reference(reference, accelerator):
    """The frozen copy placed like the prepared policy: on its device (the copy keeps the policy's dtype),
    under DeepSpeed ZeRO-3 partitioned over the ranks by an optimizer-free DeepSpeed engine, and under
    FSDP2 sharded by `fully_shard` with the policy's plugin (one unit per decoder layer), so no rank holds
    a full second model; its forward passes are then collectives, run by every rank alike. The LoRA
    reference (the policy itself) and None pass through."""
    if reference is None or isinstance(reference, AdapterDisabled):
        return reference
    if getattr(accelerator, "is_fsdp2", False):
        from accelerate.utils import fsdp2_prepare_model

        return fsdp2_prepare_model(accelerator, reference.to(accelerator.device)).eval()
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and plugin.deepspeed_config["zero_optimization"]["stage"] == 3:
        import deepspeed

        config = copy.deepcopy(plugin.deepspeed_config)
        config.pop("optimizer", None)
        config.pop("scheduler", None)
        engine, *_ = deepspeed.initialize(model=reference, config=config)
        engine.eval()  # DeepSpeedEngine.eval returns None, not the module
        return engine
    return reference.to(accelerator.device)


def save_adapter(model, folder: Path, state_dict: dict | None = None) -> None:
    """With LoRA, write the adapter (peft save_pretrained format); otherwise nothing. `state_dict`: the
    adapter's full weights gathered from a sharded policy (rlx.runtime.parallel.gathered_trainable_weights)."""
    if is_peft(model):
        model.save_pretrained(folder, state_dict=state_dict, save_embedding_layers=saves_embeddings(model))


def saves_embeddings(model) -> bool | str:
    """peft's `save_embedding_layers` for a LoRA model: rlx never resizes the vocabulary, so the embeddings are
    saved exactly when the adapter targets them. peft's default ("auto") would otherwise look the base model's
    config up (on the hub, for a hub id) at every save, and warn when it cannot (builtin:tiny, offline runs).
    A regex target (a str): peft's own rule."""
    from peft.utils.constants import EMBEDDING_LAYER_NAMES

    targets = [config.target_modules for config in model.peft_config.values()]
    if any(t is None or isinstance(t, str) for t in targets):
        return "auto"
    return any(name in EMBEDDING_LAYER_NAMES for t in targets for name in t)


FINAL_MARKER = "rlx_complete.json"  # written last into final/: a final/ without it is partial


def final_is_complete(run_dir: Path, merged: bool = False) -> bool:
    folders = ["final"] + (["final_merged"] if merged else [])
    return all((Path(run_dir) / name / FINAL_MARKER).is_file() for name in folders)


def portable_base_name(model, base_name: str | None) -> None:
    """Record the base model of a LoRA adapter by its config name (builtin:tiny, a hub id, the path the
    user gave), not the absolute folder it was loaded from, so a saved adapter survives moving the run."""
    if base_name is not None and is_peft(model):
        for config in model.peft_config.values():
            config.base_model_name_or_path = str(base_name)


def save_final(model, tokenizer, run_dir: Path, merged: bool, step: int | None = None,
               state_dict: dict | None = None, base_name: str | None = None) -> None:
    """<run>/final: the full model, or with LoRA the adapter; with `merged`, also <run>/final_merged.

    Each is written into a temporary folder and renamed when complete, so a kill never leaves a
    partial final/ (resume rebuilds a missing one from the last checkpoint).
    `state_dict`: the full weights gathered over the ranks of a sharded policy
    (rlx.runtime.parallel.full_state_dict)."""
    import json
    import os
    import shutil

    from rlx.runtime.storage import writing

    portable_base_name(model, base_name)

    def write(name: str, what, state=None) -> None:
        target, tmp = Path(run_dir) / name, Path(run_dir) / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        with writing(target, f"the final model ({name}/)", partial=tmp):  # a storage fault: one line, tmp removed
            extra = {"save_embedding_layers": saves_embeddings(what)} if is_peft(what) else {}
            what.save_pretrained(tmp, state_dict=state, **extra)
            tokenizer.save_pretrained(tmp)
            (tmp / FINAL_MARKER).write_text(json.dumps({"step": step}) + "\n")
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)

    write("final", model, state_dict)
    if merged and is_peft(model):
        write("final_merged", copy.deepcopy(model).merge_and_unload())
