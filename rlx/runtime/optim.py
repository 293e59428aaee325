"""The policy's optimizer and schedule: AdamW (torch's fused kernel where it applies, fp32 master weights for
bf16/fp16 parameters), a warmup + constant/cosine/linear schedule, and the optimizer step with its checks."""

from __future__ import annotations

import math
import os

import torch

from rlx.errors import NonFiniteError

# optim.schedule after the warmup: fn(progress in [0, 1]) -> multiplier of the peak learning rate
SCHEDULES = {
    "constant": lambda progress: 1.0,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1.0 - progress,
}


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int):
    """Multiplier of the peak learning rate at each optimizer step: linear warmup, then the schedule."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown optim.schedule '{schedule}'; valid choices: {', '.join(SCHEDULES)}")
    after_warmup = SCHEDULES[schedule]

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return after_warmup(min(max(progress, 0.0), 1.0))

    return factor


def optimizer_step(accelerator, model, optimizer, scheduler, max_grad_norm: float | None) -> float | None:
    """Clip the global gradient norm (when max_grad_norm is set), step, advance the schedule, clear the
    gradients. Returns the pre-clipping gradient norm, or None without clipping. Under DeepSpeed the
    engine has already clipped (at optim.max_grad_norm) and stepped in the last micro-batch's backward;
    the calls here then return its norm and do nothing else."""
    if not accelerator.sync_gradients:  # a loop ran fewer micro-batches than gradient_accumulation_steps
        raise RuntimeError(f"optimizer step before the last of {accelerator.gradient_accumulation_steps} "
                           "micro-batches: the loop's micro-batch count and train.py's gradient accumulation disagree")
    grad_norm = None
    if max_grad_norm:
        grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), max_grad_norm))
    if getattr(accelerator, "scaler", None) is None:  # fp16's loss scaler skips overflowing steps by design
        norm = grad_norm if grad_norm is not None else _local_grad_norm(model)
        if not math.isfinite(norm):  # NaN/inf loss or gradients: stop before the weights take them
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError("the gradient norm (from the loss or a reward)", norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW that steps float32 master copies of the low-precision (bf16/fp16) parameters it is given.

    Mixed-precision training as in Micikevicius et al. 2018 (and DeepSpeed's bf16 optimizer, verl's FSDP
    actor): the model keeps its weights in bf16 for compute, the optimizer keeps an fp32 copy w32 of
    each, and at every step
        g32 = float32(grad);  w32 <- AdamW(w32, g32);  w <- bf16(w32)
    Without it an update below half a bf16 ulp of the weight (about |w| 2^-8) rounds away: at lr 1e-6
    almost no weight of a bf16 model changes (tests/test_numerics.py counts them). float32 parameters are stepped in
    place, without a copy. Memory per low-precision parameter: 2 (weight) + 2 (gradient, accumulated in bf16 across
    micro-batches) + 4 (master) + 8 (AdamW moments, fp32) = 16 bytes during the backward pass, 2 more at the step, where
    each gradient moves to fp32 one tensor at a time; fp32 weights under bf16 autocast cost 4+4+8 = 16.
    The masters are part of the state dict, so a resumed run continues from the fp32 values."""

    def __init__(self, params, **kwargs):
        self.model_params = list(params)
        self.masters = [p if p.dtype == torch.float32 else p.detach().float().requires_grad_(True)
                        for p in self.model_params]
        super().__init__(self.masters, **kwargs)

    @torch.no_grad()
    def _follow_devices(self) -> None:
        """Keep each master (and its AdamW moments) on its parameter's device. The optimizer is built before
        `accelerator.prepare` moves the model to the GPU, so the masters start on the CPU."""
        moved = {}
        for index, (param, master) in enumerate(zip(self.model_params, self.masters)):
            if master is not param and master.device != param.device:
                self.masters[index] = moved[master] = master.detach().to(param.device).requires_grad_(True)
                state = self.state.pop(master, {})  # moments; the step count stays where AdamW keeps it
                if state:
                    self.state[self.masters[index]] = {key: value.to(param.device) if torch.is_tensor(value)
                                                       and value.dim() > 0 else value for key, value in state.items()}
        if moved:
            for group in self.param_groups:
                group["params"] = [moved.get(p, p) for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        self._follow_devices()
        for param, master in zip(self.model_params, self.masters):
            if master is not param:
                master.grad = None if param.grad is None else param.grad.float()
                param.grad = None
        loss = super().step(closure)
        for param, master in zip(self.model_params, self.masters):
            if master is not param:
                param.copy_(master)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param in self.model_params:
            param.grad = None

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["master_weights"] = [m.detach().clone() for p, m in zip(self.model_params, self.masters) if m is not p]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("master_weights", None)
        self._follow_devices()  # so that the loaded moments land on the parameters' device
        super().load_state_dict(state_dict)
        if saved is not None:
            with torch.no_grad():
                low = [(p, m) for p, m in zip(self.model_params, self.masters) if m is not p]
                for (param, master), value in zip(low, saved):
                    master.copy_(value)
                    param.copy_(value)


def _engine_keeps_master_weights() -> bool:
    """DeepSpeed and FSDP (set up by `accelerate launch`) keep their own fp32 copies of the weights."""
    return any(os.environ.get(key, "").lower() in ("1", "true")
               for key in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"))


def fused_adamw_supported(params) -> bool:
    """Whether torch's fused AdamW kernel takes these parameters: plain (not DTensor) float tensors on the CPU
    or a GPU, outside DeepSpeed / FSDP (their engines step flattened or sharded states themselves). It is the
    same update as the per-parameter loop torch otherwise runs on CPU tensors (tests/test_numerics.py), in
    one pass per tensor: at the 0.5B shape on 2 CPU threads 0.2 s per step instead of 1.3-2.5 s."""
    from torch.distributed.tensor import DTensor

    return bool(params) and not _engine_keeps_master_weights() and all(
        p.device.type in ("cpu", "cuda") and not isinstance(p, DTensor)
        and p.dtype in (torch.float32, torch.bfloat16, torch.float16) for p in params)


def _local_grad_norm(model) -> float:
    grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def build_optimizer(model, total_updates: int, *, lr: float, betas, eps: float, weight_decay: float, schedule: str,
                    warmup_steps: int):
    """AdamW over the trainable parameters (with fp32 master weights when some are bf16/fp16), and the
    learning-rate schedule (optim.* settings: optimizer_settings(cfg.optim))."""
    params = [p for p in model.parameters() if p.requires_grad]
    low_precision = any(p.dtype != torch.float32 for p in params)
    settings = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    if low_precision and not _engine_keeps_master_weights():
        optimizer = MasterWeightAdamW(params, **settings)
    else:
        optimizer = torch.optim.AdamW(params, **settings, fused=fused_adamw_supported(params) or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(schedule, warmup_steps, total_updates))
    return optimizer, scheduler


def optimizer_settings(optim_cfg) -> dict:
    """Keyword arguments of `build_optimizer` from the optim section."""
    return dict(lr=optim_cfg.lr, betas=list(optim_cfg.betas), eps=optim_cfg.eps, weight_decay=optim_cfg.weight_decay,
                schedule=optim_cfg.schedule, warmup_steps=optim_cfg.warmup_steps)
