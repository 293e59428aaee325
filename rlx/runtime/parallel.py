"""Data parallelism inside a loop: each process takes its shard of the global batch, and every
statistic that defines the update (group advantages, token-mean normalisers) is computed over the
global batch, so N processes take exactly the optimizer step one process would take.

Gradients: DistributedDataParallel averages gradients over processes. A loss normalised by a global
count (all tokens of the batch) gives on process r the gradient g_r of its share of the global loss,
and the full gradient is sum_r g_r = N * mean_r g_r; so each process scales its loss by N
(`gradient_scale`) and DDP's average becomes that sum. The K micro-batches of one optimizer step go
through Accelerate's gradient accumulation (`backward`): Accelerate (and DeepSpeed's engine) divide each
micro-batch loss by K, so the scale is N x K, and gradients are synchronised (DDP) or the DeepSpeed
engine steps only on the K-th micro-batch.

Sharded engines (DeepSpeed ZeRO, FSDP2) run the same loops: `deepspeed_config` builds DeepSpeed's
config from rlx's settings, `full_state_dict` gathers the policy's full weights (final save, vLLM),
and every forward pass of a sharded model is a collective, so all ranks must run the same number of
them (generation keeps stepping until every rank is done: engines/hf.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def shard(count: int, accelerator) -> slice:
    """This process's contiguous share of `count` items (count must split evenly; see config_checks.check_batch)."""
    per = count // accelerator.num_processes
    return slice(accelerator.process_index * per, (accelerator.process_index + 1) * per)


def gradient_scale(accelerator) -> float:
    """Factor on a globally normalised loss so that DDP's gradient average over N processes, after
    Accelerate's division by K accumulation steps, becomes the global gradient: N x K."""
    return float(accelerator.num_processes * accelerator.gradient_accumulation_steps)


def backward(accelerator, loss: torch.Tensor, *models) -> None:
    """Backward of one micro-batch's share of a globally normalised loss. Inside Accelerate's
    `accumulate`, gradients are all-reduced (DDP) or the DeepSpeed engine steps (clip, optimizer,
    schedule) only on the last of the K micro-batches of an optimizer step."""
    with accelerator.accumulate(*models):
        accelerator.backward(loss * gradient_scale(accelerator))


def global_max(accelerator, value: int) -> int:
    """The largest `value` over processes (one all-reduce)."""
    if accelerator.num_processes == 1:
        return value
    top = torch.tensor([int(value)], dtype=torch.int64, device=accelerator.device)
    return int(accelerator.reduce(top, reduction="max").item())


def set_accumulation(accelerator, count: int) -> None:
    """Accelerate's gradient accumulation set to `count` micro-batches for the coming optimizer step.

    Token-budget micro-batches (micro_batch_tokens) vary in number from step to step; Accelerate syncs the
    gradients (DDP all-reduce) on the count-th backward and `gradient_scale` reads the count, so the
    global normalisers stay exact. Not for DeepSpeed, whose engine fixes the count (config_checks.check_batch)."""
    accelerator.gradient_accumulation_steps = count
    accelerator.step = 0


def micro_batches_per_step(local_batch: int, micro_batch_size: int) -> int:
    """K = ceil(local batch of one optimizer step / micro_batch_size): the micro-batches every loop runs
    before each optimizer step (Accelerate's gradient_accumulation_steps)."""
    return max(1, -(-int(local_batch) // int(micro_batch_size)))


@dataclass(frozen=True)
class ZeroSettings:
    """DeepSpeed ZeRO's knobs (hardware.deepspeed): the stage, where the optimizer state and (stage 3) the
    parameters are offloaded ("none", "cpu", ...), and stage 3's param_persistence_threshold."""

    stage: int
    offload_optimizer: str = "none"
    offload_param: str = "none"
    param_persistence_threshold: int | None = None


def deepspeed_config(zero: ZeroSettings, micro_batch_size: int, accumulation: int, world_size: int,
                     max_grad_norm: float | None, mixed_precision: str = "no") -> dict:
    """DeepSpeed's config dict from rlx's settings, every number filled in.

    Accelerate fills DeepSpeed's "auto" batch sizes from a prepared dataloader, which rlx's loops do
    not use, so they are given here: train_batch_size = micro x K x world size. DeepSpeed clips at
    `gradient_clipping` inside its step (1.0 when left to Accelerate), so it is optim.max_grad_norm
    (0 = no clipping). Stage 3 gathers the full 16-bit-or-fp32 weights on save (final/ holds a full
    state dict); param_persistence_threshold: stage-3 parameters with fewer elements stay whole on every
    process (None: DeepSpeed's default, 1e5, which keeps a tiny model entirely unpartitioned).
    Example: stage 2, micro 2, K 4, 2 processes, clip 1.0 ->
    {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
     "gradient_clipping": 1.0, "zero_optimization": {"stage": 2, ...}, ...}."""
    zero_stage = zero.stage
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"hardware.deepspeed.zero_stage={zero_stage}; valid choices: 0, 1, 2, 3")
    if mixed_precision not in ("no", "bf16", "fp16"):
        raise ValueError(f"hardware.mixed_precision={mixed_precision}; valid choices: no, bf16, fp16")
    optimization = {"stage": int(zero_stage)}
    if zero.offload_optimizer != "none":
        optimization["offload_optimizer"] = {"device": zero.offload_optimizer}
    if zero_stage == 3:
        optimization["stage3_gather_16bit_weights_on_model_save"] = True
        if zero.param_persistence_threshold is not None:
            optimization["stage3_param_persistence_threshold"] = int(zero.param_persistence_threshold)
        if zero.offload_param != "none":
            optimization["offload_param"] = {"device": zero.offload_param}
    return {
        "train_batch_size": int(micro_batch_size) * int(accumulation) * int(world_size),
        "train_micro_batch_size_per_gpu": int(micro_batch_size),
        "gradient_accumulation_steps": int(accumulation),
        "gradient_clipping": float(max_grad_norm or 0.0),
        "zero_optimization": optimization,
        "bf16": {"enabled": mixed_precision == "bf16"},
        "fp16": {"enabled": mixed_precision == "fp16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # DeepSpeed's own progress lines: rlx logs its metrics
    }


def fsdp_plugin(fsdp_cfg, mixed_precision: str = "no"):
    """Accelerate's FSDP2 plugin (torch's `fully_shard`) from rlx's `hardware.fsdp` settings.

    Every decoder layer is its own FSDP2 unit (auto_wrap_policy TRANSFORMER_BASED_WRAP: the classes in
    the model's `_no_split_modules`), the root module takes the rest (embeddings, final norm, head).
    reshard_after_forward: true frees each unit's gathered parameters after its forward (ZeRO-3-like),
    false keeps them until the backward (ZeRO-2-like, more memory, fewer all-gathers). Checkpoints:
    SHARDED_STATE_DICT writes each rank's shards through torch.distributed.checkpoint (a `.distcp` file
    per rank), FULL_STATE_DICT one file gathered on rank 0. The model is loaded whole on every rank and
    sharded by `prepare` (cpu_ram_efficient_loading off: rlx copies the KL reference from the full weights)."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    if int(fsdp_cfg.version) != 2:
        raise ValueError(f"hardware.fsdp.version={fsdp_cfg.version}; rlx runs FSDP2 only (valid choice: 2)")
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, reshard_after_forward=bool(fsdp_cfg.reshard_after_forward),
        auto_wrap_policy=str(fsdp_cfg.auto_wrap_policy).lower(), state_dict_type=str(fsdp_cfg.state_dict_type),
        cpu_offload=bool(fsdp_cfg.cpu_offload), cpu_ram_efficient_loading=False)
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    return plugin


def use_fsdp_on_cpu(accelerator, plugin) -> None:
    """Run Accelerate's FSDP2 path on CPU processes (gloo).

    Accelerate 1.15 picks FSDP only on accelerators: on the CPU its state says MULTI_CPU and the plugin
    is dropped, so `prepare` would wrap the model in DDP. torch's FSDP2 itself runs on gloo, so both of
    Accelerate's shared state objects (AcceleratorState, and PartialState, which AcceleratorState copies
    from whenever it is constructed again) are pointed at FSDP with rlx's plugin, before `prepare`.
    Nothing changes where Accelerate already chose FSDP (GPUs)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.FSDP:
        return
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        raise RuntimeError(f"FSDP on {accelerator.distributed_type}: expected several CPU processes (gloo)")
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def full_state_dict(accelerator, model) -> dict:
    """The policy's full (unsharded) state dict, gathered over the ranks of a sharded engine.

    Every process must call it (the gather is a collective); DDP and one process return the module's own
    state dict. The one way to read the policy's complete weights: final save, vLLM weight sync.
    A tied weight (the output head sharing the embeddings) appears once, under its first name, as in the
    module's own save_pretrained: gathered copies no longer share storage, so the duplicate would be written."""
    state = accelerator.get_state_dict(model)
    if not state:  # ranks other than the main one get nothing (DeepSpeed ZeRO-3) or an empty dict
        return state
    first_name, tied = {}, set()  # id(parameter) -> its first name; the later names of shared parameters
    for name, param in accelerator.unwrap_model(model).named_parameters(remove_duplicate=False):
        if id(param) in first_name:
            tied.add(name)
        else:
            first_name[id(param)] = name
    return {k: v for k, v in state.items() if k not in tied}


def gathered_trainable_weights(model) -> dict | None:
    """{name: full tensor} of the trainable parameters (a LoRA adapter) of an FSDP2-sharded model, gathered
    from their DTensor shards (a collective: every rank calls it); None when the model is not FSDP2-sharded.
    Only the adapter moves, not the frozen base: what a checkpoint's adapter/ folder needs."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not named or not _is_dtensor(named[0][1]):
        return None
    return {name: p.detach().full_tensor().cpu() for name, p in named}


def is_sharded(model) -> bool:
    """True when the model's parameters are partitioned over ranks (DeepSpeed ZeRO-3 or FSDP2): a
    parameter then holds only a shard (ZeRO-3: an empty placeholder, FSDP2: a DTensor), so code that
    reads weights directly (the chunked output head, the hand-written decode step) must not run."""
    for param in model.parameters():
        return hasattr(param, "ds_id") or _is_dtensor(param)
    return False


def _is_dtensor(tensor) -> bool:
    return type(tensor).__name__ == "DTensor" or type(getattr(tensor, "data", None)).__name__ == "DTensor"


def gather(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate a per-process (n, ...) tensor in process order -> (N * n, ...) on the CPU."""
    if accelerator.num_processes == 1:
        return tensor
    return accelerator.gather(tensor.to(accelerator.device)).cpu()


def gather_padded(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate per-process (n, T_r) tensors whose width differs (each process pads its completions to
    its own longest) -> (N * n, max_r T_r) on the CPU, right-padded with zeros."""
    if accelerator.num_processes == 1:
        return tensor
    padded = accelerator.pad_across_processes(tensor.to(accelerator.device), dim=1, pad_index=0)
    return accelerator.gather(padded).cpu()


def global_sum(accelerator, value: float) -> float:
    if accelerator.num_processes == 1:
        return value
    total = torch.tensor([float(value)], dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(total, reduction="sum").item()


def global_mean(accelerator, value: float) -> float:
    return global_sum(accelerator, value) / accelerator.num_processes
