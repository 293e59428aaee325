"""Bradley-Terry reward-model training on preference pairs, read top to bottom.

The model is a sequence-classification checkpoint with a scalar head (train.py loads it with
AutoModelForSequenceClassification, num_labels=1; a causal LM gets a fresh head). Each step:
  1. draw algorithm.batch_size pairs; score prompt + chosen and prompt + rejected in one forward
     pass per micro-batch (the score is read at the last token, the EOS);
  2. loss = mean over pairs of  -log sigmoid(s_c - s_r - m) + center_coef * (s_c + s_r)^2
     (algorithms/preference.py: bradley_terry_loss), m the data's margin column when use_margin;
  3. one optimizer step. At eval steps: held-out pairwise accuracy eval/pref_accuracy.
The saved final/ model is usable as `reward=model reward.components.model.path=<run dir>`.
With several processes (hardware=ddp), each scores its shard of the batch and the loss is a mean over
the global batch (rlx/runtime/parallel.py); checkpoints hold the model, optimizer, schedule and data position.
"""

from __future__ import annotations

import logging
import time

import torch

from rlx.algorithms.preference import bradley_terry_loss
from rlx.data.preferences import load_prepared_pairs
from rlx.data.sources import PromptStream
from rlx.errors import UserError
from rlx.loops.common import Parts, end_step, eval_due, evaluate_at_start
from rlx.rewards.model import forward_scores
from rlx.runtime.optim import optimizer_step
from rlx.runtime.parallel import backward, global_sum, shard

log = logging.getLogger("rlx")


def pair_scores(model, pairs: list[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of prompt + chosen and prompt + rejected, (m,) each, from one forward pass."""
    sequences = [p["prompt_tokens"] + p["chosen_tokens"] for p in pairs] + \
        [p["prompt_tokens"] + p["rejected_tokens"] for p in pairs]
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # (2m, T)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)  # (2m, T)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
    device = next(model.parameters()).device
    scores = forward_scores(model, ids.to(device), mask.to(device)).float()  # (2m,)
    return scores[: len(pairs)], scores[len(pairs) :]


def train_reward_model(settings, parts: Parts) -> dict:
    algo = settings.algorithm
    acc, tokenizer = parts.accelerator, parts.tokenizer
    pad_id, micro = tokenizer.pad_token_id, settings.micro_batch_size
    train_pairs, eval_pairs, data_counts = load_prepared_pairs(settings, tokenizer)
    if algo.use_margin and not any("margin" in p for p in train_pairs):
        raise UserError("algorithm.use_margin=true but the pairs have no margin; set data.pairs.columns.margin=COLUMN")
    model, optimizer, scheduler = parts.model, parts.optimizer, parts.scheduler
    stream = PromptStream(train_pairs, settings.seed)
    checkpointer, metrics_log = parts.checkpointer, parts.metrics_log
    start_step = checkpointer.restore(**parts.checkpointed, data=stream)

    def margins(pairs: list[dict], device) -> torch.Tensor | None:
        if not algo.use_margin:
            return None
        return torch.tensor([p.get("margin", 0.0) for p in pairs], device=device)  # (m,)

    @torch.no_grad()
    def run_eval(step: int) -> dict:
        net = acc.unwrap_model(model)
        was_training = net.training
        net.eval()
        correct, diff_sum, loss_sum = 0.0, 0.0, 0.0
        for lo in range(0, len(eval_pairs), micro):
            pairs = eval_pairs[lo : lo + micro]
            chosen, rejected = pair_scores(net, pairs, pad_id)
            losses, _ = bradley_terry_loss(chosen, rejected, margins(pairs, chosen.device), algo.center_coef)
            correct += (chosen > rejected).float().sum().item()
            diff_sum += (chosen - rejected).sum().item()
            loss_sum += losses.sum().item()
        net.train(was_training)
        n = max(1, len(eval_pairs))
        return {"eval/pref_accuracy": correct / n, "eval/rm_margin": diff_sum / n, "eval/rm_loss": loss_sum / n}

    last_eval = evaluate_at_start(settings.eval.at_start, start_step, metrics_log, run_eval,
                                  data_counts) if eval_pairs else {}

    batch_size = algo.batch_size
    model.train()  # gradient checkpointing acts only in train mode; dropout is off (models/lora.py)
    for step in range(start_step + 1, settings.steps + 1):
        start = time.perf_counter()
        # 1. a batch of pairs (this process's shard of the global batch), in micro-batches
        pairs = stream.take(batch_size)[shard(batch_size, acc)]
        totals: dict[str, float] = {}
        tokens = 0
        for lo in range(0, len(pairs), micro):
            chunk = pairs[lo : lo + micro]
            chosen, rejected = pair_scores(model, chunk, pad_id)  # (m,) each
            # 2. Bradley-Terry loss (+ margin, + centering), mean over the batch
            losses, stats = bradley_terry_loss(chosen, rejected, margins(chunk, chosen.device), algo.center_coef)
            loss = losses.sum() / batch_size  # mean over the GLOBAL batch
            backward(acc, loss, model)
            weight = len(chunk) / batch_size
            for key, value in {**stats, "train/loss": losses.detach().mean()}.items():
                totals[key] = totals.get(key, 0.0) + float(value) * weight
            tokens += sum(2 * len(p["prompt_tokens"]) + len(p["chosen_tokens"]) + len(p["rejected_tokens"])
                          for p in chunk)
        # 3. optimizer step
        grad_norm = optimizer_step(acc, model, optimizer, scheduler, settings.optim.max_grad_norm)
        elapsed = time.perf_counter() - start
        totals = {key: global_sum(acc, value) for key, value in totals.items()}
        tokens = global_sum(acc, tokens)
        metrics = {
            **totals,
            "pref/accuracy": totals["rm/accuracy"],  # same meaning as the DPO-family metric: chosen scored higher
            "pref/margin": totals["rm/margin"],
            "train/lr": scheduler.get_last_lr()[0],
            "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
            "perf/step_time_s": elapsed,
            "perf/tokens_per_s": tokens / elapsed,
        }
        if eval_pairs and eval_due(step, settings.eval.every, settings.steps):
            last_eval = run_eval(step)
            metrics.update(last_eval)
        end_step(step, metrics, metrics_log, checkpointer, settings.log.every, settings.steps)
    metrics_log.close()
    return {"model": model, "final_eval": last_eval}
