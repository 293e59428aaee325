"""Pieces every training loop shares: the parts it starts from, the step's bookkeeping (evaluation, metrics row,
checkpoint), log-probs without gradients, the KL coefficient and the reference reset."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlx.engines.records import Rollout
from rlx.models.forward import LogprobSettings, completion_logprobs
from rlx.rewards import RewardComponent
from rlx.rollout.prompts import format_prompts  # noqa: F401  (re-exported: loops and users import it from here)


@dataclass
class Components:
    """What rlx/cli/training.py loads (accelerator, model, tokenizer, data, rewards) and the builder starts from."""

    accelerator: object
    model: object
    tokenizer: object
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[RewardComponent]
    run_dir: Path


@dataclass
class Parts:
    """Everything a loop starts from, built by rlx.build.build_parts (the one builder): the typed settings
    (rlx/config/settings.py), the policy prepared by Accelerate with its optimizer and schedule, the frozen
    reference placed like the policy (None when the family or config does not use one; under LoRA the base
    with the adapter off, no copy), the PPO critic with its own optimizer and schedule, the generator (always
    one: the policy itself, a vLLM engine or server; rlx/engines/generator.py), the producer of training rows
    (single-turn or episodes), the checkpointer, the metrics log and the held-out evaluator, and for the
    preference family its tokenized pairs. `checkpointed`: training state the loop passes first to
    Checkpointer.restore (the schedules Accelerate did not prepare), in the order checkpoints hold it."""

    settings: object
    accelerator: object
    model: object
    tokenizer: object
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[RewardComponent]
    run_dir: Path
    optimizer: object = None
    scheduler: object = None
    checkpointer: object = None
    metrics_log: object = None
    reference: object = None
    value_model: object = None
    value_optimizer: object = None
    value_scheduler: object = None
    generator: object = None
    producer: object = None
    run_eval: object = None
    pairs: object = None
    mixer: object = None  # mixture.rule's per-objective loss weights (rlx/algorithms/mixture.py), or None
    checkpointed: dict = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


@torch.no_grad()
def batched_logprobs(model, rollout: Rollout, micro: int, with_entropy: bool = False, temperature: float = 1.0,
                     pack: bool = False):
    """Log-probs (N, C) of the sampled completions under `model` at the sampling temperature (the rollout's
    per-token temperatures when it records them, EAD), without gradients, and the token entropies (N, C) when
    asked (else None). pack: padding-free forward (packed_forward)."""
    logps, entropies = [], []
    for lo in range(0, rollout.completion_ids.shape[0], micro):
        sl = slice(lo, lo + micro)
        logp, entropy = completion_logprobs(
            model, rollout.prompt_ids[sl], rollout.prompt_mask[sl], rollout.completion_ids[sl],
            rollout.completion_mask[sl],
            with_entropy=with_entropy, temperature=rollout.temperatures[sl] if rollout.scheduled else temperature,
            settings=LogprobSettings(pack=pack),
        )
        logps.append(logp.cpu())
        if with_entropy:
            entropies.append(entropy.cpu())
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    mask = mask.to(values.dtype)
    return ((values * mask).sum() / mask.sum().clamp(min=1)).item()


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
