"""The sampler is not the trainer: log-prob gap, and the off-policy correction of the policy-gradient term.

Two causes make the policy that sampled a row (the behaviour policy, mu) differ from the policy the update
starts from (the proximal policy, pi_prox, the trainer's own log-probs under its current weights):
  - a rollout engine (vLLM, a server) samples with its own kernels, so mu differs from pi_prox by float
    error even under the same weights (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training");
  - asynchronous rollouts (rollout.max_staleness = k > 0) and partial rollouts sample with weights up to k
    updates (or steps) older than the trainer's.
Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL, Fu et al. 2025)
keeps the two apart: the clipped ratio r_t = pi_theta / pi_prox is the trust region, and an importance
weight w_t = pi_prox / mu corrects for sampling from mu:

    loss_t = -w_t * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t),   w_t without gradient.

`importance_correction` computes w from the log-probs, by a rule (rollout.correction) at a level
(rollout.correction_level), both registries:
  rules   none  w = 1
          tis   w = min(rho, C)                           truncated IS (Yao et al. 2025; Espeholt et al. 2018's
                                                          truncated rho of V-trace)
          mis   w = rho if low <= rho <= C, else the token (or row) leaves the loss: masked IS ("When speed
                kills stability", Liu et al. 2025); at token level with low > 0 it is IcePop's two-sided mask
                (Ling team 2025)
  levels  token      rho_t = exp(log pi_prox_t - log mu_t)
          sequence   rho = exp(sum_t (log pi_prox_t - log mu_t)), the same on every token of the row
          geometric  rho = exp(mean_t (log pi_prox_t - log mu_t)) (the length-normalised ratio, as GSPO's)
A token (or row) outside the mask is removed from the loss and from its normaliser (`kept`), not weighted
by 0 while still counted: a masked row then does not shrink the other rows' gradients.

Which log-probs: both sides must describe the same distribution. rlx's decoder records log softmax(z / T) of
the sampled token before top-k / top-p filtering (engines/hf.py), the distribution the trainer's forward
computes (models/forward.py), so with rollout=hf the correction compares like with like whatever the filters.
vLLM reports the log-prob of the FILTERED distribution (processed_logprobs), larger than the unfiltered one by
the log of the kept mass; a correction with rollout=vllm|server and top-k / top-p is refused (rlx/config/
async_rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.registry import Registry


def logprob_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, int]:
    """|log pi_train - log pi_sampler| over the masked tokens: (sum, max, count), to be pooled across batches.

    trainer_logp, sampler_logp, mask: (N, C). An empty mask gives (0.0, 0.0, 0)."""
    keep = mask.bool()
    gap = (trainer_logp.detach().float() - sampler_logp.float()).abs()[keep]  # (M,)
    if gap.numel() == 0:
        return 0.0, 0.0, 0
    return gap.sum().item(), gap.max().item(), gap.numel()


def truncated_importance_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                                 cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w = min(exp(log pi_train - log pi_sampler), cap) per token, without gradient (TIS, Yao et al. 2025).

    trainer_logp: the trainer's log-probs under the weights that sampled (the "old" log-probs); sampler_logp:
    the engine's. Both (N, C). Returns the weights (N, C) and a bool (N, C) marking where the cap applied."""
    ratio = torch.exp(trainer_logp.detach().float() - sampler_logp.float())  # (N, C)
    capped = ratio > cap
    return ratio.clamp(max=cap), capped


# rollout.correction_level: (log ratio (N, C), 0 off the mask; mask (N, C) float) -> the log ratio each token uses
CORRECTION_LEVELS = Registry("off-policy correction level")


@CORRECTION_LEVELS.register("token")
def token_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return log_ratio


@CORRECTION_LEVELS.register("sequence")
def sequence_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)  # log of the product over the row's tokens


@CORRECTION_LEVELS.register("geometric")
def geometric_level(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return mean.expand_as(log_ratio)


# rollout.correction: (ratio (N, C), cap, low) -> (weight (N, C), kept (N, C) bool, bounded (N, C) bool: where the
# rule acted, truncated or masked)
CORRECTIONS = Registry("off-policy correction")


@CORRECTIONS.register("none")
def no_correction(ratio: torch.Tensor, cap: float, low: float):
    ones = torch.ones_like(ratio, dtype=torch.bool)
    return torch.ones_like(ratio), ones, ~ones


@CORRECTIONS.register("tis")
def truncated(ratio: torch.Tensor, cap: float, low: float):
    bounded = ratio > cap
    return ratio.clamp(max=cap), torch.ones_like(bounded), bounded


@CORRECTIONS.register("mis")
def masked(ratio: torch.Tensor, cap: float, low: float):
    inside = (ratio <= cap) & (ratio >= low)
    return torch.where(inside, ratio, torch.zeros_like(ratio)), inside, ~inside


# the rules that remove tokens from the loss: which ones must be known before the update's first micro-batch
REJECTING = frozenset({"mis"})


@dataclass
class Correction:
    """weights (N, C) float, no gradient (1 off the mask); kept (N, C) bool: tokens that stay in the loss (True off
    the mask: the loss mask decides there); bounded (N, C) bool: masked tokens where the rule truncated or rejected."""

    weights: torch.Tensor
    kept: torch.Tensor
    bounded: torch.Tensor


def importance_correction(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                          rule: str = "tis", level: str = "token", cap: float = 2.0, low: float = 0.0) -> Correction:
    """The importance weight pi_prox / mu of every sampled token (see the module docstring), by `rule` at `level`.

    proximal_logp: the trainer's log-probs under the weights the update starts from (detached here);
    behaviour_logp: the sampler's log-probs (Rollout.logprobs); mask: the sampled tokens of each row (N, C).
    Example, one row of two tokens with log ratios (0.5, -0.1), C = 1.5: tis/token w = (1.5, 0.905);
    tis/sequence rho = e^0.4 = 1.492, w = (1.492, 1.492); mis/token keeps the second token only."""
    on = mask.bool()
    mask = mask.to(torch.float32)
    log_ratio = torch.where(on, proximal_logp.detach().float() - behaviour_logp.float(), 0.0)  # (N, C), 0 off the mask
    used = CORRECTION_LEVELS[level](log_ratio, mask)  # (N, C); exp() may overflow to inf: past every cap
    weights, kept, bounded = CORRECTIONS[rule](torch.exp(used), float(cap), float(low))
    return Correction(torch.where(on, weights, torch.ones_like(weights)), kept | ~on, bounded & on)


def resolve_correction(rule: str, level: str, cap: float, low: float,
                       tis_cap: float | None) -> tuple[str, str, float, float]:
    """(rule, level, cap, low) of the run: `rollout.tis_cap=C` (the older knob, rollout=vllm|server) is read as
    rollout.correction=tis rollout.correction_level=token rollout.correction_cap=C (the same weights); the
    config rules refuse setting both."""
    if tis_cap is not None and rule == "none":
        return "tis", "token", float(tis_cap), 0.0
    return rule, level, float(cap), float(low)


def needs_proximal_logprobs(updates_per_step: int, kl_in_reward: bool, rule: str) -> bool:
    """Whether the update recomputes the proximal log-probs (the loops' `old_logp`) in a pass before its first step.

    - more than one optimizer step per batch (epochs x mini-batches): every step's ratio is taken against the
      weights the update started from, which the first step changes;
    - the KL in the reward: the reward needs log pi_prox before any update;
    - a rejecting correction (mis): which tokens leave the loss, and so the loss normaliser, must be known before
      the first micro-batch.
    Otherwise (one optimizer step, tis or none) the update's own forward, detached, IS pi_prox: the weights have
    not moved yet when every micro-batch runs. Stale rows (rollout.max_staleness > 0, partial rollouts) change
    nothing here: their staleness is pi_prox vs mu, the importance weight, and the trust-region ratio
    pi_theta / pi_prox is 1 at the first step with or without a separate pass."""
    return updates_per_step > 1 or kl_in_reward or rule in REJECTING
