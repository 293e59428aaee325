"""Pieces every training loop shares: prompts, optimizer and schedule, held-out evaluation, seeding."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlx.parallel import gather, global_sum
from rlx.rewards import RewardComponent, compute_rewards
from rlx.rollout.hf import generate


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def format_prompts(tokenizer, rows: list[dict], use_chat_template: bool, system_prompt: str | None) -> list[str]:
    """User messages -> model input text (chat template with the generation prompt when available)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        out = []
        for row in rows:
            messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
            messages.append({"role": "user", "content": row["prompt"]})
            out.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        return out
    prefix = f"{system_prompt}\n\n" if system_prompt else ""
    return [prefix + row["prompt"] for row in rows]


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int):
    """Multiplier of the peak learning rate at each optimizer step: linear warmup, then the schedule."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        progress = min(max(progress, 0.0), 1.0)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        raise ValueError(f"unknown optim.schedule '{schedule}'; valid choices: constant, cosine, linear")

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
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def build_optimizer(model, optim_cfg, total_updates: int):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps, weight_decay=optim_cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(optim_cfg.schedule, optim_cfg.warmup_steps, total_updates)
    )
    return optimizer, scheduler


def eval_settings(cfg) -> dict:
    """Keyword arguments of `evaluate` from the config (the same for every loop)."""
    return dict(
        accuracy_key=cfg.reward.accuracy, use_chat_template=cfg.model.chat_template, system_prompt=cfg.data.system_prompt,
        max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size, on_error=cfg.reward.on_error,
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
    total, per_component, _ = compute_rewards(rewards, prompts, rollout.texts, rows, on_error)
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


def eval_due(cfg, step: int, acc) -> bool:
    """Evaluate every eval.every steps and at the last step, on every process (each generates its share
    of the rows; a sharded model needs all of them in every forward pass)."""
    return bool(cfg.eval.every) and (step % cfg.eval.every == 0 or step == cfg.steps)


def evaluate_at_start(cfg, acc, start_step: int, metrics_log, run_eval, extra: dict | None = None) -> dict:
    """The step-0 evaluation of a fresh run (eval.at_start), on every process; written to the metrics
    file (by the main process) together with `extra` (e.g. data counts). {} when skipped."""
    if not (cfg.eval.at_start and start_step == 0):
        return {}
    metrics = run_eval(0)
    metrics_log.write(0, {**(extra or {}), **metrics})
    metrics_log.show(0, metrics)
    return metrics


def end_step(cfg, step: int, metrics: dict, metrics_log, checkpointer) -> None:
    """Write the step's row (every log.every steps, at evaluations and at the last step), show progress,
    and checkpoint when due (every checkpoint.every steps, at the end, and on Ctrl-C)."""
    if step % cfg.log.every == 0 or step == cfg.steps or any(key.startswith("eval/") for key in metrics):
        metrics_log.write(step, metrics)
    metrics_log.show(step, metrics)
    checkpointer.step_done(step)


def task_evaluator(cfg, acc, parts: Components, model):
    """run_eval(step) -> metrics: greedy evaluation of the (unwrapped) policy on the task's held-out split."""
    kwargs, rows = eval_settings(cfg), parts.eval_rows[: cfg.eval.size]

    def run_eval(step: int) -> dict:
        metrics, _ = evaluate(acc.unwrap_model(model), parts.tokenizer, rows, parts.rewards, **kwargs, acc=acc)
        return metrics

    return run_eval
