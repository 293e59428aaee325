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


def _chunk_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (n,) of `targets` and detached entropies (n,) (zeros unless with_entropy) for one chunk."""
    logits = hidden @ weight.t()  # (n, V)
    if bias is not None:
        logits = logits + bias
    logits = logits.float()
    log_norm = torch.logsumexp(logits, dim=-1)  # (n,)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    if not with_entropy:
        return logp, torch.zeros_like(log_norm).detach()
    with torch.no_grad():
        probs = torch.exp(logits - log_norm.unsqueeze(-1))
        entropy = log_norm - (probs * logits).sum(-1)
    return logp, entropy


def chunked_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h W^T + b)[target] for each row of `hidden`, never holding more than chunk_tokens x V logits.

    hidden: (M, H) final hidden states; weight: (V, H) output projection; targets: (M,).
    The result equals token_logprobs(hidden @ W^T + b, targets); the logits of each chunk are recomputed
    in the backward pass (activation checkpointing, Chen et al. 2016) instead of being stored, so the
    peak memory is O(chunk_tokens x V) rather than O(M x V), at the cost of one extra (chunk, H) x (H, V)
    product per chunk. Entropy H = logsumexp(z) - sum_v softmax(z)_v z_v is returned without gradient.
    Returns logp (M,) and entropy (M,) or None."""
    from torch.utils.checkpoint import checkpoint

    logps, entropies = [], []
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for lo in range(0, hidden.shape[0], chunk_tokens):
        args = (hidden[lo : lo + chunk_tokens], weight, bias, targets[lo : lo + chunk_tokens], with_entropy)
        if needs_grad:
            logp, entropy = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            logp, entropy = _chunk_logprobs(*args)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies).detach() if with_entropy else None)
