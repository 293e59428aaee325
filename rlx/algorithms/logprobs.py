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


class _ChunkedLinearLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b)[target], chunk by chunk; the backward pass recomputes each chunk's logits.

    d logp_t / d z_t = onehot(target_t) - softmax(z_t), so with upstream gradients g (M,):
    dL/dz = g * (onehot - p),  dL/dh = dL/dz W,  dL/dW = dL/dz^T h,  dL/db = sum_t dL/dz_t."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_tokens, with_entropy):
        # outputs are allocated up front and written in place: small per-chunk results interleaved with
        # the large freed logits otherwise keep the allocator from reusing them (RSS grew by a chunk per chunk)
        total = hidden.shape[0]
        logp = torch.empty(total, dtype=torch.float32, device=hidden.device)  # (M,)
        log_norm = torch.empty_like(logp)  # (M,)
        entropy = torch.zeros_like(logp)  # (M,)
        for lo in range(0, total, chunk_tokens):
            hi = min(total, lo + chunk_tokens)
            logits = hidden[lo:hi] @ weight.t()  # (n, V)
            if bias is not None:
                logits += bias
            logits = logits.float()
            torch.logsumexp(logits, dim=-1, out=log_norm[lo:hi])
            torch.sub(logits.gather(-1, targets[lo:hi].unsqueeze(-1)).squeeze(-1), log_norm[lo:hi], out=logp[lo:hi])
            if with_entropy:
                logits -= log_norm[lo:hi].unsqueeze(-1)  # log-probs
                entropy[lo:hi] = -(logits.exp() * logits).sum(-1)  # H = -sum p log p
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, log_norm)
        ctx.chunk_tokens = chunk_tokens
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, targets, log_norm = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        for lo in range(0, hidden.shape[0], ctx.chunk_tokens):
            chunk = hidden[lo : lo + ctx.chunk_tokens]  # (n, H)
            logits = chunk @ weight.t()  # (n, V)
            if bias is not None:
                logits = logits + bias
            grad_logits = torch.exp(logits.float() - log_norm[lo : lo + ctx.chunk_tokens].unsqueeze(-1))  # p, (n, V)
            grad_logits.neg_().scatter_add_(-1, targets[lo : lo + ctx.chunk_tokens].unsqueeze(-1),
                                            torch.ones_like(log_norm[lo : lo + ctx.chunk_tokens]).unsqueeze(-1))
            grad_logits.mul_(grad_logp[lo : lo + ctx.chunk_tokens].unsqueeze(-1))
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[lo : lo + ctx.chunk_tokens] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), chunk)
            if grad_bias is not None:
                grad_bias.add_(grad_logits.sum(0))
        return grad_hidden, grad_weight, grad_bias, None, None, None


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
    The result equals token_logprobs(hidden @ W^T + b, targets). Only h, W and logsumexp(z) (M,) are
    kept for the backward pass, which recomputes each chunk's logits (the recomputation trick of
    activation checkpointing, Chen et al. 2016, with the softmax gradient written out), so the peak
    memory is O(chunk_tokens x V) rather than O(M x V), for one extra (chunk, H) x (H, V) product per
    chunk. Entropy H = logsumexp(z) - sum_v softmax(z)_v z_v is returned without gradient.
    Returns logp (M,) float32 and entropy (M,) or None."""
    if hidden.shape[0] == 0:  # nothing to score; keep the graph connected so backward still runs
        empty = (hidden.sum() * 0).float().reshape(1)[:0]
        return empty, (empty.detach() if with_entropy else None)
    logp, entropy = _ChunkedLinearLogprobs.apply(hidden, weight, bias, targets, max(1, chunk_tokens), with_entropy)
    return logp, (entropy if with_entropy else None)
