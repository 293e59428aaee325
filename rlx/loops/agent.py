"""Multi-turn agent training loop (family `agent`): the policy plays text environments, read top to bottom.

Each step:
  1. draw `prompts_per_step` tasks (environment seeds) and play G = rollout.samples_per_prompt
     episodes of each, all live episodes generating one turn at a time (rollout/env.py): the model's
     tokens are kept as sampled, environment answers are appended with loss mask 0;
  2. per-step rewards from the environment, minus algorithm.invalid_penalty for each invalid action;
  3. per-step advantages by algorithm.credit (algorithms/gigpo.py, registry CREDIT):
     trajectory (GRPO over the episodes of a task), gigpo (episode + anchor-state step groups),
     turn (MT-GRPO outcome + lambda * turn); every sampled token of a step gets its step's advantage;
  4. the clipped surrogate, KL penalty and entropy bonus of the GRPO family (algorithms/losses.py,
     algorithms/kl.py), aggregated per algorithm.loss_agg over the sampled tokens only, for
     algorithm.epochs x algorithm.mini_batches optimizer steps.
Episodes are played by the policy itself (HFGenerator, rollout=hf) or by a colocated vLLM engine
(rollout=vllm: the same generator protocol; asleep during the update, weights synced after it, and
rollout/logprob_gap_* compares its log-probs with the trainer's before the first update of a step).
Environment seeds are a function of (seed, step, task index) and every episode gets a fresh
environment, so a resumed run replays exactly the tasks an uninterrupted run would (the environments'
randomness is part of the step, not hidden state). Held-out evaluation plays greedy episodes on seeds
no training step draws.
With several processes (hardware=ddp), each plays its contiguous shard of the tasks (all G episodes
of a task on one process; an episode depends only on its seeds, not on its batch-mates), the episodes'
rewards, anchors and validity are gathered, and the advantages (episode groups, GiGPO's anchor groups,
turn groups) and the loss normalisers are computed over the global batch, so N processes take the
optimizer step one process would take (rlx/parallel.py). Held-out episodes are split over processes.
Departure from GiGPO's reference code: the episode-level std normalisation and the step-level one use
the same `algorithm.scale` (the paper allows either for both).
"""

from __future__ import annotations

import logging
import time

import torch
from accelerate.utils import gather_object

from rlx.algorithms.gigpo import CREDIT, invalid_action_penalty
from rlx.algorithms.kl import penalized_token_loss
from rlx.algorithms.losses import aggregate, clipped_surrogate
from rlx.algorithms.offpolicy import logprob_gap
from rlx.checkpoint import GeneratorState
from rlx.config import UserError
from rlx.envs import EnvError, env_factory
from rlx.evaluation.agents import episode_metrics, episode_records, play
from rlx.gateway.episodes import harness_metrics, training_rows
from rlx.loops.common import (
    Parts,
    end_step,
    eval_due,
    evaluate_at_start,
    optimizer_step,
)
from rlx.models.forward import completion_logprobs
from rlx.parallel import backward, gather, gather_padded, global_mean, global_sum, shard
from rlx.rollout.env import EVAL_SEED_BASE, train_env_seed
from rlx.rollout.generator import policy_generator
from rlx.rollout.sampling import sample_seed
from rlx.rollout.types import Episode, RolloutBatch
from rlx.run import write_samples

log = logging.getLogger("rlx")

def step_tensors(episodes: list[Episode], group_size: int, invalid_penalty: float):
    """Flatten episodes for algorithms/gigpo.py: episode_group (E,), step_episode (S,), step_rewards (S,)
    with the invalid-action penalty applied, step_anchor (S,) (-1: no anchor; anchors are numbered in
    order of appearance, so equal keys get equal ids)."""
    anchor_ids: dict = {}
    step_episode, rewards, anchors, valid = [], [], [], []
    for i, e in enumerate(episodes):
        for t, reward in enumerate(e.step_rewards):
            step_episode.append(i)
            rewards.append(reward)
            key = e.anchors[t] if t < len(e.anchors) else None
            anchors.append(-1 if key is None else anchor_ids.setdefault(key, len(anchor_ids)))
            valid.append(e.valid[t] if t < len(e.valid) else True)
    episode_group = torch.arange(len(episodes)) // group_size  # (E,)
    rewards = invalid_action_penalty(torch.tensor(rewards, dtype=torch.float32), torch.tensor(valid, dtype=torch.bool),
                                     invalid_penalty)
    return episode_group, torch.tensor(step_episode, dtype=torch.long), rewards, torch.tensor(anchors, dtype=torch.long)


def token_advantages(step_adv: torch.Tensor, step_episode: torch.Tensor, step_index: torch.Tensor,
                     owner: torch.Tensor | None = None) -> torch.Tensor:
    """(N, C) advantage of every sampled token: the advantage of its step (0 on environment tokens).
    owner (N,): the episode of each row (None: row i is episode i; a harness episode can have several rows)."""
    owner = torch.arange(step_index.shape[0]) if owner is None else owner
    num_episodes = int(owner.max()) + 1 if owner.numel() else 0
    counts = torch.bincount(step_episode, minlength=num_episodes)
    offsets = (torch.cumsum(counts, 0) - counts)[owner]  # (N,) first step of each row's episode in the flat list
    flat = offsets.unsqueeze(1) + step_index.clamp(min=0)  # (N, C)
    values = step_adv[flat.clamp(max=max(step_adv.numel() - 1, 0))] if step_adv.numel() else torch.zeros(flat.shape)
    return torch.where(step_index >= 0, values, torch.zeros_like(values))


def train_agent(cfg, parts: Parts) -> dict:
    algo, roll, env_cfg = cfg.algorithm, cfg.rollout, cfg.env
    acc, tokenizer, run_dir = parts.accelerator, parts.tokenizer, parts.run_dir
    try:
        factory = env_factory(env_cfg.name, env_cfg.get("target"), env_cfg.get("kwargs"))
    except EnvError as exc:
        raise UserError(str(exc)) from None
    credit = CREDIT[algo.credit]
    knobs = dict(gamma=algo.gamma, step_weight=algo.step_weight, turn_weight=algo.turn_weight, scale=algo.scale,
                 eps=algo.eps)
    group_size = roll.samples_per_prompt
    updates_per_step = algo.epochs * algo.mini_batches
    model, optimizer, scheduler, reference, engine = (
        parts.model, parts.optimizer, parts.scheduler, parts.reference, parts.engine)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    checkpointer, metrics_log = parts.checkpointer, parts.metrics_log
    start_step = checkpointer.restore(**parts.checkpointed, shuffle=GeneratorState(shuffle))
    if engine is not None and start_step:  # resumed: the engine was built on the starting weights
        engine.sync_weights(acc.unwrap_model(model))

    def generator_for(policy):
        if engine is not None:  # rollout=vllm: the engine holds the policy's weights (synced after each update)
            return engine
        return policy_generator(policy, tokenizer, roll)

    eval_seeds = [EVAL_SEED_BASE + k for k in range(env_cfg.eval_episodes)]

    def run_eval(step: int) -> dict:
        mine = list(range(acc.process_index, len(eval_seeds), acc.num_processes))  # this process's held-out episodes
        episodes = play(generator_for(acc.unwrap_model(model)), tokenizer, factory, env_cfg, [eval_seeds[k] for k in mine],
                        mine, greedy=env_cfg.eval_greedy, use_chat_template=cfg.model.chat_template)
        episodes = gather_object(episodes)
        extra = harness_metrics(episodes, "eval") if env_cfg.name == "harness" else {}  # [harness]
        return {**episode_metrics(episodes, "eval"), **extra}

    last_eval = evaluate_at_start(cfg.eval.at_start, start_step, metrics_log, run_eval)

    for step in range(start_step + 1, cfg.steps + 1):
        step_start = time.perf_counter()
        # 1. episodes: G per task, adjacent; this process plays its shard of the tasks (global episode index i)
        tasks = shard(cfg.prompts_per_step, acc)
        mine = range(tasks.start * group_size, tasks.stop * group_size)
        env_seeds = [train_env_seed(cfg.seed, step, i // group_size) for i in mine]
        sample_seeds = [sample_seed(cfg.seed, step, i) for i in mine]
        episodes = play(generator_for(acc.unwrap_model(model)), tokenizer, factory, env_cfg, env_seeds, sample_seeds,
                        greedy=False, use_chat_template=cfg.model.chat_template, policy_version=step - 1)
        rows, row_owner = training_rows(episodes)  # [harness] fork rows of gateway sessions join the batch
        generation_time = time.perf_counter() - step_start
        if engine is not None:
            engine.sleep()  # rollout.sleep_level: the engine's memory is given back for the update
        batch = RolloutBatch.from_episodes(rows, tokenizer.pad_token_id)
        # 2-3. rewards and per-step advantages over the global batch -> this process's per-token advantages (n, C)
        all_episodes = gather_object(episodes)  # every process's episodes, in global order
        episode_group, step_episode, step_rewards, step_anchor = step_tensors(all_episodes, group_size, algo.invalid_penalty)
        step_adv, credit_metrics = credit(episode_group, step_episode, step_rewards, step_anchor, **knobs)  # (S,)
        any_signal = bool(step_adv.abs().any())  # over the global batch, so every process decides alike
        local_steps = (step_episode >= mine.start) & (step_episode < mine.stop)
        step_adv, step_episode = step_adv[local_steps], step_episode[local_steps] - mine.start  # this process's steps
        advantages = token_advantages(step_adv, step_episode, batch.step_index, row_owner)  # (n, C)
        loss_mask = batch.loss_mask
        if algo.mask_truncated:
            loss_mask = loss_mask * (~batch.truncated).long().unsqueeze(1)
        ref_logp = None
        if reference is not None:
            with torch.no_grad():
                ref_logp = torch.cat([completion_logprobs(reference, batch.prompt_ids[i:i + cfg.micro_batch_size],
                                                          batch.prompt_mask[i:i + cfg.micro_batch_size],
                                                          batch.completion_ids[i:i + cfg.micro_batch_size],
                                                          batch.completion_mask[i:i + cfg.micro_batch_size])[0].cpu()
                                      for i in range(0, len(rows), cfg.micro_batch_size)])
        # 4. optimisation; the sampler's log-probs are the old log-probs (same weights, same distribution
        # at temperature 1; otherwise the first ratio is not 1 and the clip bounds the step)
        old_logp = batch.sampler_logprobs if updates_per_step > 1 else None
        num = len(rows)
        stats = {"loss": 0.0, "kl": [], "entropy": [], "clip": [], "grad_norm": []}
        gap = {"sum": 0.0, "max": 0.0, "count": 0}  # rollout=vllm: engine vs trainer log-probs before the first update
        # no group had a reward difference and no KL/entropy term: the loss has zero gradient. AdamW would still
        # move every weight along its momentum from the last informative step (with sparse rewards, a single success
        # then drove the grid policy into all-invalid turns over ten zero-gradient steps), so no update is taken.
        skip_update = not any_signal and algo.kl_coef == 0 and algo.entropy_coef == 0
        for epoch in range(0 if skip_update else algo.epochs):
            order = torch.randperm(num, generator=shuffle) if updates_per_step > 1 else torch.arange(num)
            for mini_index, mini in enumerate(order.chunk(algo.mini_batches)):
                mini_tokens = global_sum(acc, float(loss_mask[mini].sum()))  # normalisers: the whole mini-batch
                mini_seqs = global_sum(acc, float((loss_mask[mini].sum(dim=1) > 0).sum()))
                for lo in range(0, len(mini), cfg.micro_batch_size):
                    idx = mini[lo:lo + cfg.micro_batch_size]
                    logp, entropy = completion_logprobs(model, batch.prompt_ids[idx], batch.prompt_mask[idx],
                                                        batch.completion_ids[idx], batch.completion_mask[idx],
                                                        with_entropy=True, entropy_grad=algo.entropy_coef > 0)
                    mask = loss_mask[idx].to(logp.device)
                    if engine is not None and epoch == 0 and mini_index == 0:  # weights the engine sampled with
                        gap_sum, gap_max, gap_count = logprob_gap(logp, batch.sampler_logprobs[idx].to(logp.device),
                                                                  batch.loss_mask[idx].to(logp.device))
                        gap = {"sum": gap["sum"] + gap_sum, "max": max(gap["max"], gap_max),
                               "count": gap["count"] + gap_count}
                    old = old_logp[idx].to(logp.device) if old_logp is not None else logp.detach()
                    token_loss, clip_stats = clipped_surrogate(logp, old, advantages[idx].to(logp.device), mask,
                                                               algo.clip_low, algo.clip_high, algo.dual_clip)
                    token_loss, kl = penalized_token_loss(
                        token_loss, logp, ref_logp[idx].to(logp.device) if ref_logp is not None else None, entropy,
                        mask, algo.kl_coef, algo.kl_estimator, "loss", algo.entropy_coef)
                    width = int(env_cfg.max_total_tokens)
                    loss = aggregate(token_loss, mask, algo.loss_agg, mini_tokens, mini_seqs, width)
                    backward(acc, loss, model)
                    stats["loss"] += loss.item() / updates_per_step
                    valid = mask.sum().clamp(min=1)
                    stats["entropy"].append(((entropy.detach() * mask).sum() / valid).item())
                    stats["clip"].append(clip_stats["train/clip_frac_high"].item() + clip_stats["train/clip_frac_low"].item())
                    if kl is not None:
                        stats["kl"].append(((kl.detach() * mask).sum() / valid).item())
                grad_norm = optimizer_step(acc, model, optimizer, scheduler, cfg.optim.max_grad_norm)
                if grad_norm is not None:
                    stats["grad_norm"].append(grad_norm)
        if skip_update:
            for _ in range(updates_per_step):  # the schedule still follows the step count
                scheduler.step()
        if engine is not None:
            engine.sync_weights(acc.unwrap_model(model))  # the next episodes (and evaluation) play the updated policy

        step_time = time.perf_counter() - step_start
        mean = lambda values: sum(values) / len(values) if values else 0.0  # noqa: E731
        sampled = gather_padded(acc, batch.loss_mask).bool()  # (N, C) over the global batch
        all_advantages = gather_padded(acc, advantages)  # (N, C)
        metrics = {
            **episode_metrics(all_episodes, "env"),
            "env/anchor_group_size": credit_metrics.get("env/anchor_group_size", 0.0),
            "env/turn_truncated": sum(e.turn_truncated for e in all_episodes) / max(len(all_episodes), 1),
            "train/loss": global_sum(acc, stats["loss"]),
            "train/update_skipped": float(skip_update),
            "train/lr": scheduler.get_last_lr()[0],
            "train/advantage_mean": all_advantages[sampled].mean().item() if sampled.any() else 0.0,
            "train/advantage_std": all_advantages[sampled].std().item() if sampled.sum() > 1 else 0.0,
            "completions/tokens_per_episode": sampled.sum().item() / max(len(all_episodes), 1),
            "perf/step_time_s": step_time,
            "perf/generation_time_s": generation_time,
        }
        if not skip_update:  # a skipped update computed no log-probs
            metrics["train/entropy"] = global_mean(acc, mean(stats["entropy"]))
            metrics["train/clip_frac"] = global_mean(acc, mean(stats["clip"]))
        if engine is not None:  # float error when the engine holds the weights the trainer had (rollout.temperature 1)
            metrics["rollout/logprob_gap_mean"] = global_sum(acc, gap["sum"]) / max(global_sum(acc, gap["count"]), 1)
            metrics["rollout/logprob_gap_max"] = gather(acc, torch.tensor([gap["max"]])).max().item()
        if reference is not None:
            metrics["train/kl_ref"] = global_mean(acc, mean(stats["kl"]))
        if stats["grad_norm"]:
            metrics["train/grad_norm"] = mean(stats["grad_norm"])  # the clipped norm is already global
        if env_cfg.name == "harness":  # [harness] fork rows, timeouts, episodes cut by a limit
            metrics.update(harness_metrics(all_episodes, "env"))
        if eval_due(step, cfg.eval.every, cfg.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        if cfg.log.samples_every and (step % cfg.log.samples_every == 0 or step == 1) and acc.is_main_process:
            # the main process holds the first shard, so its local episode i is global episode i
            extra = [{"advantages": step_adv[step_episode == i].tolist()} for i in range(len(episodes))]
            write_samples(run_dir, step, episode_records(episodes, cfg.log.num_samples, extra))
        end_step(step, metrics, metrics_log, checkpointer, cfg.log.every, cfg.steps)
    metrics_log.close()
    if engine is not None:
        engine.close()
    return {"model": model, "final_eval": last_eval}
