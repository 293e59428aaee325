"""Pieces every training loop shares: prompts, optimizer and schedule, held-out evaluation, seeding."""

from __future__ import annotations

import functools
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlx.errors import UserError
from rlx.models.forward import completion_logprobs
from rlx.rewards import RewardComponent, compute_rewards, token_lists
from rlx.rewards.overlong import overlong_penalty
from rlx.rollout.hf import Rollout, generate
from rlx.rollout.prompts import format_prompts  # noqa: F401  (re-exported: loops and users import it from here)
from rlx.runtime.parallel import gather, global_sum


@dataclass
class Components:
    """What train.py builds from the config and hands to a loop."""

    accelerator: object
    model: object
    tokenizer: object
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[RewardComponent]
    run_dir: Path
    extras: dict = field(default_factory=dict)


@dataclass
class Parts:
    """Everything a loop starts from, built by rlx.build.build_parts (the one builder): the policy
    prepared by Accelerate with its optimizer and schedule, the frozen reference placed like the policy
    (None when the family or config does not use one; under LoRA the base with the adapter off, no
    copy), the PPO critic with its own optimizer and schedule, the rollout engine (None: generate with
    the policy), the checkpointer, the metrics log and the held-out evaluator (None where the loop
    evaluates its own way). `checkpointed`: training state the loop passes first to
    Checkpointer.restore (the schedules Accelerate did not prepare), in the order checkpoints hold it."""

    accelerator: object
    model: object
    tokenizer: object
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[RewardComponent]
    run_dir: Path
    optimizer: object
    scheduler: object
    checkpointer: object
    metrics_log: object
    reference: object = None
    value_model: object = None
    value_optimizer: object = None
    value_scheduler: object = None
    engine: object = None
    run_eval: object = None
    checkpointed: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def limit_prompt_length(tokenizer, rows: list[dict], max_tokens: int | None, mode: str, use_chat_template: bool,
                        system_prompt: str | None) -> tuple[list[dict], dict]:
    """Keep RL prompts within max_tokens tokens of model input (TRL/verl's max_prompt_length).
    mode "drop" leaves longer prompts out; "truncate" cuts the start of the (last) user message, keeping
    its end, until the rendered prompt fits. Returns the rows and counts {prompts, over_length, dropped, truncated}."""
    counts = {"prompts": len(rows), "over_length": 0, "dropped": 0, "truncated": 0}
    if max_tokens is None:
        return rows, counts
    if mode not in ("drop", "truncate"):
        raise UserError(f"data.overlong_prompts={mode!r}; valid choices: drop, truncate")

    def length(row):
        return len(tokenizer(format_prompts(tokenizer, [row], use_chat_template, system_prompt)[0],
                             add_special_tokens=False)["input_ids"])

    kept = []
    for row in rows:
        over = length(row) - max_tokens
        if over <= 0:
            kept.append(row)
            continue
        counts["over_length"] += 1
        if mode == "drop":
            counts["dropped"] += 1
            continue
        row = dict(row)
        for _ in range(4):  # re-tokenising the cut text can differ by a token or two
            messages = row["prompt"] if isinstance(row["prompt"], list) else None
            text = messages[-1]["content"] if messages else row["prompt"]
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            text = tokenizer.decode(ids[min(len(ids), over):])
            row["prompt"] = messages[:-1] + [dict(messages[-1], content=text)] if messages else text
            over = length(row) - max_tokens
            if over <= 0:
                break
        if over > 0:  # the template alone is longer than the budget
            counts["dropped"] += 1
            continue
        counts["truncated"] += 1
        kept.append(row)
    if not kept:
        raise UserError(f"data.max_prompt_length={max_tokens} leaves no training prompt; raise it")
    return kept, counts


def model_context(model) -> int | None:
    """The longest sequence the model's position embeddings cover (None when its config does not say)."""
    config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def check_context(tokenizer, rows: list[dict], context: int | None, max_new_tokens: int, use_chat_template: bool,
                  system_prompt: str | None, source: str) -> None:
    """Stop before training when a prompt plus the completion budget is longer than the model's context.

    Positions past max_position_embeddings either crash inside the model or (rotary models) silently
    extrapolate, so one line names the first such row, its length and the knobs that fix it."""
    if context is None or not rows:
        return
    if max_new_tokens >= context:
        raise UserError(f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context "
                        f"({context} tokens, max_position_embeddings); lower it")
    texts = format_prompts(tokenizer, rows, use_chat_template, system_prompt)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    budget = context - max_new_tokens
    for index, length in enumerate(lengths):
        if length > budget:
            over = sum(n > budget for n in lengths)
            raise UserError(f"{source} row {index}: the prompt is {length} tokens, and with rollout.max_new_tokens="
                            f"{max_new_tokens} it exceeds the model's context ({context} tokens; {over} of {len(rows)} "
                            f"prompts do); set data.max_prompt_length={budget} (drops or truncates them) or lower "
                            f"rollout.max_new_tokens")


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
        raise RuntimeError(f"optimizer step before the last of {accelerator.gradient_accumulation_steps} micro-batches: "
                           f"the loop's micro-batch count and train.py's gradient accumulation disagree")
    grad_norm = None
    if max_grad_norm:
        grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), max_grad_norm))
    if getattr(accelerator, "scaler", None) is None:  # fp16's loss scaler skips overflowing steps by design
        norm = grad_norm if grad_norm is not None else _local_grad_norm(model)
        if not math.isfinite(norm):  # NaN/inf loss or gradients: stop before the weights take them
            optimizer.zero_grad(set_to_none=True)
            from rlx.errors import NonFiniteError

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
    almost no weight of a bf16 model changes (tests/test_numerics.py counts them). float32 parameters are stepped in place, without a copy.
    Memory per low-precision parameter: 2 (weight) + 2 (gradient, accumulated in bf16 across micro-batches)
    + 4 (master) + 8 (AdamW moments, fp32) = 16 bytes during the backward pass, 2 more at the step, where
    each gradient moves to fp32 one tensor at a time; fp32 weights under bf16 autocast cost 4+4+8 = 16.
    The masters are part of the state dict, so a resumed run continues from the fp32 values."""

    def __init__(self, params, **kwargs):
        self.model_params = list(params)
        self.masters = [p if p.dtype == torch.float32 else p.detach().float().requires_grad_(True) for p in self.model_params]
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
    return any(os.environ.get(key, "").lower() in ("1", "true") for key in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"))


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


def eval_settings(cfg) -> dict:
    """Keyword arguments of `evaluate` from the config (the same for every loop)."""
    return dict(
        accuracy_key=cfg.reward.accuracy, use_chat_template=cfg.model.chat_template, system_prompt=cfg.data.system_prompt,
        max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size, on_error=cfg.reward.on_error,
    )


def batch_settings(cfg) -> dict:
    """Keyword arguments of `sample_batch` from the config (policy-gradient and PPO loops)."""
    return dict(
        prompts_per_step=cfg.prompts_per_step, max_new_tokens=cfg.rollout.max_new_tokens,
        min_new_tokens=cfg.rollout.get("min_new_tokens", 0), seed=cfg.seed, use_chat_template=cfg.model.chat_template,
        system_prompt=cfg.data.system_prompt, on_error=cfg.reward.on_error, accuracy_key=cfg.reward.accuracy,
        total_steps=cfg.steps, dynamic_sampling=cfg.algorithm.dynamic_sampling, max_rounds=cfg.algorithm.max_sample_batches,
    )


def eval_shard(count: int, acc) -> tuple[slice, int]:
    """This process's rows of an evaluation split over all processes: a contiguous block of
    ceil(count / N) rows (the last blocks shorter or empty), and how many copies of a row pad it to
    that size, so every process generates the same number of rows (the same collectives under ZeRO-3)
    and the gathered blocks start with the `count` real rows in order."""
    processes = acc.num_processes if acc is not None else 1
    rank = acc.process_index if acc is not None else 0
    per = -(-count // processes)
    lo, hi = min(count, rank * per), min(count, (rank + 1) * per)
    return slice(lo, hi), per - (hi - lo)


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict], rewards: list[RewardComponent], *, accuracy_key: str,
             use_chat_template: bool, system_prompt: str | None, max_new_tokens: int, batch_size: int,
             on_error: str = "raise", acc=None) -> tuple[dict, list[dict]]:
    """Greedy completions on held-out rows; returns eval/* metrics and per-row records.

    With several processes (acc), every process generates its block of the rows (eval_shard) and the
    per-row results are gathered, so each process returns the metrics of all rows; the records are
    this process's rows (the main process's are the first ones)."""
    mine, padding = eval_shard(len(rows), acc)
    rows = rows[mine] + rows[:1] * padding if rows else rows
    prompts = format_prompts(tokenizer, rows, use_chat_template, system_prompt)
    rollout = generate(model, tokenizer, prompts, samples_per_prompt=1, max_new_tokens=max_new_tokens,
                       greedy=True, batch_size=batch_size)
    total, per_component, _ = compute_rewards(rewards, prompts, rollout.texts, rows, on_error, system_prompt=system_prompt,
                                              completion_ids=token_lists(rollout.completion_ids, rollout.completion_mask))
    lengths, truncated = rollout.lengths.float(), rollout.truncated.float()
    local = {"total": total, "lengths": lengths, "truncated": truncated, **{f"component/{k}": v for k, v in per_component.items()}}
    if acc is not None and acc.num_processes > 1:  # (N x block,) -> the `count` real rows, in order
        count = int(global_sum(acc, mine.stop - mine.start))
        local = {name: gather(acc, values.float())[:count] for name, values in local.items()}
    total, lengths, truncated = local["total"], local["lengths"], local["truncated"]
    scores = {name[len("component/"):]: values for name, values in local.items() if name.startswith("component/")}
    metrics = {
        "eval/accuracy": torch.nan_to_num(scores[accuracy_key], nan=0.0).mean().item(),
        "eval/reward": total.mean().item(),
        "eval/mean_length": lengths.mean().item(),
        "eval/truncated_frac": truncated.mean().item(),
    }
    for name, values in scores.items():
        metrics[f"eval/{name}"] = torch.nan_to_num(values, nan=0.0).mean().item()
    real = mine.stop - mine.start
    records = [
        {"prompt": row["prompt"], "answer": row.get("answer"), "completion": text,
         "score": per_component[accuracy_key][i].item()}
        for i, (row, text) in enumerate(zip(rows[:real], rollout.texts[:real]))
    ]
    return metrics, records


def eval_due(step: int, every: int, last_step: int) -> bool:
    """Evaluate every `every` steps (eval.every; 0: never) and at the last step, on every process (each
    generates its share of the rows; a sharded model needs all of them in every forward pass)."""
    return bool(every) and (step % every == 0 or step == last_step)


def evaluate_at_start(at_start: bool, start_step: int, metrics_log, run_eval, extra: dict | None = None) -> dict:
    """The step-0 evaluation of a fresh run (eval.at_start), on every process; written to the metrics
    file (by the main process) together with `extra` (e.g. data counts). {} when skipped."""
    if not (at_start and start_step == 0):
        return {}
    metrics = run_eval(0)
    metrics_log.write(0, {**(extra or {}), **metrics})
    metrics_log.show(0, metrics)
    return metrics


def end_step(step: int, metrics: dict, metrics_log, checkpointer, log_every: int, last_step: int) -> None:
    """Write the step's row (every `log_every` steps, at evaluations and at the last step), show progress,
    and checkpoint when due (every checkpoint.every steps, at the end, and on Ctrl-C)."""
    if step % log_every == 0 or step == last_step or any(key.startswith("eval/") for key in metrics):
        metrics_log.write(step, metrics)
    metrics_log.show(step, metrics)
    checkpointer.step_done(step)


def task_evaluator(acc, model, tokenizer, rows: list[dict], rewards: list[RewardComponent], settings: dict):
    """run_eval(step) -> metrics: greedy evaluation of the (unwrapped) policy on held-out `rows`
    (settings: eval_settings(cfg))."""

    def run_eval(step: int) -> dict:
        metrics, _ = evaluate(acc.unwrap_model(model), tokenizer, rows, rewards, **settings, acc=acc)
        return metrics

    return run_eval


@torch.no_grad()
def batched_logprobs(model, rollout: Rollout, micro: int, with_entropy: bool = False, temperature: float = 1.0,
                     pack: bool = False):
    """Log-probs (N, C) of the sampled completions under `model` at the sampling temperature, without
    gradients, and the token entropies (N, C) when asked (else None). pack: padding-free forward (packed_forward)."""
    logps, entropies = [], []
    for lo in range(0, rollout.completion_ids.shape[0], micro):
        sl = slice(lo, lo + micro)
        logp, entropy = completion_logprobs(
            model, rollout.prompt_ids[sl], rollout.prompt_mask[sl], rollout.completion_ids[sl], rollout.completion_mask[sl],
            with_entropy=with_entropy, temperature=temperature, pack=pack,
        )
        logps.append(logp.cpu())
        if with_entropy:
            entropies.append(entropy.cpu())
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    mask = mask.to(values.dtype)
    return ((values * mask).sum() / mask.sum().clamp(min=1)).item()


def training_rewards(rewards: list[RewardComponent], overlong_buffer: int, overlong_weight: float,
                     max_new_tokens: int) -> list[RewardComponent]:
    """The reward components used in training: the configured ones, plus DAPO's overlong punishment."""
    components = list(rewards)
    if overlong_buffer > 0:
        fn = functools.partial(overlong_penalty, max_length=max_new_tokens, buffer=overlong_buffer)
        components.append(RewardComponent("overlong", fn, float(overlong_weight)))
    return components


def advantage_metrics(advantages: torch.Tensor, mask: torch.Tensor | None = None) -> dict:
    """train/advantage_mean|std|max over the samples (or valid tokens when a mask is given)."""
    values = advantages[mask.bool()] if mask is not None else advantages
    if values.numel() == 0:
        return {"train/advantage_mean": 0.0, "train/advantage_std": 0.0, "train/advantage_max": 0.0}
    return {
        "train/advantage_mean": values.mean().item(),
        "train/advantage_std": values.std().item() if values.numel() > 1 else 0.0,
        "train/advantage_max": values.abs().max().item(),
    }


class KLCoefficient:
    """The (possibly adaptive) KL coefficient, saved in checkpoints like any other training state."""

    def __init__(self, value: float):
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class ReferenceReset:
    """`algorithm.ref_reset_every` = N: the frozen reference becomes a copy of the current policy at the
    start of steps N+1, 2N+1, ... After a reset the reference is no longer the starting policy, so its
    weights are training state: registered with the Checkpointer (see `checkpointed`), they are saved
    in checkpoints and restored on resume."""

    def __init__(self, reference, every: int):
        self.reference, self.every = reference, int(every or 0)

    def checkpointed(self) -> dict:
        """{"reference": self} when resets can happen, for Checkpointer.restore(**...); else {}."""
        return {"reference": self} if self.reference is not None and self.every else {}

    def maybe_reset(self, step: int, policy) -> None:
        if self.reference is not None and self.every and step > 1 and (step - 1) % self.every == 0:
            self.reference.load_state_dict(policy.state_dict())

    def state_dict(self) -> dict:
        return {name: tensor.detach().cpu() for name, tensor in self.reference.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        self.reference.load_state_dict(state)


def mean_of(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
