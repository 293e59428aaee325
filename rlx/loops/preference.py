"""Offline preference optimization (DPO family, SimPO, ORPO), read top to bottom.

Setup:
  1. load (prompt, chosen, rejected) pairs (data.pairs), render prompts with the chat template,
     tokenize with the configured length limits; hold out data.pairs.eval_size pairs;
  2. reference log-probs: for reference-based losses with algorithm.reference=precompute, one pass of
     the starting policy (the reference) over every pair the run will draw (steps x batch_size of them, all
     of them from the second epoch on) and the held-out ones, saved to <run>/reference_logps.pt, and no
     reference model is kept; with reference=model a frozen copy runs every step; reference-free
     losses (simpo, orpo) use no reference at all.
Each step:
  3. draw algorithm.batch_size pairs; for each micro-batch run chosen and rejected through the
     policy in one forward pass and sum the completion log-probs;
  4. loss = mean over pairs of preference_loss (algorithms/preference.py)
            + algorithm.sft_weight * NLL of the chosen completion per token (RPO; ORPO's L_SFT);
  5. one optimizer step. At eval steps: held-out preference accuracy and task accuracy (greedy).
"""

from __future__ import annotations

import logging
import time

import torch

from rlx.algorithms.preference import REFERENCE_FREE, preference_loss, sft_nll
from rlx.data.preferences import collate, load_prepared_pairs
from rlx.data.sources import PromptStream
from rlx.engines.generator import eval_policy_generator
from rlx.evaluation.tasks import evaluate, task_eval_settings
from rlx.loops.common import Components, PreferenceParts, end_step, eval_due, evaluate_at_start, frozen_reference
from rlx.models.forward import completion_logprobs
from rlx.runtime.optim import optimizer_step
from rlx.runtime.parallel import backward, global_sum, shard
from rlx.runtime.rundir import PhaseProgress, write_samples
from rlx.runtime.storage import writing

log = logging.getLogger("rlx")


def sequence_logps(model, pairs: list[dict], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Summed completion log-probs of chosen and rejected in one forward pass.

    Returns chosen_logps (m,), rejected_logps (m,), chosen_lengths (m,), rejected_lengths (m,)."""
    batch = collate(pairs, pad_id)
    m = len(pairs)
    width = max(batch.chosen_ids.shape[1], batch.rejected_ids.shape[1])

    def widen(t):  # right-pad a completion tensor to `width` columns
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=0)

    completion_ids = torch.cat([widen(batch.chosen_ids), widen(batch.rejected_ids)])  # (2m, C)
    completion_mask = torch.cat([widen(batch.chosen_mask), widen(batch.rejected_mask)])  # (2m, C)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_id)
    prompt_ids = torch.cat([batch.prompt_ids, batch.prompt_ids])  # (2m, P)
    prompt_mask = torch.cat([batch.prompt_mask, batch.prompt_mask])  # (2m, P)
    logp, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask)  # (2m, C)
    mask = completion_mask.to(logp.device, logp.dtype)
    summed = (logp * mask).sum(dim=1)  # (2m,)
    lengths = mask.sum(dim=1)  # (2m,)
    return summed[:m], summed[m:], lengths[:m], lengths[m:]


@torch.no_grad()
def reference_logps(model, pairs: list[dict], micro: int, pad_id: int, progress=None) -> torch.Tensor:
    """(N, 2) summed log-probs of (chosen, rejected) under `model`, in the order of `pairs`.
    progress: an object with .advance(n) (rlx.runtime.rundir.PhaseProgress), told of every pair done."""
    was_training = model.training
    model.eval()
    out = []
    for lo in range(0, len(pairs), micro):
        chosen, rejected, _, _ = sequence_logps(model, pairs[lo : lo + micro], pad_id)
        out.append(torch.stack([chosen, rejected], dim=1).float().cpu())
        if progress is not None:
            progress.advance(len(pairs[lo : lo + micro]))
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, 2)


def load_pairs(settings, parts: Components) -> dict:
    """Run by the builder (rlx/build.py) on the unprepared starting policy: 1. the tokenized pairs, and
    2. for a reference-based loss with algorithm.reference=precompute, the reference log-probs of every
    pair the run draws and every held-out pair (the starting policy is the reference), written into the pairs
    and <run>/reference_logps.pt (NaN rows: training pairs the run never draws).
    Returns {train_pairs, eval_pairs, data_counts} (parts.pairs)."""
    algo, acc, run_dir = settings.algorithm, parts.accelerator, parts.run_dir
    pad_id, micro = parts.tokenizer.pad_token_id, settings.micro_batch_size
    train_pairs, eval_pairs, data_counts = load_prepared_pairs(settings, parts.tokenizer)
    for index, pair in enumerate(train_pairs):
        pair["index"] = index
    loaded = dict(train_pairs=train_pairs, eval_pairs=eval_pairs, data_counts=data_counts)
    if algo.loss_type not in REFERENCE_FREE and algo.reference != "model":
        start = time.perf_counter()
        parts.model.to(acc.device)
        drawn = pairs_drawn(len(train_pairs), settings.seed, settings.steps * algo.batch_size)
        used = [train_pairs[i] for i in drawn]
        with PhaseProgress("reference log-probs", len(used) + len(eval_pairs), settings.log.progress,
                           enabled=acc.is_main_process) as bar:
            computed = reference_logps(parts.model, used, micro, pad_id, bar)  # (len(used), 2)
            cached = {"train": torch.full((len(train_pairs), 2), float("nan")),  # NaN: a pair the run never draws
                      "eval": reference_logps(parts.model, eval_pairs, micro, pad_id, bar)}
            if drawn:
                cached["train"][torch.tensor(drawn)] = computed
        if acc.is_main_process:  # a record of the reference (a resume recomputes it): optional
            with writing(run_dir / "reference_logps.pt", "the reference log-probs",
                         partial=run_dir / "reference_logps.pt", optional="reference_logps.pt"):
                torch.save(cached, run_dir / "reference_logps.pt")
        for split, pairs in (("train", used), ("eval", eval_pairs)):
            for pair, (chosen, rejected) in zip(pairs, (computed if split == "train" else cached["eval"]).tolist()):
                pair["ref_chosen"], pair["ref_rejected"] = chosen, rejected
        log.info("reference log-probs of %d pairs (%d held out; %d of %d training pairs: the run draws no others) "
                 "precomputed in %.1fs -> %s", len(used) + len(eval_pairs), len(eval_pairs), len(used),
                 len(train_pairs), time.perf_counter() - start, run_dir / "reference_logps.pt")
    return loaded


def pairs_drawn(num_pairs: int, seed: int, draws: int) -> list[int]:
    """Indices of the training pairs a run's PromptStream(pairs, seed) hands out in `draws` draws (steps x batch),
    sorted: every pair once the run reaches a second epoch. The reference pass skips the others: a short run
    on a real model (2 steps of 4 pairs) need not score thousands of pairs it never trains on."""
    if draws >= num_pairs:
        return list(range(num_pairs))
    return sorted(PromptStream(list(range(num_pairs)), seed).take(draws))


def train_preference(settings, parts: PreferenceParts) -> dict:
    algo = settings.algorithm
    acc, tokenizer, run_dir = parts.accelerator, parts.tokenizer, parts.run_dir
    pad_id, micro = tokenizer.pad_token_id, settings.micro_batch_size
    train_pairs, eval_pairs, data_counts = (parts.pairs[k] for k in ("train_pairs", "eval_pairs", "data_counts"))
    uses_reference = algo.loss_type not in REFERENCE_FREE
    # reference log-probs: precomputed by load_pairs, or a frozen model (LoRA: the base with the adapter off)
    model, optimizer, scheduler = parts.model, parts.optimizer, parts.scheduler
    reference = frozen_reference(parts.reference)
    stream = PromptStream(train_pairs, settings.seed)
    checkpointer, metrics_log = parts.checkpointer, parts.metrics_log
    start_step = checkpointer.restore(**parts.checkpointed, data=stream)
    loss_kwargs = dict(loss_type=algo.loss_type, beta=algo.beta, label_smoothing=algo.label_smoothing, gamma=algo.gamma,
                       length_normalize=algo.length_normalize)

    def references(pairs: list[dict], device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not uses_reference:
            return None, None
        if reference is not None:
            with torch.no_grad():
                chosen, rejected, _, _ = sequence_logps(reference, pairs, pad_id)
            return chosen, rejected
        if any("ref_chosen" not in p for p in pairs):  # pairs_drawn's simulation of the stream disagrees with it
            raise RuntimeError("a preference pair without a precomputed reference log-prob: the run draws more pairs "
                               "than steps x algorithm.batch_size")
        chosen = torch.tensor([p["ref_chosen"] for p in pairs], device=device)  # (m,)
        rejected = torch.tensor([p["ref_rejected"] for p in pairs], device=device)  # (m,)
        return chosen, rejected

    eval_settings = task_eval_settings(settings)
    eval_rows = parts.eval_rows[: settings.eval.size]

    @torch.no_grad()
    def run_eval(step: int) -> dict:
        policy = acc.unwrap_model(model)
        was_training = policy.training
        policy.eval()
        metrics: dict = {}
        if eval_pairs:
            sums = {"eval/pref_accuracy": 0.0, "eval/pref_margin": 0.0, "eval/pref_loss": 0.0,
                    "eval/pref_accuracy_logp": 0.0}
            for lo in range(0, len(eval_pairs), micro):
                pairs = eval_pairs[lo : lo + micro]
                chosen, rejected, chosen_len, rejected_len = sequence_logps(policy, pairs, pad_id)
                ref_chosen, ref_rejected = references(pairs, chosen.device)
                losses, stats = preference_loss(chosen, rejected, ref_chosen, ref_rejected, chosen_lengths=chosen_len,
                                                rejected_lengths=rejected_len, **loss_kwargs)
                weight = len(pairs) / len(eval_pairs)
                sums["eval/pref_accuracy"] += stats["pref/accuracy"].item() * weight
                sums["eval/pref_margin"] += stats["pref/margin"].item() * weight
                sums["eval/pref_loss"] += losses.mean().item() * weight
                # reference-free view, meaningful at step 0 too: does the policy give chosen a higher per-token
                # log-prob?
                sums["eval/pref_accuracy_logp"] += (chosen / chosen_len > rejected
                                                    / rejected_len).float().mean().item() * weight
            metrics.update(sums)
        if eval_rows:
            generator = eval_policy_generator(policy, tokenizer, eval_settings.batch_size)  # the policy decodes itself
            task_metrics, records = evaluate(generator, tokenizer, eval_rows, parts.rewards, eval_settings, acc=acc,
                                             step=step)
            metrics.update(task_metrics)
            if acc.is_main_process:
                write_samples(run_dir, step, records[: settings.log.num_samples])
        policy.train(was_training)
        return metrics

    last_eval = evaluate_at_start(settings.eval.at_start, start_step, metrics_log, run_eval, data_counts)

    batch_size = algo.batch_size
    model.train()  # gradient checkpointing acts only in train mode; dropout is off (models/lora.py)
    for step in range(start_step + 1, settings.steps + 1):
        start = time.perf_counter()
        # 3. a batch of pairs (this process's shard of the global batch), in micro-batches
        pairs = stream.take(batch_size)[shard(batch_size, acc)]
        totals: dict[str, float] = {}
        tokens = 0
        for lo in range(0, len(pairs), micro):
            chunk = pairs[lo : lo + micro]
            chosen, rejected, chosen_len, rejected_len = sequence_logps(model, chunk, pad_id)  # (m,) each
            ref_chosen, ref_rejected = references(chunk, chosen.device)
            # 4. preference loss + optional SFT term, mean over the whole batch
            losses, stats = preference_loss(chosen, rejected, ref_chosen, ref_rejected, chosen_lengths=chosen_len,
                                            rejected_lengths=rejected_len, **loss_kwargs)  # (m,)
            nll = sft_nll(chosen, chosen_len)  # (m,)
            loss = (losses.sum() + algo.sft_weight * nll.sum()) / batch_size  # mean over the GLOBAL batch
            backward(acc, loss, model)
            weight = len(chunk) / batch_size
            stats = {**stats, "train/loss": loss.detach() / weight, "train/pref_loss": losses.detach().mean(),
                     "train/sft_nll": nll.detach().mean(), "pref/chosen_length": chosen_len.mean(),
                     "pref/rejected_length": rejected_len.mean()}
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + float(value) * weight
            tokens += int(chosen_len.sum() + rejected_len.sum()) + 2 * sum(len(p["prompt_tokens"]) for p in chunk)
        # 5. optimizer step
        grad_norm = optimizer_step(acc, model, optimizer, scheduler, settings.optim.max_grad_norm)
        elapsed = time.perf_counter() - start
        totals = {key: global_sum(acc, value) for key, value in totals.items()}
        tokens = global_sum(acc, tokens)
        metrics = {
            **totals,
            "train/lr": scheduler.get_last_lr()[0],
            "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
            "perf/step_time_s": elapsed,
            "perf/tokens_per_s": tokens / elapsed,
        }
        if eval_due(step, settings.eval.every, settings.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        end_step(step, metrics, metrics_log, checkpointer, settings.log.every, settings.steps)
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}
