"""Policy-gradient surrogate losses and their aggregation over tokens."""

from __future__ import annotations

import torch

from rlx.registry import Registry

# algorithm.ratio_level, the importance ratio's level: fn(logp (N, T), old_logp (N, T), mask (N, T)) -> ratio (N, T)
RATIO_LEVELS = Registry("ratio level")
RATIO_LEVEL_REGISTRY = RATIO_LEVELS  # the name older code and the README use


@RATIO_LEVELS.register("token")
def _token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.exp(logp - old_logp)


@RATIO_LEVELS.register("sequence")
def _sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(logp.dtype)
    mean_log_ratio = ((logp - old_logp) * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.exp(mean_log_ratio).expand_as(logp)  # (N, T)


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                     level: str = "token") -> torch.Tensor:
    """Importance ratio pi / pi_old of each token, (N, T).

      "token"     r_t = exp(logp_t - old_logp_t)                                 (PPO, GRPO)
      "sequence"  s_i = exp(sum_t m_t (logp_t - old_logp_t) / |o_i|), the same for every token of
                  sequence i: the length-normalised sequence ratio of GSPO (Zheng et al. 2025).
                  Its gradient is s_i * mean_t grad logp_t. A fully masked row gets ratio 1.
    logp, old_logp, mask: (N, T)."""
    return RATIO_LEVELS[level](logp, old_logp, mask)  # an unknown level: one line listing the valid ones


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate loss (Schulman et al. 2017), with decoupled clip bounds (DAPO).

        ratio_t = exp(logp_t - old_logp_t)        (or GSPO's sequence ratio, see `importance_ratio`)
        loss_t  = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)
    dual_clip = c > 1 (Ye et al. 2020, "Mastering Complex Control in MOBA Games") also bounds the loss
    of negative advantages, whose unclipped ratio can grow without limit:
        loss_t  = min(loss_t, -c * A)   where A < 0
    Example, A = -1, ratio 5, clip 0.2, c = 3: PPO loss = -min(-5, -1.2) = 5; dual clip -> min(5, 3) = 3.

    logp, old_logp, mask: (N, T); advantages: (N,) broadcast over tokens, or (N, T).
    Returns loss (N, T) (zero where mask is 0) and detached metrics: clip fractions over valid tokens,
    low (ratio < 1 - clip_low with A < 0) and high (ratio > 1 + clip_high with A > 0), the fraction
    hitting the dual clip, the mean ratio, and approx_kl = mean of (ratio - 1) - log ratio (k3 of
    KL(pi_old || pi), Schulman 2020) between the sampling and the current policy."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (N, 1)
    mask = mask.to(logp.dtype)
    ratio = importance_ratio(logp, old_logp, mask, ratio_level)  # (N, T)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)  # (N, T)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    loss = loss * mask
    with torch.no_grad():
        count = mask.sum().clamp(min=1.0)
        low = ((ratio < 1.0 - clip_low) & (advantages < 0)).to(mask.dtype) * mask
        high = ((ratio > 1.0 + clip_high) & (advantages > 0)).to(mask.dtype) * mask
        log_ratio = (logp - old_logp).detach()
        metrics = {
            "train/clip_frac_low": low.sum() / count,
            "train/clip_frac_high": high.sum() / count,
            "train/dual_clip_frac": (dual.to(mask.dtype) * mask).sum() / count,
            "train/ratio_mean": (ratio * mask).sum() / count,
            "train/approx_kl": ((torch.exp(log_ratio) - 1.0 - log_ratio) * mask).sum() / count,
        }
    return loss, metrics


def entropy_threshold(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor | None:
    """The entropy of the round(rho x M)-th highest of the M valid tokens (at least one kept): the
    forking-token threshold. None when nothing is valid. With several processes, pass the gathered
    global batch so every process uses the one threshold a single process would. entropy, mask: (N, T)."""
    values = entropy[mask.bool()]
    if values.numel() == 0:
        return None
    keep_count = max(1, int(round(rho * values.numel())))
    return values.topk(keep_count).values.min()


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float,
                     threshold: torch.Tensor | None = None) -> torch.Tensor:
    """Keep only the top-rho fraction of valid tokens by entropy ("forking tokens", Wang et al. 2025,
    "Beyond the 80/20 Rule": rho = 0.2 matches or beats training on all tokens).

    The threshold is the (1 - rho) quantile of the valid tokens' entropies (`entropy_threshold`, or the
    given one, e.g. computed over all processes); tokens at or above it stay. rho = 1 keeps every valid
    token. Example: entropies [0.1, 0.9, 0.5, 0.3], rho = 0.5 -> keep the two highest: [F, T, T, F].
    entropy, mask: (N, T). Returns (N, T) bool (False where mask is 0)."""
    valid = mask.bool()
    if rho >= 1.0 or not valid.any():
        return valid
    if threshold is None:
        threshold = entropy_threshold(entropy, mask, rho)
    return valid & (entropy >= threshold)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped value loss of PPO (as in OpenAI baselines / Ziegler et al. 2019):

        l_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old - c, V_old + c) - R_t)^2)
    clip None: l_t = 0.5 * (V_t - R_t)^2. Example: V = 2, V_old = 1, R = 0, c = 0.5: unclipped 4,
    clipped (1.5 - 0)^2 = 2.25 -> max 4 -> l = 2 (the clip only ever raises the loss).
    values, old_values, returns, mask: (N, T). Returns (N, T) (0 where mask is 0) and the fraction
    of valid tokens where the clipped term was larger."""
    mask = mask.to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped * mask, {"train/value_clip_frac": torch.zeros(())}
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped, clipped) * mask
    with torch.no_grad():
        frac = ((clipped > unclipped).to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {"train/value_clip_frac": frac}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over valid tokens: 1 is a perfect critic, 0 no better than a constant,
    negative worse. Var(R) = 0 returns 0. Example: R = [1, 2, 3], V = [1, 2, 2] -> residual [0, 0, 1],
    Var = 1/3 (unbiased); Var(R) = 1 -> 1 - 1/3 = 0.6667."""
    mask = mask.bool()
    r, v = returns[mask], values[mask]
    if r.numel() < 2:
        return 0.0
    var = r.var()
    return 0.0 if var.item() == 0 else (1.0 - (r - v).var() / var).item()


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
    aggregation = LOSS_AGGREGATIONS[mode]  # an unknown mode: one line listing the valid ones
    mask = mask.to(token_loss.dtype)
    return aggregation(token_loss * mask, mask, max(total_tokens, 1.0), max(total_seqs, 1.0), max_len)


# algorithm.loss_agg: fn(masked token loss (N, T), mask (N, T), total_tokens, total_seqs, max_len) -> scalar
LOSS_AGGREGATIONS = Registry("loss aggregation")
AGGREGATIONS = LOSS_AGGREGATIONS  # the name older code and the README use


@LOSS_AGGREGATIONS.register("token-mean")
def _token_mean(masked, mask, tokens, seqs, max_len):
    return masked.sum() / tokens


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(masked, mask, tokens, seqs, max_len):
    return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum() / seqs


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(masked, mask, tokens, seqs, max_len):
    return masked.sum() / seqs


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(masked, mask, tokens, seqs, max_len):
    return masked.sum() / (seqs * max_len)
