"""Policy-gradient training loop (GRPO family), read top to bottom.

Each step:
  1. draw `prompts_per_step` prompts and sample G = rollout.samples_per_prompt completions for each;
  2. score them with every reward component (reward/<name>) and sum by weight;
  3. turn rewards into advantages (algorithms/advantages.py);
  4. optimise the clipped surrogate (algorithms/losses.py), plus an optional KL penalty to a frozen
     reference (algorithms/kl.py), for `algorithm.epochs` passes of `algorithm.mini_batches` optimizer
     steps each, accumulating exactly over micro-batches of `micro_batch_size` sequences.
Departures from the GRPO paper: token-mean aggregation by default (DAPO), and the old log-probs are
not recomputed when only one optimizer step is taken per batch (the ratio is then exactly 1).
"""

from __future__ import annotations

import logging
import time

import torch

from rlx.algorithms.advantages import group_advantages, zero_std_group_fraction
from rlx.algorithms.kl import kl_penalty
from rlx.algorithms.losses import aggregate, clipped_surrogate
from rlx.checkpoint import Checkpointer, GeneratorState
from rlx.data.tasks import PromptStream
from rlx.loops.common import Components, build_optimizer, evaluate, format_prompts
from rlx.models.forward import completion_logprobs
from rlx.models.lora import reference_model
from rlx.parallel import gather, global_mean, global_sum, gradient_scale, shard
from rlx.rewards import compute_rewards
from rlx.rollout.hf import Rollout, generate
from rlx.rollout.sampling import sample_seed
from rlx.run import MetricsLog, write_samples

log = logging.getLogger("rlx")


@torch.no_grad()
def batched_logprobs(model, rollout: Rollout, micro: int) -> torch.Tensor:
    """Log-probs (N, C) of the sampled completions under `model`, without gradients."""
    out = []
    for lo in range(0, rollout.completion_ids.shape[0], micro):
        sl = slice(lo, lo + micro)
        logp, _ = completion_logprobs(
            model, rollout.prompt_ids[sl], rollout.prompt_mask[sl], rollout.completion_ids[sl], rollout.completion_mask[sl]
        )
        out.append(logp.cpu())
    return torch.cat(out)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    mask = mask.to(values.dtype)
    return ((values * mask).sum() / mask.sum().clamp(min=1)).item()


def train_policy_gradient(cfg, parts: Components) -> dict:
    algo, roll = cfg.algorithm, cfg.rollout
    acc, tokenizer, run_dir = parts.accelerator, parts.tokenizer, parts.run_dir
    group_size = roll.samples_per_prompt
    updates_per_step = algo.epochs * algo.mini_batches
    optimizer, scheduler = build_optimizer(parts.model, cfg.optim, cfg.steps * updates_per_step)
    # frozen starting policy (with LoRA: the base with the adapter off); not built when the KL term is off
    reference = reference_model(parts.model) if algo.kl_coef > 0 else None
    model, optimizer = acc.prepare(parts.model, optimizer)
    stream = PromptStream(parts.train_rows, cfg.seed)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    checkpointer = Checkpointer.from_config(cfg, acc, run_dir)
    start_step = checkpointer.restore(scheduler=scheduler, data=stream, shuffle=GeneratorState(shuffle))
    metrics_log = MetricsLog(run_dir, cfg.steps, cfg.log.progress, enabled=acc.is_main_process, tracker=acc)
    eval_kwargs = dict(
        accuracy_key=cfg.reward.accuracy, use_chat_template=cfg.model.chat_template, system_prompt=cfg.data.system_prompt,
        max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size, on_error=cfg.reward.on_error,
    )
    eval_rows = parts.eval_rows[: cfg.eval.size]
    last_eval: dict = {}

    def run_eval(step: int) -> dict:
        metrics, _ = evaluate(acc.unwrap_model(model), tokenizer, eval_rows, parts.rewards, **eval_kwargs)
        return metrics

    if cfg.eval.at_start and start_step == 0 and acc.is_main_process:
        last_eval = run_eval(0)
        metrics_log.write(0, last_eval)
        metrics_log.show(0, last_eval)

    for step in range(start_step + 1, cfg.steps + 1):
        step_start = time.perf_counter()
        # 1. rollout: G samples per prompt, adjacent in the batch; this process takes its shard of the
        # global batch and samples with the seeds of its global sample indices
        mine = shard(cfg.prompts_per_step, acc)
        rows = stream.take(cfg.prompts_per_step)[mine]
        prompts = format_prompts(tokenizer, rows, cfg.model.chat_template, cfg.data.system_prompt)
        rollout = generate(
            acc.unwrap_model(model), tokenizer, prompts, samples_per_prompt=group_size, max_new_tokens=roll.max_new_tokens,
            temperature=roll.temperature, top_p=roll.top_p, top_k=roll.top_k, batch_size=roll.batch_size,
            seeds=[sample_seed(cfg.seed, step, mine.start * group_size + i) for i in range(len(prompts) * group_size)],
        )
        generation_time = time.perf_counter() - step_start
        sample_rows = [row for row in rows for _ in range(group_size)]
        sample_prompts = [p for p in prompts for _ in range(group_size)]

        # 2. rewards
        local_rewards, per_component, reward_errors = compute_rewards(
            parts.rewards, sample_prompts, rollout.texts, sample_rows, cfg.reward.on_error
        )  # (n,) on this process
        rewards = gather(acc, local_rewards)  # (N,) the global batch, in global sample order
        per_component = {name: gather(acc, values) for name, values in per_component.items()}

        # 3. advantages over the global batch; this process keeps its own samples'
        global_advantages = group_advantages(rewards, group_size, scale=algo.scale, eps=algo.eps)  # (N,)
        advantages = global_advantages[shard(len(rewards), acc)]  # (n,)

        # 4. optimisation
        num_samples = rollout.completion_ids.shape[0]
        completion_mask = rollout.completion_mask  # (N, C)
        old_logp = batched_logprobs(model, rollout, cfg.micro_batch_size) if updates_per_step > 1 else None
        ref_logp = batched_logprobs(reference, rollout, cfg.micro_batch_size) if reference is not None else None
        stats = {"loss": 0.0, "kl": [], "entropy": [], "clip_low": [], "clip_high": [], "grad_norm": []}
        for _epoch in range(algo.epochs):
            order = torch.randperm(num_samples, generator=shuffle) if updates_per_step > 1 else torch.arange(num_samples)
            for mini in order.chunk(algo.mini_batches):
                mini_tokens = global_sum(acc, completion_mask[mini].sum().item())  # normaliser: whole mini-batch
                mini_seqs = len(mini) * acc.num_processes
                for lo in range(0, len(mini), cfg.micro_batch_size):
                    idx = mini[lo : lo + cfg.micro_batch_size]
                    mask = completion_mask[idx]
                    logp, entropy = completion_logprobs(
                        model, rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.completion_ids[idx], mask,
                        with_entropy=True,
                    )
                    device_mask = mask.to(logp.device)
                    old = old_logp[idx].to(logp.device) if old_logp is not None else logp.detach()
                    token_loss, clip_stats = clipped_surrogate(
                        logp, old, advantages[idx].to(logp.device), device_mask, algo.clip_low, algo.clip_high
                    )
                    if ref_logp is not None:
                        kl = kl_penalty(logp, ref_logp[idx].to(logp.device), algo.kl_estimator)  # (n, C)
                        token_loss = token_loss + algo.kl_coef * kl * device_mask
                        stats["kl"].append(_masked_mean(kl.detach(), device_mask))
                    loss = aggregate(token_loss, device_mask, algo.loss_agg, mini_tokens, mini_seqs, roll.max_new_tokens)
                    acc.backward(loss * gradient_scale(acc))
                    stats["loss"] += loss.item() / updates_per_step
                    stats["entropy"].append(_masked_mean(entropy, device_mask))
                    stats["clip_low"].append(clip_stats["train/clip_frac_low"].item())
                    stats["clip_high"].append(clip_stats["train/clip_frac_high"].item())
                if cfg.optim.max_grad_norm:
                    stats["grad_norm"].append(float(acc.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)

        step_time = time.perf_counter() - step_start
        completion_tokens = global_sum(acc, completion_mask.sum().item())
        lengths = gather(acc, rollout.lengths.float())  # (N,)
        metrics = {
            "train/loss": global_sum(acc, stats["loss"]),
            "train/lr": scheduler.get_last_lr()[0],
            "train/entropy": global_mean(acc, sum(stats["entropy"]) / len(stats["entropy"])),
            "train/clip_frac_low": global_mean(acc, sum(stats["clip_low"]) / len(stats["clip_low"])),
            "train/clip_frac_high": global_mean(acc, sum(stats["clip_high"]) / len(stats["clip_high"])),
            "train/frac_zero_std_groups": zero_std_group_fraction(rewards, group_size),
            "train/advantage_mean": global_advantages.mean().item(),
            "train/advantage_std": global_advantages.std().item() if len(rewards) > 1 else 0.0,
            "train/advantage_max": global_advantages.abs().max().item(),
            "reward/total": rewards.mean().item(),
            "reward/total_std": rewards.std().item() if len(rewards) > 1 else 0.0,
            "reward/accuracy": torch.nan_to_num(per_component[cfg.reward.accuracy], nan=0.0).mean().item(),
            "reward/errors": int(global_sum(acc, reward_errors)),
            "completions/mean_length": lengths.mean().item(),
            "completions/max_length": lengths.max().item(),
            "completions/truncated_frac": gather(acc, rollout.truncated.float()).mean().item(),
            "perf/step_time_s": step_time,
            "perf/generation_time_s": generation_time,
            "perf/tokens_per_s": completion_tokens / step_time,
        }
        for name, values in per_component.items():
            present = values[~torch.isnan(values)]
            metrics[f"reward/{name}"] = present.mean().item() if present.numel() else None
            metrics[f"reward/{name}_std"] = present.std().item() if present.numel() > 1 else None
        if stats["kl"]:
            metrics["train/kl_ref"] = global_mean(acc, sum(stats["kl"]) / len(stats["kl"]))
        if stats["grad_norm"]:
            metrics["train/grad_norm"] = sum(stats["grad_norm"]) / len(stats["grad_norm"])
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.steps) and acc.is_main_process:
            last_eval = run_eval(step)
            metrics.update(last_eval)
        if acc.is_main_process and cfg.log.samples_every and (step % cfg.log.samples_every == 0 or step == 1):
            # the main process holds the first shard, so local index i is global index i
            records = [
                {"prompt": sample_prompts[i], "completion": rollout.texts[i], "reward": rewards[i].item(),
                 "advantage": advantages[i].item(), "answer": sample_rows[i].get("answer")}
                for i in range(min(cfg.log.num_samples, num_samples))
            ]
            write_samples(run_dir, step, records)
        if step % cfg.log.every == 0 or "eval/accuracy" in metrics:
            metrics_log.write(step, metrics)
        metrics_log.show(step, metrics)
        checkpointer.step_done(step)  # every checkpoint.every steps, at the end, and on Ctrl-C
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}
