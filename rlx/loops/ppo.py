"""PPO with a learned critic (family `ppo`), read top to bottom.

Each step:
  1. draw `prompts_per_step` prompts and sample rollout.samples_per_prompt completions for each, score
     them (same sampling and rewards as the policy-gradient loop, dynamic sampling included);
  2. under the sampling policy: log-probs, reference log-probs (when kl_coef > 0) and values V_t from the
     value model (models/value.py);
  3. token rewards: the outcome reward on the last completion token, minus kl_coef * k1_t on every token
     when algorithm.kl_in=reward (algorithms/kl.py); GAE(gamma, lam) gives advantages and value targets
     (algorithms/advantages.py), advantages optionally whitened over the batch;
  4. `epochs` passes of `mini_batches` steps: the policy loss of the policy-gradient loop (algorithms/policy_loss.py:
     clipped surrogate, KL and entropy terms) on per-token advantages + vf_coef x
     clipped value loss, aggregated exactly over micro-batches; policy and value model each have their
     own AdamW (value_lr) and gradient clipping. With rollout.correction (an engine's float error, stale rows
     of pipeline mode or partial rollouts) the policy term is weighted by pi_old / pi_sampler, the old
     log-probs of step 2 being the proximal policy of decoupled PPO (algorithms/offpolicy.py).
Departures from InstructGPT's PPO: no pretraining-mix loss; the value model starts as a copy of the
policy backbone with a zero-initialised head instead of a trained reward model.
With several processes (hardware=ddp), each takes its contiguous shard of the global batch; GAE runs
per sequence on the shard, while the advantage whitening, the loss normalisers, the adaptive KL and
the metrics use the global batch (rlx/runtime/parallel.py). Checkpoints hold both models and optimizers, both
schedules, the data position, the shuffle generator, the KL coefficient and, with
algorithm.ref_reset_every, the reference weights (rlx/runtime/checkpoint.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

import torch

from rlx.algorithms.advantages import gae_advantages, whiten
from rlx.algorithms.kl import adaptive_kl_coef, token_rewards
from rlx.algorithms.losses import aggregate, explained_variance, value_loss
from rlx.algorithms.offpolicy import logprob_gap
from rlx.algorithms.policy_loss import PolicyInputs, PolicyLoss
from rlx.loops.common import (
    KLCoefficient,
    PPOParts,
    ReferenceReset,
    batched_logprobs,
    end_step,
    eval_due,
    evaluate_at_start,
    frozen_reference,
    masked_mean,
    mean_of,
)
from rlx.loops.credit import advantage_metrics, require_rows
from rlx.loops.micro_batches import MicroBatching, parameter_count, plan_micro_batches
from rlx.models.forward import LogprobSettings, completion_logprobs
from rlx.runtime.checkpoint import GeneratorState
from rlx.runtime.optim import optimizer_step
from rlx.runtime.parallel import (
    backward,
    gather,
    gather_padded,
    global_max,
    global_mean,
    global_sum,
    set_accumulation,
)
from rlx.runtime.rundir import write_samples

log = logging.getLogger("rlx")


@torch.no_grad()
def batched_values(value_model, rollout, micro: int, pack: bool = False) -> torch.Tensor:
    """Values (N, C) of every completion position, without gradients (pack: packed_forward)."""
    out = []
    for lo in range(0, rollout.completion_ids.shape[0], micro):
        sl = slice(lo, lo + micro)
        out.append(value_model(rollout.prompt_ids[sl], rollout.prompt_mask[sl], rollout.completion_ids[sl],
                               rollout.completion_mask[sl], pack=pack).cpu())
    return torch.cat(out)


def train_ppo(settings, parts: PPOParts) -> dict:
    algo, roll = settings.algorithm, settings.rollout
    acc, run_dir = parts.accelerator, parts.run_dir
    producer, generator = parts.producer, parts.generator
    model, scheduler, value_model = parts.model, parts.scheduler, parts.critic.model
    reference = frozen_reference(parts.reference)  # the frozen starting policy (LoRA: the base, adapter off) or None
    kl_state = KLCoefficient(float(algo.kl_coef))
    reference_reset = ReferenceReset(reference, algo.ref_reset_every)
    shuffle = torch.Generator().manual_seed(settings.seed)
    checkpointer, metrics_log, run_eval = parts.checkpointer, parts.metrics_log, parts.run_eval
    start_step = checkpointer.restore(**parts.checkpointed, **producer.checkpointed(), shuffle=GeneratorState(shuffle),
                                      kl=kl_state, **reference_reset.checkpointed())
    if start_step:  # resumed: a vLLM engine was built on the starting weights
        generator.publish(acc.unwrap_model(model), start_step)
    last_eval = evaluate_at_start(settings.eval.at_start, start_step, metrics_log, run_eval)
    pack, micro_size = settings.packed_forward, settings.micro_batch_size
    policy_loss = PolicyLoss.from_settings(algo, roll, roll.max_new_tokens)  # the policy term, built once

    for step in range(start_step + 1, settings.steps + 1):
        kl_coef = kl_state.value
        step_start = time.perf_counter()
        reference_reset.maybe_reset(step, acc.unwrap_model(model))
        # 1. rollout and rewards (this process's shard of the global batch; the single-turn producer)
        batch = producer.produce(step)
        require_rows(batch, "ppo")
        rollout, rewards, local = batch.rollout, batch.rewards, batch.local  # rewards: (N,) global
        generation_time = time.perf_counter() - step_start
        mask = rollout.completion_mask  # (n, C)
        if algo.mask_truncated:
            mask = mask * (~rollout.truncated).long().unsqueeze(1)

        # 2. sampling-policy log-probs, reference log-probs and values
        batching = MicroBatching.of(settings, parameter_count(model))
        old_logp, _ = batched_logprobs(model, rollout, batching, temperature=roll.temperature, pack=pack,
                                       count_all=partial(global_max, acc))  # (n, C)
        ref_logp = (batched_logprobs(reference, rollout, batching, temperature=roll.temperature, pack=pack,
                                     count_all=partial(global_max, acc))[0]
                    if reference is not None else None)
        old_values = batched_values(value_model, rollout, micro_size,
                                    pack=pack)  # (n, C)
        gap = None
        generator.sleep()  # rollout=vllm with rollout.sleep_level: the engine's memory is given back for the update
        if rollout.logprobs is not None:  # sampler vs trainer: |log pi_train - log pi_sampler| over the sampled tokens
            gap = logprob_gap(old_logp, rollout.logprobs, rollout.completion_mask)  # (sum, max, count)
        # the off-policy correction: weights pi_old / pi_sampler; a rejecting rule takes tokens out of the policy term
        correction, policy_mask = None, mask
        if policy_loss.correction.active and rollout.logprobs is not None:
            correction = policy_loss.correction(old_logp, rollout.logprobs, mask)
            policy_mask = mask * correction.kept.long()  # (n, C)

        # 3. token rewards and GAE per sequence; whitening over the global batch: every process's tokens,
        # padded to the longest completion of any process
        in_reward = reference is not None and algo.kl_in == "reward"
        rewards_t = token_rewards(rewards[local], mask, old_logp if in_reward else None,
                                  ref_logp if in_reward else None, kl_coef)  # (n, C)
        advantages, returns = gae_advantages(rewards_t, old_values, mask, algo.gamma, algo.lam)  # (n, C) each
        raw_advantages = advantages
        global_mask = gather_padded(acc, mask)  # (N, C_max)
        global_advantages = gather_padded(acc, advantages)  # (N, C_max)
        if algo.whiten_advantages:
            advantages = whiten(global_advantages, global_mask)[local, : mask.shape[1]]  # (n, C)

        # 4. optimisation in train mode (gradient checkpointing acts only there; dropout is off, models/lora.py)
        model.train()
        rows = PPORows(rollout, mask, policy_mask, old_logp, ref_logp, old_values, advantages, returns, correction)
        stats = ppo_update(parts, settings, rows, kl_coef, shuffle, policy_loss)
        seq_kl_sum = stats["seq_kl_sum"]
        generator.publish(acc.unwrap_model(model), step)  # the next rollout samples from the updated policy
        model.eval()  # generation, old/reference log-probs and evaluation run in eval mode
        if reference is not None and algo.kl_target is not None:
            total_samples = rewards.numel()
            observed = global_sum(acc, seq_kl_sum) / (algo.epochs * total_samples)
            kl_state.value = adaptive_kl_coef(kl_coef, observed, algo.kl_target, algo.kl_horizon, total_samples)

        step_time = time.perf_counter() - step_start
        global_values, global_returns = gather_padded(acc, old_values), gather_padded(acc, returns)  # (N, C_max)
        metrics = {
            "train/loss": global_sum(acc, stats["loss"]),
            "train/lr": scheduler.get_last_lr()[0],
            "train/entropy": global_mean(acc, mean_of(stats["entropy"])),
            "train/clip_frac_low": global_mean(acc, mean_of(stats["clip_low"])),
            "train/clip_frac_high": global_mean(acc, mean_of(stats["clip_high"])),
            "train/approx_kl": global_mean(acc, mean_of(stats["approx_kl"])),
            "train/value_loss": global_sum(acc, stats["value_loss"]),
            "train/value_clip_frac": global_mean(acc, mean_of(stats["value_clip"])),
            "train/explained_variance": explained_variance(global_values, global_returns, global_mask),
            "train/value_mean": masked_mean(global_values, global_mask),
            **advantage_metrics(global_advantages, global_mask),
            **batch.metrics,
            "perf/step_time_s": step_time,
            "perf/generation_time_s": generation_time,
            "perf/tokens_per_s": global_mask.sum().item() / step_time,
            **generator.step_metrics(),  # e.g. the weight publish time of an engine or server
        }
        if gap is not None:
            metrics["rollout/logprob_gap_mean"] = global_sum(acc, gap[0]) / max(global_sum(acc, gap[2]), 1)
            metrics["rollout/logprob_gap_max"] = gather(acc, torch.tensor([gap[1]])).max().item()
        if correction is not None:  # as the policy-gradient loop's rollout/is_* (its correction_metrics)
            sampled = global_sum(acc, mask.sum().item())
            metrics["rollout/is_weight_mean"] = global_sum(acc, (correction.weights * policy_mask).sum().item()) / max(
                global_sum(acc, policy_mask.sum().item()), 1)
            metrics["rollout/is_bounded_frac"] = (global_sum(acc, int((correction.bounded & mask.bool()).sum()))
                                                  / max(sampled, 1))
        if stats["kl"]:
            metrics["train/kl_ref"] = global_mean(acc, mean_of(stats["kl"]))
            metrics["train/kl_coef"] = kl_coef
        if stats["grad_norm"]:
            metrics["train/grad_norm"] = mean_of(stats["grad_norm"])
            metrics["train/value_grad_norm"] = mean_of(stats["value_grad_norm"])
        if eval_due(step, settings.eval.every, settings.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        if acc.is_main_process and settings.log.samples_every and (step % settings.log.samples_every == 0 or step == 1):
            # the main process holds the first shard, so its local sample i is global sample i
            samples = [{"advantage": a} for a in raw_advantages[:, 0].tolist()]
            write_samples(run_dir, step, producer.records(batch, samples, settings.log.num_samples))
        end_step(step, metrics, metrics_log, checkpointer, settings.log.every, settings.steps)
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}


@dataclass(frozen=True)
class PPORows:
    """The rows one PPO update trains on: the rollout, its masks ((n, C): the sampled tokens, in the value loss;
    those in the policy term), the old (sampling-policy) and reference log-probs, the old values, the
    advantages and returns (n, C), and the off-policy correction (weights pi_old / pi_sampler) or None."""

    rollout: object
    mask: torch.Tensor
    policy_mask: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    correction: object


def ppo_update(parts: PPOParts, settings, rows: PPORows, kl_coef: float, shuffle: torch.Generator,
               policy_loss: PolicyLoss) -> dict:
    """`algorithm.epochs` passes of `algorithm.mini_batches` optimizer steps of the policy and the critic (the
    policy loss: clipped surrogate, KL and entropy terms; and the clipped value loss), each accumulated exactly over
    its micro-batches. Returns the statistics of the update (seq_kl_sum: the summed KL of the sampled tokens)."""
    algo, roll = settings.algorithm, settings.rollout
    acc, model, optimizer, scheduler = parts.accelerator, parts.model, parts.optimizer, parts.scheduler
    value_model, value_optimizer, value_scheduler = parts.critic.model, parts.critic.optimizer, parts.critic.scheduler
    rollout, mask, policy_mask, correction = rows.rollout, rows.mask, rows.policy_mask, rows.correction
    old_logp, ref_logp, old_values = rows.old_logp, rows.ref_logp, rows.old_values
    advantages, returns = rows.advantages, rows.returns
    updates_per_step = algo.epochs * algo.mini_batches
    num_samples = rollout.completion_ids.shape[0]  # n, this process
    pack, batching = settings.packed_forward, MicroBatching.of(settings, parameter_count(model))
    stats = {key: [] for key in ("kl", "entropy", "clip_low", "clip_high", "approx_kl", "value_clip", "grad_norm",
                                 "value_grad_norm")}
    stats["loss"], stats["value_loss"] = 0.0, 0.0
    seq_kl_sum = 0.0
    for _epoch in range(algo.epochs):
        order = torch.randperm(num_samples, generator=shuffle) if updates_per_step > 1 else torch.arange(num_samples)
        for mini in order.chunk(algo.mini_batches):
            mini_tokens = global_sum(acc, mask[mini].sum().item())  # normalisers: the whole mini-batch
            mini_seqs = global_sum(acc, len(mini))
            policy_tokens = mini_tokens if correction is None else global_sum(acc, policy_mask[mini].sum().item())
            # rows grouped by length, consecutive rows or a token budget (loops/micro_batches.py)
            micro = plan_micro_batches(mini, rollout.prompt_mask, rollout.completion_mask, batching,
                                       partial(global_max, acc))
            if batching.varies:
                set_accumulation(acc, len(micro))  # this optimizer step's count of backward passes
            for idx in micro:
                micro_mask = mask[idx]
                logp, entropy = completion_logprobs(
                    model, rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.completion_ids[idx],
                    rollout.completion_mask[idx], with_entropy=True, temperature=roll.temperature,
                    settings=LogprobSettings(entropy_grad=algo.entropy_coef > 0, pack=pack),
                )
                device, device_mask = logp.device, policy_mask[idx].to(logp.device)
                x = PolicyInputs(logp, old_logp[idx].to(device), advantages[idx].to(device), device_mask, device_mask,
                                 entropy, ref_logp[idx].to(device) if ref_logp is not None else None,
                                 correction.weights[idx].to(device) if correction is not None else None, None,
                                 policy_tokens, mini_seqs)
                policy_part, clip_stats = policy_loss(x, kl_coef)  # clipped surrogate, KL and entropy terms
                if "kl" in clip_stats:
                    stats["kl"].append(masked_mean(clip_stats["kl"], device_mask))
                    seq_kl_sum += (clip_stats["kl"] * device_mask).sum().item()
                values = value_model(rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.completion_ids[idx],
                                     rollout.completion_mask[idx], pack=pack)  # (n, C)
                v_loss, v_stats = value_loss(values, old_values[idx].to(values.device), returns[idx].to(values.device),
                                             micro_mask.to(values.device), algo.value_clip)
                value_part = aggregate(v_loss, micro_mask.to(values.device), "token-mean", mini_tokens, mini_seqs)
                loss = policy_part + algo.vf_coef * value_part
                backward(acc, loss, model, value_model)
                stats["loss"] += policy_part.item() / updates_per_step
                stats["value_loss"] += value_part.item() / updates_per_step
                stats["value_clip"].append(v_stats["train/value_clip_frac"].item())
                stats["entropy"].append(masked_mean(entropy.detach(), device_mask))
                stats["clip_low"].append(clip_stats["train/clip_frac_low"].item())
                stats["clip_high"].append(clip_stats["train/clip_frac_high"].item())
                stats["approx_kl"].append(clip_stats["train/approx_kl"].item())
            grad_norm = optimizer_step(acc, model, optimizer, scheduler, settings.optim.max_grad_norm)
            value_grad_norm = optimizer_step(acc, value_model, value_optimizer, value_scheduler,
                                             settings.optim.max_grad_norm)
            if grad_norm is not None:
                stats["grad_norm"].append(grad_norm)
                stats["value_grad_norm"].append(value_grad_norm)
    stats["seq_kl_sum"] = seq_kl_sum
    return stats
