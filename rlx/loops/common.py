"""Pieces every training loop shares: the parts it starts from, the step's bookkeeping (evaluation, metrics row,
checkpoint), log-probs without gradients, the KL coefficient and the reference reset."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlx.engines.records import Rollout
from rlx.loops.micro_batches import MicroBatching, plan_micro_batches
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


@dataclass(frozen=True)
class ProducerParts:
    """What a producer is built from (rlx.build's producers and a user's `rollout.producer`, fn(settings, parts)):
    the generator it samples through, the tokenizer, the data rows, the reward components, the run directory and
    the accelerator (None where rank 0 alone samples the global batch, without collectives)."""

    generator: object
    tokenizer: object
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[RewardComponent]
    run_dir: Path | None
    accelerator: object


@dataclass(frozen=True)
class NoReference:
    """No frozen reference model: the settings use none (algorithm.kl_coef 0, a reference-free preference loss)."""


@dataclass(frozen=True)
class NoMixer:
    """No mixture of objectives (mixture.rule off): the advantages are the estimator's, unweighted."""


@dataclass(frozen=True)
class Critic:
    """PPO's value model (prepared by Accelerate) with its own optimizer and schedule."""

    model: object
    optimizer: object
    scheduler: object


@dataclass(frozen=True)
class Parts:
    """What every loop starts from, built once by rlx.build.build_parts (the one builder) and never assigned after:
    the typed settings (rlx/config/settings.py), the policy prepared by Accelerate with its optimizer and schedule,
    the data and rewards, the checkpointer and the metrics log. `checkpointed`: training state the loop passes first
    to Checkpointer.restore (the schedules Accelerate did not prepare), in the order checkpoints hold it. A family
    that needs more gets a subclass (SamplingParts, PolicyParts, PPOParts, PreferenceParts): no field is None."""

    settings: object
    accelerator: object
    model: object
    tokenizer: object
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[RewardComponent]
    run_dir: Path
    optimizer: object
    scheduler: object
    checkpointer: object
    metrics_log: object
    checkpointed: dict

    def close(self) -> None:
        """Release what the parts hold beyond the run (a family with a generator closes it)."""


@dataclass(frozen=True)
class SamplingParts(Parts):
    """agent_sft: + the generator (the policy itself, a vLLM engine or server; rlx/engines/generator.py) and the
    held-out evaluator."""

    generator: object
    run_eval: object

    def close(self) -> None:
        """A vLLM engine or server (and its child process) goes with the run, whatever ended it."""
        self.generator.close()


@dataclass(frozen=True)
class PolicyParts(SamplingParts):
    """The policy-gradient and agent families: + the producer of training rows (single-turn or episodes, wrapped by
    the pipeline and rank 0 as the settings ask), the frozen reference (under LoRA the base with the adapter off,
    no copy) or NoReference, and mixture.rule's per-objective loss weights (rlx/algorithms/mixture.py) or NoMixer."""

    producer: object
    reference: object
    mixer: object


@dataclass(frozen=True)
class PPOParts(PolicyParts):
    """PPO: + its critic."""

    critic: Critic


@dataclass(frozen=True)
class PreferenceParts(Parts):
    """The preference family: + its tokenized pairs (reference log-probs precomputed) and the frozen reference or
    NoReference (a reference-free loss, or reference=precompute)."""

    pairs: dict
    reference: object


def frozen_reference(reference):
    """The frozen reference module of a Parts' `reference`, None for NoReference (the loops' local test)."""
    return None if isinstance(reference, NoReference) else reference


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
def batched_logprobs(model, rollout: Rollout, micro: int | MicroBatching, with_entropy: bool = False,
                     temperature: float = 1.0, pack: bool = False, count_all=None):
    """Log-probs (N, C) of the sampled completions under `model` at the sampling temperature (the rollout's
    per-token temperatures when it records them, EAD), without gradients, and the token entropies (N, C) when
    asked (else None). micro: the loop's MicroBatching (rows grouped by length by default; count_all: the count of
    micro-batches every process agrees on, loops/micro_batches.py) or a count of consecutive rows. pack:
    padding-free forward (packed_forward)."""
    num_rows, width = rollout.completion_ids.shape
    batching = micro if isinstance(micro, MicroBatching) else MicroBatching(micro, None, "rows", 0)
    plan = plan_micro_batches(torch.arange(num_rows), rollout.prompt_mask, rollout.completion_mask, batching,
                              count_all)
    parts = []
    for idx in plan:
        logp, entropy = completion_logprobs(
            model, rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.completion_ids[idx],
            rollout.completion_mask[idx],
            with_entropy=with_entropy, temperature=rollout.temperatures[idx] if rollout.scheduled else temperature,
            settings=LogprobSettings(pack=pack),
        )
        parts.append((idx, logp.cpu(), entropy.cpu() if with_entropy else None))
    return _in_row_order(parts, 1), (_in_row_order(parts, 2) if with_entropy else None)


def _in_row_order(parts: list[tuple], field: int) -> torch.Tensor:
    """The (rows, C) values of every micro-batch put back at their rows: parts holds (rows, logp, entropy)."""
    first = parts[0][field]
    out = first.new_zeros((sum(len(p[0]) for p in parts), first.shape[1]))  # (N, C)
    for part in parts:
        out[part[0]] = part[field]
    return out


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
