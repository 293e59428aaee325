"""Policy-gradient surrogate losses and their aggregation over tokens."""

from __future__ import annotations

import torch

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate loss (Schulman et al. 2017), with decoupled clip bounds (DAPO).

        ratio_t = exp(logp_t - old_logp_t)
        loss_t  = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)

    logp, old_logp, mask: (N, T); advantages: (N,) broadcast over tokens, or (N, T).
    Returns loss (N, T) (zero where mask is 0) and detached metrics: clip fractions over valid tokens,
    low (ratio < 1 - clip_low with A < 0) and high (ratio > 1 + clip_high with A > 0)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (N, 1)
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)  # (N, T)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped) * mask  # (N, T)
    with torch.no_grad():
        count = mask.sum().clamp(min=1.0)
        low = ((ratio < 1.0 - clip_low) & (advantages < 0)).to(mask.dtype) * mask
        high = ((ratio > 1.0 + clip_high) & (advantages > 0)).to(mask.dtype) * mask
        metrics = {
            "train/clip_frac_low": low.sum() / count,
            "train/clip_frac_high": high.sum() / count,
            "train/ratio_mean": (ratio * mask).sum() / count,
        }
    return loss, metrics


def aggregate(
    token_loss: torch.Tensor, mask: torch.Tensor, mode: str, total_tokens: float, total_seqs: float, max_len: int = 1
) -> torch.Tensor:
    """Reduce a per-token loss (N, T) to a scalar that sums exactly across micro-batches.

    The normalisers are those of the whole (mini-)batch, so summing this over micro-batches gives the
    batch loss itself, not a mean of micro-batch means:
      token-mean               sum_i sum_t l_it / total_tokens                (DAPO, Yu et al. 2025)
      seq-mean-token-mean      sum_i (sum_t l_it / |o_i|) / total_seqs        (GRPO paper)
      seq-mean-token-sum       sum_i sum_t l_it / total_seqs
      seq-mean-token-sum-norm  sum_i sum_t l_it / (total_seqs * max_len)      (Dr. GRPO constant normaliser)
    Fully masked rows contribute 0."""
    mask = mask.to(token_loss.dtype)
    masked = token_loss * mask
    if mode == "token-mean":
        return masked.sum() / max(total_tokens, 1.0)
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(dim=1).clamp(min=1.0)  # (N,)
        return (masked.sum(dim=1) / lengths).sum() / max(total_seqs, 1.0)
    if mode == "seq-mean-token-sum":
        return masked.sum() / max(total_seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        return masked.sum() / (max(total_seqs, 1.0) * max_len)
    raise ValueError(f"unknown loss aggregation '{mode}'; valid choices: {', '.join(LOSS_AGGREGATIONS)}")
