"""Token log-probabilities and entropies from logits."""

from __future__ import annotations

from dataclasses import dataclass

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


def head_compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the output projection runs in: autocast's when autocast is on (bf16 mixed precision),
    else the weight's own (bf16 weights compute in bf16, fp32 weights in fp32)."""
    device_type = weight.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


@dataclass(frozen=True)
class _ChunkPlan:
    """How _ChunkedLinearLogprobs computes (no tensors: nothing here takes a gradient): `chunk_tokens` rows at a
    time, the entropy too or not, at sampling temperature `temperature`, the product h W^T in `dtype`."""

    chunk_tokens: int
    with_entropy: bool
    temperature: float
    dtype: torch.dtype


class _ChunkedLinearLogprobs(torch.autograd.Function):
    """log softmax((h W^T + b) / T)[target], chunk by chunk; the backward pass recomputes each chunk's logits.

    The product h W^T runs in `dtype` (the compute dtype); z = (h W^T + b) / T, its log-sum-exp and
    everything after are float32. With q = softmax(z), log-prob l_t = z_t[target] - lse(z_t) and
    entropy H_t = -sum_v q_v log q_v:
        d l / d z = onehot(target) - q,      d H / d z = -q * (log q + H)
    so with upstream gradients g_l, g_H (M,): dL/dz = g_l (onehot - q) - g_H q (log q + H), and through
    the temperature dL/d(hW^T+b) = dL/dz / T; dL/dh = that W, dL/dW = that^T h, dL/db = its column sums.
    The weight gradient accumulates in float32 across chunks and is cast to the weight's dtype once."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, plan: _ChunkPlan):
        # outputs are allocated up front and written in place: small per-chunk results interleaved with
        # the large freed logits otherwise keep the allocator from reusing them (RSS grew by a chunk per chunk)
        chunk_tokens, with_entropy, temperature, dtype = (plan.chunk_tokens, plan.with_entropy, plan.temperature,
                                                          plan.dtype)
        total = hidden.shape[0]
        logp = torch.empty(total, dtype=torch.float32, device=hidden.device)  # (M,)
        log_norm = torch.empty_like(logp)  # (M,)
        entropy = torch.zeros_like(logp)  # (M,)
        with torch.autocast(hidden.device.type, enabled=False):
            weight_c = weight.to(dtype)  # (V, H) in the compute dtype (a no-op when it already is)
            for lo in range(0, total, chunk_tokens):
                hi = min(total, lo + chunk_tokens)
                logits = _scaled_logits(hidden[lo:hi], weight_c, bias, temperature, dtype)  # (n, V) float32
                torch.logsumexp(logits, dim=-1, out=log_norm[lo:hi])
                torch.sub(logits.gather(-1, targets[lo:hi].unsqueeze(-1)).squeeze(-1), log_norm[lo:hi], out=logp[lo:hi])
                if with_entropy:
                    logits -= log_norm[lo:hi].unsqueeze(-1)  # log q
                    entropy[lo:hi] = -(logits.exp() * logits).sum(-1)  # H = -sum q log q
                del logits
        ctx.save_for_backward(hidden, weight, bias, targets, log_norm, entropy)
        ctx.chunk_tokens, ctx.temperature, ctx.dtype = chunk_tokens, temperature, dtype
        ctx.set_materialize_grads(False)  # an output the loss does not use arrives as None, not zeros
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, log_norm, entropy = ctx.saved_tensors
        step, temperature, dtype = ctx.chunk_tokens, ctx.temperature, ctx.dtype
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1]
                       else None)
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) \
            if bias is not None and ctx.needs_input_grad[2] else None
        with torch.autocast(hidden.device.type, enabled=False):
            weight_c = weight.to(dtype)  # (V, H)
            for lo in range(0, hidden.shape[0], step):
                rows = slice(lo, lo + step)
                chunk = hidden[rows].to(dtype)  # (n, H)
                log_q = _scaled_logits(chunk, weight_c, bias, temperature, dtype)  # (n, V) float32
                log_q -= log_norm[rows].unsqueeze(-1)
                q = log_q.exp()  # (n, V)
                if grad_logp is not None:
                    grad_z = q.neg().scatter_add_(-1, targets[rows].unsqueeze(-1),
                                                  torch.ones_like(log_norm[rows]).unsqueeze(-1))
                    grad_z.mul_(grad_logp[rows].unsqueeze(-1))  # g_l (onehot - q)
                else:
                    grad_z = torch.zeros_like(q)
                if grad_entropy is not None:
                    log_q += entropy[rows].unsqueeze(-1)  # log q + H
                    grad_z.sub_(q.mul_(log_q).mul_(grad_entropy[rows].unsqueeze(-1)))  # - g_H q (log q + H)
                del q, log_q
                if temperature != 1.0:
                    grad_z.div_(temperature)
                if grad_bias is not None:
                    grad_bias.add_(grad_z.sum(0))
                if grad_weight is not None:
                    grad_weight.addmm_(grad_z.t(), chunk.float())
                grad_z = grad_z.to(dtype)
                if grad_hidden is not None:
                    grad_hidden[rows] = grad_z @ weight_c
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight, grad_bias, None, None


def _scaled_logits(hidden, weight, bias, temperature: float, dtype) -> torch.Tensor:
    """z = (h W^T + b) / T: the product in `dtype`, the result float32. hidden: (n, H). Returns (n, V)."""
    logits = hidden.to(dtype) @ weight.t()  # (n, V)
    if bias is not None:
        logits += bias.to(dtype)
    logits = logits.float()
    if temperature != 1.0:
        logits /= temperature
    return logits


def chunked_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax((h W^T + b) / T)[target] for each row of `hidden`, never holding more than chunk_tokens x V logits.

    hidden: (M, H) final hidden states; weight: (V, H) output projection; targets: (M,); temperature T:
    the sampling temperature, so the log-probs are those of the distribution the tokens were drawn from.
    The result equals token_logprobs((hidden @ W^T + b) / T, targets). Only h, W, logsumexp(z) (M,) and
    the entropy (M,) are kept for the backward pass, which recomputes each chunk's logits (the
    recomputation trick of activation checkpointing, Chen et al. 2016, with the softmax gradient written
    out), so the peak memory is O(chunk_tokens x V) rather than O(M x V), for one extra (chunk, H) x (H, V)
    product per chunk. The product runs in the compute dtype (head_compute_dtype: bf16 under bf16
    autocast or with bf16 weights), the log-sum-exp in float32. Entropy H = -sum_v q_v log q_v of the
    same tempered distribution carries gradients too (an entropy bonus needs no full logits).
    Returns logp (M,) float32 and entropy (M,) or None."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[0] == 0:  # nothing to score; keep the graph connected so backward still runs
        empty = (hidden.sum() * 0).float().reshape(1)[:0]
        return empty, (empty if with_entropy else None)
    plan = _ChunkPlan(max(1, chunk_tokens), with_entropy, float(temperature), head_compute_dtype(weight))
    logp, entropy = _ChunkedLinearLogprobs.apply(hidden, weight, bias, targets, plan)
    return logp, (entropy if with_entropy else None)
