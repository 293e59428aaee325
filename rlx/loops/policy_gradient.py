"""Policy-gradient training loop (GRPO family, critic-free), read top to bottom.

Each step:
  1. draw `prompts_per_step` prompts and sample G = rollout.samples_per_prompt completions for each
     (G + 1 for the median estimator); with dynamic sampling (DAPO), groups whose rewards all tie are
     dropped and more prompts are drawn, up to `algorithm.max_sample_batches` generation rounds;
  2. score them with every reward component (reward/<name>) and sum by weight; the soft overlong
     punishment (DAPO) is one more component when `algorithm.overlong_buffer` > 0;
  3. turn rewards into advantages (algorithms/advantages.py), optionally shaped by KL in the reward
     and weighted by sign;
  4. optimise the clipped surrogate (algorithms/losses.py), plus an optional KL penalty to a frozen
     reference (algorithms/kl.py) and entropy bonus, for `algorithm.epochs` passes of
     `algorithm.mini_batches` optimizer steps each, accumulating exactly over micro-batches of
     `micro_batch_size` sequences (the normalisers are those of the whole mini-batch).
Departures from the GRPO paper: token-mean aggregation by default (DAPO), and the old log-probs are
not recomputed when only one optimizer step is taken per batch (the ratio is then exactly 1).
Batch sampling lives in rollout/batch.py and the helpers shared with PPO in loops/common.py.
With several processes (hardware=ddp), each takes its contiguous shard of the global batch, and
rewards, advantages and loss normalisers are computed over the global batch (rlx/parallel.py).
"""

from __future__ import annotations

import logging
import time
from functools import partial

import torch

from rlx.algorithms.advantages import outcome_advantages, sign_weighted
from rlx.algorithms.kl import adaptive_kl_coef, penalized_token_loss, sequence_kl_in_reward
from rlx.algorithms.losses import aggregate, clipped_surrogate, entropy_threshold, top_entropy_mask
from rlx.algorithms.offpolicy import logprob_gap, truncated_importance_weights
from rlx.checkpoint import GeneratorState
from rlx.data.tasks import PromptStream
from rlx.loops.common import (
    KLCoefficient,
    Parts,
    ReferenceReset,
    advantage_metrics,
    batch_settings,
    batched_logprobs,
    end_step,
    eval_due,
    evaluate_at_start,
    masked_mean,
    mean_of,
    optimizer_step,
    training_rewards,
)
from rlx.loops.micro_batches import plan_micro_batches
from rlx.models.forward import completion_logprobs
from rlx.parallel import (
    backward,
    gather,
    gather_padded,
    global_max,
    global_mean,
    global_sum,
    set_accumulation,
)
from rlx.rollout.batch import sample_batch, sample_records
from rlx.rollout.generator import policy_generator
from rlx.run import write_samples

log = logging.getLogger("rlx")


def train_policy_gradient(cfg, parts: Parts) -> dict:
    algo, roll = cfg.algorithm, cfg.rollout
    acc, tokenizer, run_dir = parts.accelerator, parts.tokenizer, parts.run_dir
    # the median estimator samples one extra completion per prompt: the pivot, left out of the gradient
    group_size = roll.samples_per_prompt + (1 if algo.advantage == "median" else 0)
    updates_per_step = algo.epochs * algo.mini_batches
    model, optimizer, scheduler, engine = parts.model, parts.optimizer, parts.scheduler, parts.engine
    reference = parts.reference  # frozen starting policy (with LoRA: the base with the adapter off) or None
    kl_state = KLCoefficient(float(algo.kl_coef))
    reference_reset = ReferenceReset(reference, algo.ref_reset_every)
    stream = PromptStream(parts.train_rows, cfg.seed)
    train_rewards = training_rewards(parts.rewards, algo.overlong_buffer, algo.overlong_weight, roll.max_new_tokens)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    checkpointer, metrics_log, run_eval = parts.checkpointer, parts.metrics_log, parts.run_eval
    start_step = checkpointer.restore(**parts.checkpointed, data=stream, shuffle=GeneratorState(shuffle), kl=kl_state,
                                      **reference_reset.checkpointed())
    if engine is not None and start_step:  # resumed: the engine was built on the starting weights
        engine.sync_weights(acc.unwrap_model(model), version=start_step)
    last_eval = evaluate_at_start(cfg.eval.at_start, start_step, metrics_log, run_eval)

    sampling = batch_settings(cfg)
    for step in range(start_step + 1, cfg.steps + 1):
        kl_coef = kl_state.value
        step_start = time.perf_counter()
        reference_reset.maybe_reset(step, acc.unwrap_model(model))
        # 1-2. rollout (G samples per prompt, adjacent in the batch) and rewards
        # rollout=vllm: the engine; rollout=hf: the policy itself samples, keeping its decoder's log-probs
        # (compared with the trainer's: rollout/logprob_gap_*; the loop recomputes old log-probs itself)
        generator = engine if engine is not None else policy_generator(acc.unwrap_model(model), tokenizer, roll, logprobs="sampler")
        batch = sample_batch(generator, tokenizer, stream, train_rewards, group_size, step=step, acc=acc,
                             **sampling)
        rollout, rewards, local = batch.rollout, batch.rewards, batch.local  # rewards: (N,) global
        generation_time = time.perf_counter() - step_start
        if engine is not None:
            engine.sleep()  # rollout.sleep_level: the engine's memory is given back for the update
        sampler_logp = rollout.logprobs  # (N, C) the sampler's log-probs of the sampled tokens (vLLM or rlx's decoder)
        tis_cap = roll.get("tis_cap") if sampler_logp is not None else None
        gap = {"sum": 0.0, "max": 0.0, "count": 0, "capped": 0, "weight_sum": 0.0}
        num_samples = rollout.completion_ids.shape[0]
        completion_mask = rollout.completion_mask  # (N, C)
        if algo.mask_truncated:
            completion_mask = completion_mask * (~rollout.truncated).long().unsqueeze(1)  # (N, C)

        # 3. advantages (old log-probs are needed for several optimizer steps, KL in the reward, or entropy ranking)
        need_old = updates_per_step > 1 or (reference is not None and algo.kl_in == "reward")
        old_logp, old_entropy = None, None
        if need_old or algo.forking_rho < 1:
            old_logp, old_entropy = batched_logprobs(model, rollout, cfg.micro_batch_size, with_entropy=algo.forking_rho < 1,
                                                     temperature=roll.temperature, pack=cfg.get("packed_forward", False))
        ref_logp = (batched_logprobs(reference, rollout, cfg.micro_batch_size, temperature=roll.temperature,
                                     pack=cfg.get("packed_forward", False))[0]
                    if reference is not None else None)
        shaped, seq_kl = rewards, None
        if reference is not None and algo.kl_in == "reward":
            shaped, seq_kl = sequence_kl_in_reward(rewards[local], old_logp, ref_logp, completion_mask, kl_coef)  # (n,)
            shaped, seq_kl = gather(acc, shaped), gather(acc, seq_kl)  # (N,)
        # advantages over the global batch; this process keeps its own samples'
        global_advantages, global_keep = outcome_advantages(shaped, group_size, algo.advantage, algo.scale, algo.eps)
        global_advantages = sign_weighted(global_advantages, algo.positive_weight, algo.negative_weight)  # (N,)
        advantages, keep = global_advantages[local], global_keep[local]  # (n,), (n,)
        loss_mask = completion_mask * keep.long().unsqueeze(1)  # (N, C): pivots and masked rows leave the loss
        pg_mask = loss_mask  # (N, C): tokens in the policy-gradient term
        if algo.forking_rho < 1:  # one threshold over the global batch (every process's valid tokens)
            threshold = entropy_threshold(gather_padded(acc, old_entropy), gather_padded(acc, loss_mask), algo.forking_rho)
            pg_mask = loss_mask * top_entropy_mask(old_entropy, loss_mask, algo.forking_rho, threshold).long()
        if not need_old:
            old_logp = None

        # 4. optimisation, in train mode: gradient checkpointing acts only there (dropout is off for good,
        # models/lora.py disable_dropout, so train and eval mode compute the same numbers)
        model.train()
        stats = {"loss": 0.0, "kl": [], "entropy": [], "clip_low": [], "clip_high": [], "approx_kl": [], "grad_norm": []}
        seq_kl_sum = 0.0
        for _epoch in range(algo.epochs):
            order = torch.randperm(num_samples, generator=shuffle) if updates_per_step > 1 else torch.arange(num_samples)
            for mini in order.chunk(algo.mini_batches):
                mini_tokens = global_sum(acc, loss_mask[mini].sum().item())  # normalisers: the whole mini-batch
                mini_seqs = global_sum(acc, keep[mini].sum().item())
                # a fixed count of rows, or a token budget (micro_batch_tokens; loops/micro_batches.py)
                micro = plan_micro_batches(mini, rollout.prompt_mask, rollout.completion_mask, cfg.micro_batch_size,
                                           cfg.get("micro_batch_tokens"), partial(global_max, acc))
                if cfg.get("micro_batch_tokens"):
                    set_accumulation(acc, len(micro))  # this optimizer step's count of backward passes
                for idx in micro:
                    mask = completion_mask[idx]
                    logp, entropy = completion_logprobs(
                        model, rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.completion_ids[idx], mask,
                        with_entropy=True, entropy_grad=algo.entropy_coef > 0, temperature=roll.temperature,
                        pack=cfg.get("packed_forward", False),
                    )
                    device_mask = loss_mask[idx].to(logp.device)
                    old = old_logp[idx].to(logp.device) if old_logp is not None else logp.detach()
                    token_loss, clip_stats = clipped_surrogate(
                        logp, old, advantages[idx].to(logp.device), pg_mask[idx].to(logp.device), algo.clip_low,
                        algo.clip_high, algo.dual_clip, algo.ratio_level,
                    )
                    if sampler_logp is not None and _epoch == 0:  # `old`: the trainer's log-probs at sampling time
                        sampled = sampler_logp[idx].to(logp.device)
                        gap_sum, gap_max, gap_count = logprob_gap(old, sampled, mask.to(logp.device))
                        gap["sum"], gap["count"] = gap["sum"] + gap_sum, gap["count"] + gap_count
                        gap["max"] = max(gap["max"], gap_max)
                    if tis_cap is not None:  # truncated importance sampling: the sampler is not the trainer
                        weights, capped = truncated_importance_weights(old, sampler_logp[idx].to(logp.device), tis_cap)
                        token_loss = token_loss * weights  # (n, C)
                        if _epoch == 0:
                            gap["capped"] += int((capped & device_mask.bool()).sum())
                            gap["weight_sum"] += (weights * device_mask).sum().item()
                    token_loss, kl = penalized_token_loss(
                        token_loss, logp, ref_logp[idx].to(logp.device) if ref_logp is not None else None, entropy,
                        device_mask, kl_coef, algo.kl_estimator, algo.kl_in, algo.entropy_coef,
                    )  # (n, C) each
                    if kl is not None:
                        stats["kl"].append(masked_mean(kl.detach(), device_mask))
                        seq_kl_sum += (kl.detach() * device_mask).sum().item()
                    loss = aggregate(token_loss, device_mask, algo.loss_agg, mini_tokens, mini_seqs, roll.max_new_tokens)
                    backward(acc, loss, model)
                    stats["loss"] += loss.item() / updates_per_step
                    stats["entropy"].append(masked_mean(entropy.detach(), mask.to(logp.device)))
                    stats["clip_low"].append(clip_stats["train/clip_frac_low"].item())
                    stats["clip_high"].append(clip_stats["train/clip_frac_high"].item())
                    stats["approx_kl"].append(clip_stats["train/approx_kl"].item())
                grad_norm = optimizer_step(acc, model, optimizer, scheduler, cfg.optim.max_grad_norm)
                if grad_norm is not None:
                    stats["grad_norm"].append(grad_norm)
        if engine is not None:
            engine.sync_weights(acc.unwrap_model(model), version=step)  # the next rollout samples from the updated policy
        model.eval()  # generation, old/reference log-probs and evaluation run in eval mode
        if reference is not None and algo.kl_target is not None:
            total_samples = rewards.numel()
            observed = (seq_kl.mean().item() if seq_kl is not None
                        else global_sum(acc, seq_kl_sum) / (algo.epochs * total_samples))
            kl_state.value = adaptive_kl_coef(kl_coef, observed, algo.kl_target, algo.kl_horizon, total_samples)

        step_time = time.perf_counter() - step_start
        metrics = {
            "train/loss": global_sum(acc, stats["loss"]),
            "train/lr": scheduler.get_last_lr()[0],
            "train/entropy": global_mean(acc, mean_of(stats["entropy"])),
            "train/clip_frac_low": global_mean(acc, mean_of(stats["clip_low"])),
            "train/clip_frac_high": global_mean(acc, mean_of(stats["clip_high"])),
            "train/approx_kl": global_mean(acc, mean_of(stats["approx_kl"])),
            "train/prompts_drawn": batch.prompts_drawn,
            "train/sample_rounds": batch.rounds,
            **advantage_metrics(global_advantages[global_keep]),
            **batch.drawn_metrics,
            "perf/step_time_s": step_time,
            "perf/generation_time_s": generation_time,
            **(engine.step_metrics() if engine is not None else {}),  # weight sync time (rollout=vllm, server)
            "perf/tokens_per_s": global_sum(acc, completion_mask.sum().item()) / step_time,
        }
        if algo.dynamic_sampling:
            metrics["train/filled_groups"] = batch.filled_groups
        if sampler_logp is not None:  # sampler vs trainer: |log pi_train - log pi_sampler| over the sampled tokens
            count = global_sum(acc, gap["count"])
            metrics["rollout/logprob_gap_mean"] = global_sum(acc, gap["sum"]) / max(count, 1)
            metrics["rollout/logprob_gap_max"] = gather(acc, torch.tensor([gap["max"]])).max().item()
            if tis_cap is not None:
                tokens = max(global_sum(acc, loss_mask.sum().item()), 1)
                metrics["rollout/tis_weight_mean"] = global_sum(acc, gap["weight_sum"]) / tokens
                metrics["rollout/tis_capped_frac"] = global_sum(acc, gap["capped"]) / tokens
        if stats["kl"]:
            metrics["train/kl_ref"] = global_mean(acc, mean_of(stats["kl"]))
            metrics["train/kl_coef"] = kl_coef
        if stats["grad_norm"]:
            metrics["train/grad_norm"] = mean_of(stats["grad_norm"])
        if eval_due(step, cfg.eval.every, cfg.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        if acc.is_main_process and cfg.log.samples_every and (step % cfg.log.samples_every == 0 or step == 1):
            # the main process holds the first shard, so its local sample i is global sample i
            write_samples(run_dir, step, sample_records(batch, advantages, cfg.log.num_samples))
        end_step(step, metrics, metrics_log, checkpointer, cfg.log.every, cfg.steps)
    if engine is not None:
        engine.close()
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}
