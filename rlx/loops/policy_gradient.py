"""The policy-gradient loop (GRPO family and multi-turn agents; critic-free), read top to bottom.

Each step:
  1. the producer (rlx/rollout/single_turn.py or episodes.py, built by rlx/build.py) hands over a Batch around
     one Rollout: G samples per prompt scored by the reward components (with DAPO's dynamic sampling and the
     median estimator's extra pivot), or G episodes per environment seed played turn by turn;
  2. log-probs under the policy that sampled ("old", recomputed by the trainer when several optimizer steps
     are taken per batch, the KL is in the reward, or tokens are ranked by entropy) and under the frozen
     reference (when kl_coef > 0), both at the sampling temperature;
  3. credit (loops/credit.py, by the producer's kind): an outcome estimator over each group's rewards
     (algorithm.advantage), or a credit rule over the steps of the episodes (algorithm.credit), spread over
     the sampled tokens by their loss mask;
  4. one update: the policy loss (algorithms/policy_loss.py, built once before the first step): the clipped
     surrogate (algorithms/losses.py) plus an optional KL penalty (algorithms/kl.py), entropy bonus and the agents'
     entropy band (passed per step), the off-policy correction when the sampler is not the trainer (rollout.correction:
     an engine's float error, stale rows of pipeline mode or partial rollouts; algorithms/offpolicy.py),
     forking tokens (algorithm.forking_rho), for `algorithm.epochs` passes of `algorithm.mini_batches`
     optimizer steps, accumulated exactly over micro-batches (rows grouped by length, micro_batch_size rows or
     micro_batch_tokens; packed_forward); the loss normalisers are those of the whole mini-batch;
  5. the updated weights are published to the generator (a vLLM engine copies them; the policy samples itself).
Departures from the GRPO paper: token-mean aggregation by default (DAPO), and the old log-probs are not
recomputed when only one optimizer step is taken per batch (the ratio is then exactly 1). With several
processes (hardware=ddp), each holds its contiguous shard of the global batch, and rewards, advantages and
loss normalisers are computed over the global batch (rlx/runtime/parallel.py). PPO is its own loop
(loops/ppo.py), written to be diffed against this one.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from functools import partial

import torch

from rlx.algorithms.entropy_band import BandTerm, EntropyHistory, epo_phase_weight
from rlx.algorithms.kl import adaptive_kl_coef
from rlx.algorithms.losses import entropy_threshold, top_entropy_mask
from rlx.algorithms.offpolicy import Correction, logprob_gap, needs_proximal_logprobs
from rlx.algorithms.policy_loss import PolicyInputs, PolicyLoss
from rlx.loops.common import (
    KLCoefficient,
    NoMixer,
    PolicyParts,
    ReferenceReset,
    batched_logprobs,
    end_step,
    eval_due,
    evaluate_at_start,
    frozen_reference,
    masked_mean,
    mean_of,
)
from rlx.loops.credit import credit_rule
from rlx.loops.micro_batches import MicroBatching, parameter_count, plan_micro_batches
from rlx.models.forward import LogprobSettings, completion_logprobs
from rlx.rollout.types import HintedContext
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


def train_policy_gradient(settings, parts: PolicyParts) -> dict:
    algo, roll = settings.algorithm, settings.rollout
    acc, run_dir = parts.accelerator, parts.run_dir
    producer, generator = parts.producer, parts.generator
    updates_per_step = algo.epochs * algo.mini_batches
    model, scheduler = parts.model, parts.scheduler
    reference = frozen_reference(parts.reference)  # the frozen starting policy (LoRA: the base, adapter off) or None
    kl_state = KLCoefficient(float(algo.kl_coef))
    reference_reset = ReferenceReset(reference, algo.ref_reset_every)
    shuffle = torch.Generator().manual_seed(settings.seed)
    checkpointer, metrics_log, run_eval = parts.checkpointer, parts.metrics_log, parts.run_eval
    # training state in the order checkpoints hold it (single-turn runs have always kept the KL coefficient)
    state = {**parts.checkpointed, **producer.checkpointed(), "shuffle": GeneratorState(shuffle)}
    if algo.family == "policy_gradient" or algo.kl_target is not None:
        state["kl"] = kl_state
    mixer = None if isinstance(parts.mixer, NoMixer) else parts.mixer  # mixture.rule: per-objective weights
    if mixer is not None:
        state["mixture"] = mixer
    band = entropy_band_of(algo)  # EPO-style entropy smoothing (agents): the per-turn entropy history, or None
    if band is not None:
        state["entropy_history"] = band.history
    start_step = checkpointer.restore(**state, **reference_reset.checkpointed())
    if start_step:  # resumed: a vLLM engine was built on the starting weights
        generator.publish(acc.unwrap_model(model), start_step)
    last_eval = evaluate_at_start(settings.eval.at_start, start_step, metrics_log, run_eval)
    pack = settings.packed_forward
    # the knobs of every step's update, and its loss
    update = UpdateSettings.of(settings, producer.loss_width, parameter_count(model))
    correction = update.loss.correction  # the off-policy correction (rollout.correction)

    for step in range(start_step + 1, settings.steps + 1):
        kl_coef = kl_state.value
        step_start = time.perf_counter()
        reference_reset.maybe_reset(step, acc.unwrap_model(model))
        # 1. rows from the producer (this process's shard; rewards over the global batch)
        batch = producer.produce(step)
        credit_of = credit_rule(batch, algo.family)  # by the rows' record: single-turn (PromptRows) or episodes
        rollout = batch.rollout
        generation_time = time.perf_counter() - step_start
        generator.sleep()  # rollout=vllm with rollout.sleep_level: the engine's memory is given back for the update
        sampler_logp = rollout.logprobs  # (n, C) the sampler's log-probs of the sampled tokens, or None
        completion_mask = rollout.loss_mask  # (n, C) the sampled tokens
        if algo.mask_truncated:
            completion_mask = completion_mask * (~rollout.truncated).long().unsqueeze(1)  # (n, C)

        # 2. old (proximal) log-probs (needed for several optimizer steps, KL in the reward, a rejecting correction,
        # entropy ranking, or rows sampled in another context: hints, whose old log-probs are those of the hinted
        # prompt) and the reference's
        band_term = band.at(step, settings.steps) if band is not None else None  # this step's entropy band
        need_old = (needs_proximal_logprobs(updates_per_step, reference is not None and algo.kl_in == "reward",
                                            correction.rule) or isinstance(batch.context, HintedContext))
        old_logp, old_entropy = None, None
        logprob_start = time.perf_counter()
        if need_old or algo.forking_rho < 1:
            old_logp, old_entropy = batched_logprobs(model, batch.sampled_in, update.batching,
                                                     with_entropy=algo.forking_rho < 1, temperature=roll.temperature,
                                                     pack=pack, count_all=partial(global_max, acc))
        ref_logp = (batched_logprobs(reference, rollout, update.batching, temperature=roll.temperature,
                                     pack=pack, count_all=partial(global_max, acc))[0]
                    if reference is not None else None)
        logprob_time = time.perf_counter() - logprob_start

        # 3. credit: this process's advantages, (n,) per row or (n, C) per token, computed over the global batch
        credit = credit_of(batch, algo, acc=acc, completion_mask=completion_mask, old_logp=old_logp,
                           ref_logp=ref_logp, kl_coef=kl_coef)
        advantages, mixture_metrics = weighted_advantages(mixer, credit.advantages, batch, acc, settings)
        loss_mask = completion_mask * credit.keep.long().unsqueeze(1)  # (n, C): pivots and masked rows leave the loss
        pg_mask = loss_mask  # (n, C): tokens in the policy-gradient term
        if algo.forking_rho < 1:  # one threshold over the global batch (every process's valid tokens)
            threshold = entropy_threshold(gather_padded(acc, old_entropy), gather_padded(acc, loss_mask),
                                          algo.forking_rho)
            pg_mask = loss_mask * top_entropy_mask(old_entropy, loss_mask, algo.forking_rho, threshold).long()
        rejected = 0  # tokens a rejecting correction removed from the loss
        if correction.rejecting and sampler_logp is not None:  # they leave the loss and its normaliser
            kept = correction(old_logp, sampler_logp, completion_mask).kept.long()  # (n, C)
            rejected = int((loss_mask * (1 - kept)).sum())
            loss_mask, pg_mask = loss_mask * kept, pg_mask * kept
        if not need_old:
            old_logp = None

        # 4. the update. No group had a reward difference and no KL/entropy term acts: the loss has zero gradient,
        # yet AdamW would move every weight along its momentum, so algorithm.skip_zero_advantage takes no step.
        skip = algo.skip_zero_advantage and not credit.any_signal and algo.kl_coef == 0 and algo.entropy_coef == 0
        model.train()  # gradient checkpointing acts only in train mode (dropout is off for good, models/lora.py)
        update_start = time.perf_counter()
        if skip:
            stats = new_stats()
            with warnings.catch_warnings():  # a schedule stepped before the first optimizer step is what we want here
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
                for _ in range(updates_per_step):  # the schedule still follows the step count
                    scheduler.step()
        else:
            rows = UpdateRows(rollout, advantages, completion_mask, loss_mask, pg_mask, credit.keep, old_logp,
                              ref_logp, sampler_logp)
            stats = optimise(parts, rows, kl_coef, shuffle, update, band_term)
        update_time = time.perf_counter() - update_start
        if band is not None and not skip:
            band.record(stats)  # this step's per-turn entropies join the history the next steps' band is set from
        generator.publish(acc.unwrap_model(model), step)  # the next rows (and evaluation) sample the updated policy
        model.eval()  # generation, old/reference log-probs and evaluation run in eval mode
        if reference is not None and algo.kl_target is not None:
            total_samples = batch.rewards.numel()
            observed = (credit.seq_kl.mean().item() if credit.seq_kl is not None
                        else global_sum(acc, stats["seq_kl_sum"]) / (algo.epochs * total_samples))
            kl_state.value = adaptive_kl_coef(kl_coef, observed, algo.kl_target, algo.kl_horizon, total_samples)

        step_time = time.perf_counter() - step_start
        metrics = {
            "train/loss": global_sum(acc, stats["loss"]),
            "train/lr": scheduler.get_last_lr()[0],
            "train/update_skipped": float(skip),
            **credit.metrics,
            **batch.metrics,
            **mixture_metrics,
            "perf/step_time_s": step_time,
            "perf/generation_time_s": generation_time,
            "perf/logprob_time_s": logprob_time,  # the old (proximal) and reference log-prob passes, when needed
            "perf/update_time_s": update_time,  # forward, backward and optimizer steps of the update
            "perf/optimizer_time_s": stats["optimizer_time"],  # of which clipping and the optimizer steps
            "perf/tokens_per_s": global_sum(acc, completion_mask.sum().item()) / step_time,
            **generator.step_metrics(),  # e.g. the weight publish time of an engine or server
        }
        if not skip:  # a skipped update computed no log-probs
            metrics.update(update_metrics(acc, stats))
        if sampler_logp is not None and (stats["gap_count"] or not skip):
            # sampler vs trainer: |log pi_train - log pi_sampler| over the sampled tokens
            metrics["rollout/logprob_gap_mean"] = (global_sum(acc, stats["gap_sum"])
                                                   / max(global_sum(acc, stats["gap_count"]), 1))
            metrics["rollout/logprob_gap_max"] = gather(acc, torch.tensor([stats["gap_max"]])).max().item()
            if correction.active:
                metrics.update(correction_metrics(acc, stats, loss_mask, rejected, correction.rule))
        if stats["band_penalty"]:
            metrics["train/entropy_band_penalty"] = global_mean(acc, mean_of(stats["band_penalty"]))
        if stats["kl"]:
            metrics["train/kl_ref"] = global_mean(acc, mean_of(stats["kl"]))
            metrics["train/kl_coef"] = kl_coef
        if eval_due(step, settings.eval.every, settings.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        if acc.is_main_process and settings.log.samples_every and (step % settings.log.samples_every == 0 or step == 1):
            # the main process holds the first shard, so its local row i is global row i
            write_samples(run_dir, step, producer.records(batch, credit.samples, settings.log.num_samples))
        end_step(step, metrics, metrics_log, checkpointer, settings.log.every, settings.steps)
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}


def weighted_advantages(mixer, advantages: torch.Tensor, batch, acc, settings) -> tuple[torch.Tensor, dict]:
    """mixture.rule: each row's advantage (its policy-gradient term) scaled by its objective's weight, exact since the
    clipped surrogate is positively homogeneous in the advantage; with no mixer, the advantages unchanged. Returns the
    advantages and the step's mixture/* metrics."""
    if mixer is None:
        return advantages, {}
    row_weights, metrics = objective_weights(mixer, batch, acc, settings.mixture.key)  # (n,)
    return advantages * row_weights.view(-1, *[1] * (advantages.dim() - 1)).to(advantages), metrics


def objective_weights(mixer, batch, acc, key: str) -> tuple[torch.Tensor, dict]:
    """The mixer fed this step's mean reward of each objective over the global batch (objectives without rows this
    step are left out), then (n,) the weight of each of this process's rows by its objective (column `key`), and the
    step's mixture/* metrics."""
    rows, rewards = batch.source.rows, batch.rewards[batch.local]
    names = [str(row.get(key)) for row in rows]
    means = {}
    for name in mixer.objectives:
        picked = [i for i, n in enumerate(names) if n == name]
        total = global_sum(acc, float(rewards[picked].sum()) if picked else 0.0)
        count = global_sum(acc, float(len(picked)))
        if count:
            means[name] = total / count
    mixer.observe(means)
    by_name = dict(zip(mixer.objectives, mixer.weights()))
    weights = torch.tensor([by_name.get(name, 1.0) for name in names], dtype=torch.float32)
    return weights, mixer.metrics()


@dataclass(frozen=True)
class UpdateSettings:
    """The knobs of every step's update, read once from the typed settings (algorithm, rollout, batching) before
    the first step, and its policy loss. What moves between steps (the KL coefficient, the entropy band) is an
    argument of `optimise`, not a field."""

    epochs: int
    mini_batches: int
    batching: MicroBatching
    pack: bool
    max_grad_norm: float | None
    temperature: float
    loss: PolicyLoss

    @classmethod
    def of(cls, settings, loss_width: int, parameters: int) -> UpdateSettings:
        algo, roll = settings.algorithm, settings.rollout
        return cls(algo.epochs, algo.mini_batches, MicroBatching.of(settings, parameters), settings.packed_forward,
                   settings.optim.max_grad_norm, roll.temperature,
                   PolicyLoss.from_settings(algo, roll, loss_width))


def new_stats() -> dict:
    return {"loss": 0.0, "kl": [], "entropy": [], "clip_low": [], "clip_high": [], "clip": [], "approx_kl": [],
            "grad_norm": [], "seq_kl_sum": 0.0, "gap_sum": 0.0, "gap_max": 0.0, "gap_count": 0, "tis_capped": 0,
            "tis_weight_sum": 0.0, "band_penalty": [], "band_entropy": [], "optimizer_time": 0.0}


@dataclass(frozen=True)
class UpdateRows:
    """The rows one update trains on: the rollout, its advantages ((n,) per row or (n, C) per token), the masks
    ((n, C): the sampled tokens, those in the loss, those in the policy-gradient term), the rows kept (n,), and
    the log-probs ((n, C) or None) of the policy that sampled ("old", proximal), the reference and the sampler."""

    rollout: object
    advantages: torch.Tensor
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor
    pg_mask: torch.Tensor
    keep: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    sampler_logp: torch.Tensor | None


def optimise(parts: PolicyParts, rows: UpdateRows, kl_coef: float, shuffle: torch.Generator, u: UpdateSettings,
             band: BandTerm | None = None) -> dict:
    """`u.epochs` passes of `u.mini_batches` optimizer steps over the rows, each accumulated exactly over its
    micro-batches, with the accelerator, policy, optimizer and schedule of `parts`, at this step's KL coefficient
    and entropy band (or None). Returns the statistics (new_stats) of the update. rows.old_logp None: one optimizer
    step per batch, the ratio taken against the current policy's own (detached) log-probs."""
    acc, model, optimizer, scheduler = parts.accelerator, parts.model, parts.optimizer, parts.scheduler
    rollout, loss_mask, keep = rows.rollout, rows.loss_mask, rows.keep
    stats = new_stats()
    num_rows = rollout.completion_ids.shape[0]
    updates_per_step = u.epochs * u.mini_batches
    entropy_grad = u.loss.penalty.entropy_coef > 0 or band is not None
    for epoch in range(u.epochs):
        order = torch.randperm(num_rows, generator=shuffle) if updates_per_step > 1 else torch.arange(num_rows)
        for mini in order.chunk(u.mini_batches):
            mini_tokens = global_sum(acc, loss_mask[mini].sum().item())  # normalisers: the whole mini-batch
            mini_seqs = global_sum(acc, keep[mini].sum().item())
            # rows grouped by length, consecutive rows or a token budget (loops/micro_batches.py)
            micro = plan_micro_batches(mini, rollout.prompt_mask, rollout.completion_mask, u.batching,
                                       partial(global_max, acc))
            if u.batching.varies:
                set_accumulation(acc, len(micro))  # this optimizer step's count of backward passes
            for idx in micro:
                logp, entropy = completion_logprobs(
                    model, rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.completion_ids[idx],
                    rollout.completion_mask[idx], with_entropy=True,
                    temperature=rollout.temperatures[idx] if rollout.scheduled else u.temperature,
                    settings=LogprobSettings(entropy_grad=entropy_grad, pack=u.pack),
                )
                device = logp.device
                old = rows.old_logp[idx].to(device) if rows.old_logp is not None else logp.detach()
                corr = sampler_terms(stats, rows, idx, old, u.loss.correction, epoch == 0)
                x = PolicyInputs(logp, old, rows.advantages[idx].to(device), rows.pg_mask[idx].to(device),
                                 loss_mask[idx].to(device), entropy,
                                 rows.ref_logp[idx].to(device) if rows.ref_logp is not None else None,
                                 corr.weights if corr is not None else None,
                                 rollout.step_index[idx].to(device) if band is not None else None,
                                 mini_tokens, mini_seqs)
                loss, terms = u.loss(x, kl_coef, band)
                backward(acc, loss, model)
                stats["loss"] += loss.item() / updates_per_step
                record_micro_batch(stats, x, terms, corr, rows.completion_mask[idx].to(device), epoch == 0)
            optimizer_start = time.perf_counter()
            grad_norm = optimizer_step(acc, model, optimizer, scheduler, u.max_grad_norm)
            stats["optimizer_time"] += time.perf_counter() - optimizer_start
            if grad_norm is not None:
                stats["grad_norm"].append(grad_norm)
    return stats


def sampler_terms(stats: dict, rows: UpdateRows, idx: torch.Tensor, old: torch.Tensor, correction,
                  first_epoch: bool) -> Correction | None:
    """Where a sampler's log-probs are recorded: in the first epoch, the sampler-vs-trainer gap of micro-batch `idx`
    joins `stats` (`old`: the trainer's log-probs at sampling time); with a correction, its weights pi_prox / mu of
    the micro-batch's sampled tokens. None without a sampler's log-probs or a correction."""
    if rows.sampler_logp is None:
        return None
    device = old.device
    sampler, sampled = rows.sampler_logp[idx].to(device), rows.completion_mask[idx].to(device)
    if first_epoch:
        gap_sum, gap_max, gap_count = logprob_gap(old, sampler, sampled)
        stats["gap_sum"], stats["gap_count"] = stats["gap_sum"] + gap_sum, stats["gap_count"] + gap_count
        stats["gap_max"] = max(stats["gap_max"], gap_max)
    return correction(old, sampler, sampled) if correction.active else None


def record_micro_batch(stats: dict, x: PolicyInputs, terms: dict, corr: Correction | None, sampled: torch.Tensor,
                       first_epoch: bool) -> None:
    """One micro-batch's statistics into `stats`: the KL and entropy (sampled: its sampled tokens), the clip fractions,
    and in the first epoch the correction's truncations and weights and the entropy band's penalty and per-turn
    entropies (the band's history is fed from them)."""
    if first_epoch and corr is not None:
        stats["tis_capped"] += int((corr.bounded & x.loss_mask.bool()).sum())
        stats["tis_weight_sum"] += (corr.weights * x.loss_mask).sum().item()
    if first_epoch and "band_penalty" in terms:
        stats["band_penalty"].append(masked_mean(terms["band_penalty"], x.loss_mask))
        stats["band_entropy"].append((x.entropy.detach().cpu(), torch.where(x.loss_mask.bool().cpu(), x.turns.cpu(),
                                                                            -1)))
    if "kl" in terms:
        stats["kl"].append(masked_mean(terms["kl"], x.loss_mask))
        stats["seq_kl_sum"] += (terms["kl"] * x.loss_mask).sum().item()
    stats["entropy"].append(masked_mean(x.entropy.detach(), sampled))
    low, high = terms["train/clip_frac_low"].item(), terms["train/clip_frac_high"].item()
    stats["clip_low"].append(low)
    stats["clip_high"].append(high)
    stats["clip"].append(high + low)
    stats["approx_kl"].append(terms["train/approx_kl"].item())


def correction_metrics(acc, stats: dict, loss_mask: torch.Tensor, rejected: int, rule: str) -> dict:
    """rollout/is_weight_mean (mean weight over the trained tokens) and rollout/is_bounded_frac (share of the tokens
    the loss would hold without the correction that it truncated (tis) or removed (mis)); tis also under its older
    names rollout/tis_weight_mean and rollout/tis_capped_frac."""
    trained, rejected = global_sum(acc, loss_mask.sum().item()), global_sum(acc, rejected)
    weight = global_sum(acc, stats["tis_weight_sum"]) / max(trained, 1)
    bounded = (global_sum(acc, stats["tis_capped"]) + rejected) / max(trained + rejected, 1)
    metrics = {"rollout/is_weight_mean": weight, "rollout/is_bounded_frac": bounded}
    if rule == "tis":
        metrics.update({"rollout/tis_weight_mean": weight, "rollout/tis_capped_frac": bounded})
    return metrics


class EntropyBand:
    """EPO-style entropy smoothing of the agent family (algorithm.entropy_smoothing; rlx/algorithms/entropy_band.py):
    the per-turn entropy history (checkpointed) and the band term of one update."""

    def __init__(self, coef: float, low: float, high: float):
        self.coef, self.low, self.high = coef, low, high
        self.history = EntropyHistory()

    def at(self, step: int, total_steps: int) -> BandTerm:
        """The band of step `step`, passed to the update: weight coef x the authors' phase weight, the history."""
        return BandTerm(self.coef * epo_phase_weight(step, total_steps), self.history.means(), self.low, self.high)

    def record(self, stats: dict) -> None:
        """One history entry per step: the mean token entropy of each turn index over the step's first epoch."""
        if stats["band_entropy"]:
            width = max(e.shape[1] for e, _ in stats["band_entropy"])
            pad = lambda t, v: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
            entropy = torch.cat([pad(e, 0.0) for e, _ in stats["band_entropy"]])
            turns = torch.cat([pad(t, -1) for _, t in stats["band_entropy"]])
            self.history.update(entropy, turns)


def entropy_band_of(algo) -> EntropyBand | None:
    smoothing = getattr(algo, "entropy_smoothing", None)
    if smoothing is None or not smoothing.coef:
        return None
    return EntropyBand(smoothing.coef, smoothing.low, smoothing.high)


def update_metrics(acc, stats: dict) -> dict:
    """train/* of an update, averaged over micro-batches and processes."""
    metrics = {
        "train/entropy": global_mean(acc, mean_of(stats["entropy"])),
        "train/clip_frac": global_mean(acc, mean_of(stats["clip"])),
        "train/clip_frac_low": global_mean(acc, mean_of(stats["clip_low"])),
        "train/clip_frac_high": global_mean(acc, mean_of(stats["clip_high"])),
        "train/approx_kl": global_mean(acc, mean_of(stats["approx_kl"])),
    }
    if stats["grad_norm"]:
        metrics["train/grad_norm"] = mean_of(stats["grad_norm"])  # the clipped norm is already global
    return metrics
