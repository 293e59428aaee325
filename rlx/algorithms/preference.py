"""Offline preference losses (DPO family, SimPO, ORPO) and the Bradley-Terry reward-model loss.

Pure tensor math: every function takes flat tensors and floats and returns a per-pair loss of
shape (B,) (the loop reduces it, usually with `.mean()`), plus a dict of detached scalar metrics.

Conventions shared by every function here:

* Inputs are log-probabilities of the completion tokens, summed over the completion of each
  pair (prompt tokens excluded): `policy_chosen_logps[i] = sum_t log pi(y_w,t | x, y_w,<t)`, (B,).
* `lengths` are the number of completion tokens each sum ran over, (B,), int or float, > 0.
* For reference-based losses the log-ratio of a completion is `pi - ref` (summed log-probs of the
  policy minus those of the frozen reference), and the quantity every loss is built on is
      h = (pi_c - ref_c) - (pi_r - ref_r)
  i.e. how much more the policy has moved towards the chosen completion than the rejected one.
  With `length_normalize=True` each log-ratio is divided by its completion length first:
      h = (pi_c - ref_c) / |y_c| - (pi_r - ref_r) / |y_r|.
* The implicit reward of a completion is `beta * (pi - ref)` (normalized the same way), so
  `beta * h = chosen_reward - rejected_reward` is the DPO logit. Reference-free losses define
  their own reward (see `simpo_loss` and `orpo_odds_ratio_loss`).
* -log sigmoid(z) = softplus(-z) is used throughout because it is finite for any z, and the
  identity  -log sigmoid(-z) = -log sigmoid(z) + z  is what most of the hand-derived test numbers
  lean on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlx.registry import Registry, RegistryView

_LABEL_SMOOTHING_LOSSES = {"cdpo", "robust"}


# ---------------------------------------------------------------------------------------------
# One small function per loss type. Reference-based ones take h (log-ratio difference, (B,)).
# ---------------------------------------------------------------------------------------------


def dpo_loss(logratio_diff: Tensor, beta: float) -> Tensor:
    """Sigmoid DPO loss:  L = -log sigmoid(beta * h).  Rafailov et al. 2023, eq. 7.

    Derivation used by the tests:
      * h = 0                 -> L = log 2 = 0.693147
      * dL/dh = -beta * sigmoid(-beta * h); as beta -> 0 this is -beta/2 for any finite h, so the
        gradient on the chosen log-prob is -beta/2 and on the rejected one +beta/2 (descent raises
        chosen, lowers rejected) while the loss itself tends to log 2.
    logratio_diff: h, (B,).  Returns (B,).
    """
    return F.softplus(-beta * logratio_diff)


def cdpo_loss(logratio_diff: Tensor, beta: float, label_smoothing: float) -> Tensor:
    """Conservative DPO:  L = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h).

    Mitchell 2023, "A note on DPO with noisy preferences & relationship to IPO": the expected DPO
    loss when each label is believed to be flipped with probability eps (soft targets). Using
    -log sigmoid(-z) = -log sigmoid(z) + z this is  L = DPO(h) + eps * beta * h, so it stops
    pushing once sigmoid(beta h) = 1 - eps instead of driving h to infinity.
    eps = 0 is plain DPO; eps = 0.5 makes L symmetric in h (no preference at all).
    logratio_diff: h, (B,).  Returns (B,).
    """
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"cdpo needs 0 <= label_smoothing <= 0.5, got {label_smoothing}")
    logits = beta * logratio_diff
    return (1.0 - label_smoothing) * F.softplus(-logits) + label_smoothing * F.softplus(logits)


def robust_dpo_loss(logratio_diff: Tensor, beta: float, label_smoothing: float) -> Tensor:
    """Robust DPO:  L = [(1 - eps) l(h) - eps l(-h)] / (1 - 2 eps),  l(h) = -log sigmoid(beta h).

    Chowdhury, Kini & Natarajan 2024, "Provably Robust DPO". eps is the known rate at
    which labels were flipped. This is an unbiased estimator of the clean loss: if the true pair
    is (w, l) and the observed one is (w, l) w.p. 1 - eps and (l, w) w.p. eps, then
        E[L] = [((1-eps)^2 - eps^2) l(h) + (eps(1-eps) - eps(1-eps)) l(-h)] / (1 - 2 eps) = l(h).
    Note the minus sign: unlike cDPO (an average of both directions) this subtracts the flipped
    term. With the identity l(-h) = l(h) + beta h it simplifies to
        L = l(h) - eps * beta * h / (1 - 2 eps),
    which is not bounded below in h; that is the price of unbiasedness.
    Needs 0 <= eps < 0.5 (the estimator divides by 1 - 2 eps).
    logratio_diff: h, (B,).  Returns (B,).
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(
            f"robust DPO needs 0 <= label_smoothing < 0.5 (it divides by 1 - 2*eps), "
            f"got {label_smoothing}"
        )
    logits = beta * logratio_diff
    eps = label_smoothing
    return ((1.0 - eps) * F.softplus(-logits) - eps * F.softplus(logits)) / (1.0 - 2.0 * eps)


def ipo_loss(logratio_diff: Tensor, beta: float) -> Tensor:
    """IPO:  L = (h - 1 / (2 beta))^2.  Azar et al. 2023 (their tau is our beta).

    A squared loss that regresses h onto the target 1/(2 beta) instead of pushing it to infinity:
    dL/dh = 2 (h - 1/(2 beta)) is zero exactly at h = 1/(2 beta), the minimum (L = 0 there).
    h is whatever `preference_loss` built: per-pair sums by default, per-token averages with
    `length_normalize=True`. The IPO paper states the loss on sequence log-likelihoods (sums);
    many implementations average per token, which changes the scale of h and therefore what a
    given beta means (with sums, 1/(2 beta) is a target for the whole completion).
    logratio_diff: h, (B,).  Returns (B,).
    """
    return (logratio_diff - 1.0 / (2.0 * beta)) ** 2


def hinge_loss(logratio_diff: Tensor, beta: float) -> Tensor:
    """SLiC hinge:  L = relu(1 - beta * h).  Zhao et al. 2023 (SLiC-HF), calibration loss.

    SLiC's rank-calibration loss is max(0, delta - log P(y_w) + log P(y_l)); here it is applied to
    the reference log-ratios and scaled by beta, i.e. beta * relu(1/beta - h): the margin is
    delta = 1/beta in log-ratio units. Zero loss and zero gradient once beta * h >= 1.
    logratio_diff: h, (B,).  Returns (B,).
    """
    return F.relu(1.0 - beta * logratio_diff)


def simpo_loss(chosen_rewards: Tensor, rejected_rewards: Tensor, gamma: float) -> Tensor:
    """SimPO:  L = -log sigmoid(r_c - r_r - gamma),  r = beta * log pi(y|x) / |y|.

    Meng, Xia & Chen 2024, "SimPO". The reward is the length-averaged log-likelihood of
    the policy itself (no reference model), scaled by beta, and gamma is the target reward
    margin in the same units as r (absolute gamma, as in the paper's equation). The released
    SimPO code is parameterized by the ratio gamma/beta instead; pass gamma = ratio * beta.
    Because r only depends on logp / |y|, doubling both a completion's summed log-prob and its
    length leaves the loss unchanged.
    chosen_rewards, rejected_rewards: r_c, r_r, (B,).  Returns (B,).
    """
    return F.softplus(-(chosen_rewards - rejected_rewards - gamma))


def log_odds(avg_logps: Tensor) -> Tensor:
    """log odds(y) = log p - log(1 - p) with log p = `avg_logps` (length-averaged log-prob), (B,).

    Computed as avg_logps - log1mexp(avg_logps), which stays finite as p -> 1 where the naive
    log(1 - exp(avg_logps)) underflows to log(0) (e.g. avg_logps = -1e-8 in float32, where
    exp(-1e-8) rounds to exactly 1). Inputs are clamped just below 0 (to -smallest normal float)
    so that a completion the model is certain of gets a large finite log odds (~87 in float32)
    instead of inf.
    """
    tiny = torch.finfo(avg_logps.dtype).tiny
    avg_logps = avg_logps.clamp(max=-tiny)
    return avg_logps - _log1mexp(avg_logps)


def _log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x < 0, accurate everywhere (Maechler 2012, "Accurately computing
    log(1 - exp(-|a|))"): log(-expm1(x)) near 0, log1p(-exp(x)) for x < -log 2.
    Each branch sees inputs clamped to its own range, so the branch torch.where discards cannot
    produce inf/nan gradients (0 * inf = nan would otherwise leak through the backward pass).
    """
    log2 = math.log(2.0)
    near_zero = x > -log2
    near_branch = torch.log(-torch.expm1(x.clamp(min=-log2)))
    far_branch = torch.log1p(-torch.exp(x.clamp(max=-log2)))
    return torch.where(near_zero, near_branch, far_branch)


def orpo_odds_ratio_loss(
    chosen_log_odds: Tensor, rejected_log_odds: Tensor, weight: float
) -> Tensor:
    """ORPO odds-ratio term:  L_OR = weight * -log sigmoid(log odds(y_w) - log odds(y_l)).

    Hong, Lee & Thorne 2024, "ORPO": L_ORPO = L_SFT + lambda * L_OR, with
    odds(y) = P(y|x) / (1 - P(y|x)) and P(y|x) = exp(mean token log-prob). `weight` is lambda;
    this function returns lambda * L_OR only, and the caller adds L_SFT (`sft_nll`, weight 1).
    Example: P(y_w) = 0.5 (log odds 0) and P(y_l) = 0.2 (odds 1/4) give
    L_OR = log(1 + 1/4) = log 1.25 = 0.223144.
    chosen_log_odds, rejected_log_odds: from `log_odds`, (B,).  Returns (B,).
    """
    return weight * F.softplus(-(chosen_log_odds - rejected_log_odds))


# ---------------------------------------------------------------------------------------------
# Dispatcher
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Registries: a new loss is one function above plus one registered entry here (and a YAML preset)
# ---------------------------------------------------------------------------------------------

REFERENCE_LOSSES = Registry("reference-based preference loss")
"""Reference-based losses: fn(h, beta, label_smoothing) -> (B,) with h the log-ratio difference."""

REFERENCE_FREE_LOSSES = Registry("reference-free preference loss")
"""Reference-free losses: fn(chosen_avg, rejected_avg, beta, gamma) -> (losses (B,), chosen_rewards,
rejected_rewards), from the per-token average policy log-probs."""

PREFERENCE_LOSSES = RegistryView("preference loss_type", REFERENCE_LOSSES, REFERENCE_FREE_LOSSES)
"""Valid values of `loss_type` in `preference_loss` (both registries, live)."""

REFERENCE_FREE = REFERENCE_FREE_LOSSES.keys()
"""Loss types that never look at a reference model (the loop can skip the reference forward); a live set."""


@REFERENCE_LOSSES.register("dpo")
def _dpo(h: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return dpo_loss(h, beta)


@REFERENCE_LOSSES.register("cdpo")
def _cdpo(h: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return cdpo_loss(h, beta, label_smoothing)


@REFERENCE_LOSSES.register("robust")
def _robust(h: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return robust_dpo_loss(h, beta, label_smoothing)


@REFERENCE_LOSSES.register("ipo")
def _ipo(h: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return ipo_loss(h, beta)


@REFERENCE_LOSSES.register("hinge")
def _hinge(h: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return hinge_loss(h, beta)


@REFERENCE_FREE_LOSSES.register("simpo")
def _simpo(chosen_avg: Tensor, rejected_avg: Tensor, beta: float, gamma: float):
    chosen_rewards, rejected_rewards = beta * chosen_avg, beta * rejected_avg
    return simpo_loss(chosen_rewards, rejected_rewards, gamma), chosen_rewards, rejected_rewards


@REFERENCE_FREE_LOSSES.register("orpo")
def _orpo(chosen_avg: Tensor, rejected_avg: Tensor, beta: float, gamma: float):
    chosen_rewards, rejected_rewards = log_odds(chosen_avg), log_odds(rejected_avg)
    return orpo_odds_ratio_loss(chosen_rewards, rejected_rewards, weight=beta), chosen_rewards, rejected_rewards


@dataclass(frozen=True)
class PreferenceLoss:
    """Which preference loss and its knobs (see `preference_loss`): `loss_type` (PREFERENCE_LOSSES), `beta`,
    cdpo/robust's `label_smoothing`, SimPO's `gamma`, and `length_normalize` (reference-based losses)."""

    loss_type: str
    beta: float
    label_smoothing: float = 0.0
    gamma: float = 0.0
    length_normalize: bool = False


def preference_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    *,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
    **loss,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-pair preference loss of `loss_type`, (B,), and detached batch-mean metrics.

    loss: the fields of PreferenceLoss by keyword: loss_type and beta (required), label_smoothing, gamma,
    length_normalize.

    loss_type (see PREFERENCE_LOSSES):
      "dpo"    -log sigmoid(beta h)                               Rafailov et al. 2023
      "cdpo"   label-smoothed DPO, eps = label_smoothing          Mitchell 2023
      "robust" unbiased noisy-label DPO, eps = label_smoothing    Chowdhury et al. 2024
      "ipo"    (h - 1/(2 beta))^2                                 Azar et al. 2023
      "hinge"  relu(1 - beta h)                                   Zhao et al. 2023 (SLiC)
      "simpo"  -log sigmoid(beta/|y_w| pi_w - beta/|y_l| pi_l - gamma), no reference
                                                                  Meng et al. 2024
      "orpo"   beta * -log sigmoid(log odds(y_w) - log odds(y_l)), no reference; beta is ORPO's
               lambda, the caller adds `sft_nll` for the full ORPO loss   Hong et al. 2024
    with h = (pi_c - ref_c) - (pi_r - ref_r) on the summed log-probs.

    length_normalize=True (reference-based losses only) divides each log-ratio by its completion
    length before forming h: length-normalized DPO as used in Tulu 3 (Lambert et al. 2024), the
    reference-based analogue of SimPO's averaged reward (Meng et al. 2024 motivate averaging as a
    guard against length exploitation). Not to be confused with R-DPO (Park et al. 2024), which
    adds an explicit length-difference penalty instead. simpo and orpo always average per token
    and ignore the flag.

    Arguments:
      policy_*_logps: summed completion log-probs under the policy, (B,), with grad.
      ref_*_logps: the same under the frozen reference, (B,); required by reference-based losses
        and must be None for simpo/orpo (a reference forward pass there would be wasted work).
      beta: > 0; inverse temperature (DPO family, SimPO) or ORPO's lambda.
      label_smoothing: eps for cdpo/robust; must stay 0 for every other loss.
      gamma: SimPO's absolute target margin; must stay 0 for every other loss.
      chosen_lengths, rejected_lengths: completion token counts, (B,); required by simpo, orpo
        and length_normalize=True, ignored otherwise.

    Metrics (each a 0-dim detached tensor, mean over the batch):
      pref/chosen_reward, pref/rejected_reward: beta * log-ratio (normalized if requested) for
        reference-based losses; SimPO's r = beta * logp / |y|; ORPO's log odds(y) (not scaled by
        lambda, so margin is the sigmoid argument).
      pref/margin: mean(chosen_reward - rejected_reward).
      pref/accuracy: fraction of pairs with chosen_reward > rejected_reward (ties count as wrong).
      pref/chosen_logp, pref/rejected_logp: mean summed policy log-probs.
    """
    spec = PreferenceLoss(**loss)
    _check_preference_loss(spec, policy_chosen_logps, policy_rejected_logps)
    if spec.loss_type in REFERENCE_FREE_LOSSES:
        losses, chosen_rewards, rejected_rewards = _reference_free_loss(
            spec, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
            (chosen_lengths, rejected_lengths))
    else:
        losses, chosen_rewards, rejected_rewards = _reference_based_loss(
            spec, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
            (chosen_lengths, rejected_lengths))

    with torch.no_grad():
        chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
        metrics = {
            "pref/accuracy": (chosen_rewards > rejected_rewards).float().mean(),
            "pref/margin": (chosen_rewards - rejected_rewards).mean(),
            "pref/chosen_reward": chosen_rewards.mean(),
            "pref/rejected_reward": rejected_rewards.mean(),
            "pref/chosen_logp": policy_chosen_logps.detach().mean(),
            "pref/rejected_logp": policy_rejected_logps.detach().mean(),
        }
    return losses, metrics


def _check_preference_loss(spec: PreferenceLoss, policy_chosen_logps: Tensor, policy_rejected_logps: Tensor) -> None:
    """The loss type is known, beta positive, label_smoothing and gamma set only where used, and the chosen and
    rejected log-probs of the same shape; else ValueError."""
    loss_type = spec.loss_type
    if loss_type not in REFERENCE_LOSSES and loss_type not in REFERENCE_FREE_LOSSES:
        raise ValueError(
            f"unknown preference loss_type {loss_type!r}; "
            f"valid choices: {', '.join([*REFERENCE_LOSSES, *REFERENCE_FREE_LOSSES])}"
        )
    if spec.beta <= 0:
        raise ValueError(f"beta must be > 0, got {spec.beta}")
    if spec.label_smoothing != 0.0 and loss_type not in _LABEL_SMOOTHING_LOSSES:
        raise ValueError(
            f"label_smoothing is only used by {sorted(_LABEL_SMOOTHING_LOSSES)}, "
            f"got label_smoothing={spec.label_smoothing} with loss_type={loss_type!r}"
        )
    if spec.gamma != 0.0 and loss_type != "simpo":
        raise ValueError(
            f"gamma (SimPO target margin) is only used by simpo, got loss_type={loss_type!r}"
        )
    if policy_chosen_logps.shape != policy_rejected_logps.shape:
        raise ValueError(
            f"chosen and rejected log-probs differ in shape: "
            f"{tuple(policy_chosen_logps.shape)} vs {tuple(policy_rejected_logps.shape)}"
        )


def _reference_free_loss(spec: PreferenceLoss, policy_chosen_logps: Tensor, policy_rejected_logps: Tensor,
                         ref_chosen_logps: Tensor | None, ref_rejected_logps: Tensor | None,
                         lengths: tuple[Tensor | None, Tensor | None]) -> tuple[Tensor, Tensor, Tensor]:
    """(losses, chosen rewards, rejected rewards) of a reference-free loss, from the per-token average policy
    log-probs (lengths: the chosen and rejected completion token counts); the reference log-probs must be None."""
    loss_type = spec.loss_type
    if ref_chosen_logps is not None or ref_rejected_logps is not None:
        raise ValueError(
            f"{loss_type} is reference-free: pass ref_chosen_logps=None and "
            f"ref_rejected_logps=None (and skip the reference model)"
        )
    chosen_avg = _per_token(policy_chosen_logps, lengths[0], "chosen_lengths", loss_type)
    rejected_avg = _per_token(
        policy_rejected_logps, lengths[1], "rejected_lengths", loss_type
    )
    return REFERENCE_FREE_LOSSES[loss_type](chosen_avg, rejected_avg, spec.beta, spec.gamma)


def _reference_based_loss(spec: PreferenceLoss, policy_chosen_logps: Tensor, policy_rejected_logps: Tensor,
                          ref_chosen_logps: Tensor | None, ref_rejected_logps: Tensor | None,
                          lengths: tuple[Tensor | None, Tensor | None]) -> tuple[Tensor, Tensor, Tensor]:
    """(losses, chosen rewards, rejected rewards) of a reference-based loss of the log-ratio difference h, each
    log-ratio divided by its completion length (lengths) when spec.length_normalize."""
    loss_type = spec.loss_type
    if ref_chosen_logps is None or ref_rejected_logps is None:
        raise ValueError(
            f"{loss_type} needs the reference model's log-probs (ref_chosen_logps and "
            f"ref_rejected_logps); only {sorted(REFERENCE_FREE)} are reference-free"
        )
    chosen_logratios = policy_chosen_logps - ref_chosen_logps  # (B,)
    rejected_logratios = policy_rejected_logps - ref_rejected_logps  # (B,)
    if spec.length_normalize:
        what = f"{loss_type} with length_normalize=True"
        chosen_logratios = _per_token(chosen_logratios, lengths[0], "chosen_lengths", what)
        rejected_logratios = _per_token(
            rejected_logratios, lengths[1], "rejected_lengths", what
        )
    logratio_diff = chosen_logratios - rejected_logratios  # h, (B,)
    chosen_rewards, rejected_rewards = spec.beta * chosen_logratios, spec.beta * rejected_logratios
    return REFERENCE_LOSSES[loss_type](logratio_diff, spec.beta, spec.label_smoothing), chosen_rewards, rejected_rewards


def _per_token(values: Tensor, lengths: Tensor | None, name: str, needed_by: str) -> Tensor:
    """values / lengths, with a clear error when lengths are missing or not positive."""
    if lengths is None:
        raise ValueError(f"{needed_by} needs {name} (completion token counts, shape (B,))")
    lengths = torch.as_tensor(lengths, device=values.device).to(values.dtype)
    if lengths.shape != values.shape:
        raise ValueError(f"{name} has shape {tuple(lengths.shape)}, expected {tuple(values.shape)}")
    if not bool((lengths > 0).all()):
        raise ValueError(f"{name} must all be > 0, got {lengths.tolist()}")
    return values / lengths


# ---------------------------------------------------------------------------------------------
# Auxiliary SFT term and reward-model loss
# ---------------------------------------------------------------------------------------------


def sft_nll(chosen_logps: Tensor, chosen_lengths: Tensor) -> Tensor:
    """Length-normalized NLL of the chosen completion:  -log pi(y_w|x) / |y_w|, (B,).

    The SFT term of RPO (Pang et al. 2024, "Iterative Reasoning Preference Optimization",
    L = L_DPO + alpha * NLL) and of ORPO (L_SFT, weight 1). The loop adds it with its weight.
    Example: summed log-prob -6 over 3 tokens -> 2.0 nats per token.
    chosen_logps: summed completion log-probs, (B,).  chosen_lengths: token counts, (B,).
    """
    return -_per_token(chosen_logps, chosen_lengths, "chosen_lengths", "sft_nll")


def bradley_terry_loss(
    chosen_scores: Tensor,
    rejected_scores: Tensor,
    margin: Tensor | None = None,
    center_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Pairwise reward-model loss, (B,), and detached batch-mean metrics.

        L = -log sigmoid(s_c - s_r - m) + center_coef * (s_c + s_r)^2

    The first term is the Bradley-Terry likelihood (Ouyang et al. 2022) with the per-pair margin
    m of Llama 2 (Touvron et al. 2023: larger m for pairs rated "significantly better").
    The second is the reward-centering auxiliary loss of Eisenstein et al. 2023 ("Helping or
    Herding?"): BT is invariant to adding a constant to every score, and the penalty pins that
    free constant so scores of a pair sum to about 0. Its gradient is 2 c (s_c + s_r) on each score.
    Example: s_c = 2, s_r = 1, m = 1, c = 0.01 -> log 2 + 0.01 * 9 = 0.783147.
    chosen_scores, rejected_scores: scalar reward-model outputs, (B,).  margin: (B,) or None.
    Metrics: rm/accuracy (s_c > s_r), rm/margin (mean s_c - s_r, without m), rm/chosen_score,
    rm/rejected_score.
    """
    score_diff = chosen_scores - rejected_scores  # (B,)
    logits = score_diff if margin is None else score_diff - margin
    losses = F.softplus(-logits)
    if center_coef != 0.0:
        losses = losses + center_coef * (chosen_scores + rejected_scores) ** 2
    with torch.no_grad():
        score_diff = score_diff.detach()
        metrics = {
            "rm/accuracy": (score_diff > 0).float().mean(),
            "rm/margin": score_diff.mean(),
            "rm/chosen_score": chosen_scores.detach().mean(),
            "rm/rejected_score": rejected_scores.detach().mean(),
        }
    return losses, metrics
