"""Token log-probabilities and entropies from logits."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full log-softmax.

    logits: (N, T, V); targets: (N, T). Returns (N, T) = logit[target] - logsumexp(logits)."""
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, T)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v per position. logits: (N, T, V). Returns (N, T)."""
    log_norm = torch.logsumexp(logits, dim=-1, keepdim=True)
    probs = torch.exp(logits - log_norm)
    return (log_norm.squeeze(-1) - (probs * logits).sum(-1))
