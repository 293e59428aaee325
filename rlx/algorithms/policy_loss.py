"""The policy loss of the policy-gradient and PPO loops: an object built once from the settings, called per micro-batch.

The shape of torchtune's `GRPOLoss`: a small class that binds the knobs (`from_settings`) and whose `__call__` takes
the step's tensors and returns (loss, metrics). It holds no math of its own; each term is a pure function:

    token_loss_t = -w_t min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A)     clipped_surrogate (losses.py),
                                                                                 dual clip and ratio level there too
                   + band_weight * p_t                                           entropy_band_penalty (EPO, agents)
                   + kl_coef * KL_t * m_t  (kl_in = loss)  - entropy_coef * H_t  penalized_token_loss (kl.py)
    loss         = aggregate(token_loss, mask, loss_agg, mini-batch normalisers)  aggregate (losses.py)

w_t: the off-policy correction's weight pi_prox / mu (rollout.correction, offpolicy.py), computed by the loop with
`PolicyLoss.correction` (a rejecting rule must act on the masks before the first micro-batch). What moves between
steps is an argument, not an attribute: the KL coefficient (an adaptive controller moves it) and the entropy band
(its weight and history move every step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.algorithms.entropy_band import BandTerm
from rlx.algorithms.kl import PenaltyTerms, penalized_token_loss
from rlx.algorithms.losses import aggregate, clipped_surrogate
from rlx.algorithms.offpolicy import REJECTING, Correction, importance_correction, resolve_correction


@dataclass(frozen=True)
class OffPolicyCorrection:
    """The off-policy correction of the run (rollout.correction, _level, _cap, _low; the older rollout.tis_cap read
    as tis at token level): rule none | tis | mis, and its call computing the weights pi_prox / mu."""

    rule: str
    level: str
    cap: float
    low: float

    @classmethod
    def from_settings(cls, rollout) -> OffPolicyCorrection:
        return cls(*resolve_correction(rollout.correction, rollout.correction_level, rollout.correction_cap,
                                       rollout.correction_low, getattr(rollout, "tis_cap", None)))

    @property
    def active(self) -> bool:
        return self.rule != "none"

    @property
    def rejecting(self) -> bool:
        """mis: tokens (or rows) leave the loss and its normaliser, so the masks must be known before the update."""
        return self.rule in REJECTING

    def __call__(self, proximal_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> Correction:
        """importance_correction at this run's rule and level; (N, C) each."""
        return importance_correction(proximal_logp, sampler_logp, mask, self.rule, self.level, self.cap, self.low)


@dataclass(frozen=True)
class PolicyInputs:
    """The tensors of one micro-batch the policy loss reads, on the model's device: log-probs with gradient and the
    proximal ("old", detached) ones (n, C), advantages (n,) or (n, C), the tokens of the policy-gradient term and of
    the loss (n, C), token entropies (n, C), the reference's log-probs (n, C) or None, the correction's weights (n, C)
    or None, each token's turn index (n, C) for the entropy band or None, and the mini-batch's normalisers (its
    token and sequence counts over every process: the loss sums exactly over micro-batches)."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    pg_mask: torch.Tensor
    loss_mask: torch.Tensor
    entropy: torch.Tensor
    ref_logp: torch.Tensor | None
    is_weights: torch.Tensor | None
    turns: torch.Tensor | None
    tokens: float
    seqs: float


@dataclass(frozen=True)
class PolicyLoss:
    """The policy term of the update, its knobs bound once: clip (low, high), dual clip, ratio level (token |
    sequence), aggregation (loss_agg) with the constant normaliser's width (loss_width: the longest row), the KL
    and entropy terms (PenaltyTerms) and the off-policy correction."""

    clip_low: float
    clip_high: float
    dual_clip: float | None
    ratio_level: str
    loss_agg: str
    loss_width: int
    penalty: PenaltyTerms
    correction: OffPolicyCorrection

    @classmethod
    def from_settings(cls, algo, rollout, loss_width: int) -> PolicyLoss:
        """From the algorithm section (clip_low, clip_high, dual_clip, ratio_level, loss_agg, kl_estimator, kl_in,
        entropy_coef) and the rollout section (the correction)."""
        return cls(algo.clip_low, algo.clip_high, algo.dual_clip, algo.ratio_level, algo.loss_agg, int(loss_width),
                   PenaltyTerms.of(algo), OffPolicyCorrection.from_settings(rollout))

    def __call__(self, x: PolicyInputs, kl_coef: float, band: BandTerm | None = None) -> tuple[torch.Tensor, dict]:
        """The micro-batch's loss (a scalar that sums exactly over the mini-batch's micro-batches) and its metrics:
        clipped_surrogate's (train/clip_frac_low, ...), and, detached (n, C), "kl" (KL_t, with a reference) and
        "band_penalty" (p_t, with a band). kl_coef: this step's KL coefficient; band: this step's entropy band."""
        token_loss, metrics = clipped_surrogate(x.logp, x.old_logp, x.advantages, x.pg_mask, self.clip_low,
                                                self.clip_high, self.dual_clip, self.ratio_level)  # (n, C)
        if x.is_weights is not None:  # w = pi_prox / mu; rejected tokens are already out of the masks
            token_loss = token_loss * x.is_weights
        if band is not None:  # EPO: each token's entropy kept in a band around its turn's history
            penalty = band.penalty(x.entropy, x.turns)  # (n, C)
            token_loss = token_loss + band.weight * penalty
            metrics["band_penalty"] = penalty.detach()
        token_loss, kl = penalized_token_loss(token_loss, x.logp, x.ref_logp, x.entropy, x.loss_mask, kl_coef,
                                              self.penalty)  # (n, C) each
        if kl is not None:
            metrics["kl"] = kl.detach()
        return aggregate(token_loss, x.loss_mask, self.loss_agg, x.tokens, x.seqs, self.loss_width), metrics
