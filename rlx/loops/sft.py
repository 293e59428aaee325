"""Supervised fine-tuning: token-mean negative log-likelihood of the target completion.

Each step draws `algorithm.batch_size` rows, renders the prompt (chat template) and the target
completion (data.completion_template + EOS), and takes one optimizer step on the mean NLL of the
completion tokens, accumulated exactly over micro-batches.
"""

from __future__ import annotations

import logging
import time

import torch

from rlx.data.sources import PromptStream
from rlx.engines.generator import eval_policy_generator
from rlx.evaluation.tasks import evaluate, task_eval_settings
from rlx.loops.common import Parts, end_step, eval_due, evaluate_at_start
from rlx.models.forward import completion_logprobs
from rlx.rollout.prompts import format_prompts
from rlx.runtime.optim import optimizer_step
from rlx.runtime.parallel import backward, global_sum, shard
from rlx.runtime.rundir import write_samples

log = logging.getLogger("rlx")


def tokenize_pairs(tokenizer, prompts: list[str], completions: list[str]):
    """Left-padded prompt ids and right-padded completion ids (each completion ends with EOS)."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    eos = tokenizer.eos_token or ""
    pieces = [tokenizer(c + eos, add_special_tokens=False)["input_ids"] for c in completions]
    width = max(len(p) for p in pieces)
    completion_ids = torch.full((len(pieces), width), tokenizer.pad_token_id, dtype=torch.long)  # (N, C)
    completion_mask = torch.zeros((len(pieces), width), dtype=torch.long)  # (N, C)
    for i, piece in enumerate(pieces):
        completion_ids[i, : len(piece)] = torch.tensor(piece)
        completion_mask[i, : len(piece)] = 1
    return enc["input_ids"], enc["attention_mask"], completion_ids, completion_mask


def train_sft(settings, parts: Parts) -> dict:
    acc, tokenizer, run_dir = parts.accelerator, parts.tokenizer, parts.run_dir
    model, optimizer, scheduler = parts.model, parts.optimizer, parts.scheduler
    stream = PromptStream(parts.train_rows, settings.seed)
    checkpointer, metrics_log = parts.checkpointer, parts.metrics_log
    start_step = checkpointer.restore(**parts.checkpointed, data=stream)
    eval_settings = task_eval_settings(settings)
    eval_rows = parts.eval_rows[: settings.eval.size]
    # no rollout here
    eval_generator = eval_policy_generator(acc.unwrap_model(model), tokenizer, eval_settings.batch_size)

    def run_eval(step: int) -> dict:
        metrics, records = evaluate(eval_generator, tokenizer, eval_rows, parts.rewards, eval_settings, acc=acc,
                                    step=step)
        if acc.is_main_process:
            write_samples(run_dir, step, records[: settings.log.num_samples])
        return metrics

    last_eval = evaluate_at_start(settings.eval.at_start, start_step, metrics_log, run_eval)

    batch_size, micro = settings.algorithm.batch_size, settings.micro_batch_size
    model.train()  # gradient checkpointing acts only in train mode; dropout is off (models/lora.py)
    for step in range(start_step + 1, settings.steps + 1):
        start = time.perf_counter()
        rows = stream.take(batch_size)[shard(batch_size, acc)]  # this process's share of the global batch
        prompts = format_prompts(tokenizer, rows, settings.model.chat_template, settings.data.system_prompt)
        targets = [settings.data.completion_template.format(answer=row["answer"]) for row in rows]
        prompt_ids, prompt_mask, completion_ids, completion_mask = tokenize_pairs(tokenizer, prompts, targets)
        total_tokens = global_sum(acc, completion_mask.sum().item())  # token-mean over the global batch
        loss_sum = 0.0
        for lo in range(0, len(rows), micro):
            sl = slice(lo, lo + micro)
            logp, _ = completion_logprobs(model, prompt_ids[sl], prompt_mask[sl], completion_ids[sl],
                                          completion_mask[sl])
            mask = completion_mask[sl].to(logp.device, logp.dtype)
            loss = -(logp * mask).sum() / total_tokens  # token-mean over the whole batch
            backward(acc, loss, model)
            loss_sum += loss.item()
        grad_norm = optimizer_step(acc, model, optimizer, scheduler, settings.optim.max_grad_norm)
        elapsed = time.perf_counter() - start
        metrics = {
            "train/loss": global_sum(acc, loss_sum),
            "train/lr": scheduler.get_last_lr()[0],
            "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
            "perf/step_time_s": elapsed,
            "perf/tokens_per_s": total_tokens / elapsed,
        }
        if eval_due(step, settings.eval.every, settings.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        end_step(step, metrics, metrics_log, checkpointer, settings.log.every, settings.steps)
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}
