"""Seeded per-row sampling: the token drawn for sample i depends only on (its seed, its position, its logits).

Sampling through the global torch RNG makes sample i depend on every row generated before it, so the
same global batch split across processes (or across generation chunks) would draw different tokens.
Here each row carries its own seed; a counter-based hash turns (seed, position) into one uniform
number u, and the token is found by inverse-CDF sampling from the (temperature, top-k, top-p)
filtered distribution. A 2-process run then samples exactly what a 1-process run samples.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift-multiply, "lowbias32" constants), on int64 holding 32 bits.

    Products may wrap in int64, but only their low 32 bits are kept, which wrapping leaves exact."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    x = x ^ (x >> 16)
    return x


def _mix32_int(x: int) -> int:
    """_mix32 on a Python int (same constants), for per-sample seeds without tensor overhead."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def sample_seed(base_seed: int, step: int, index: int) -> int:
    """Seed of global sample `index` at training step `step` (32-bit)."""
    x = _mix32_int(base_seed ^ _mix32_int(step + 0x9E3779B9))
    return _mix32_int(x ^ _mix32_int(index + 0x85EBCA6B))


def row_uniforms(seeds: torch.Tensor, position: int) -> torch.Tensor:
    """One uniform in (0, 1) per row from (seed, position). seeds: (N,) int64. Returns (N,) float64."""
    x = _mix32(seeds.to(torch.int64) ^ _mix32(torch.full_like(seeds, position, dtype=torch.int64) + 0x27D4EB2F))
    x = _mix32(x + 0x165667B1)
    return (x.to(torch.float64) + 0.5) / 4294967296.0


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """softmax(logits / T) restricted to the top-k tokens and the smallest top-p nucleus, renormalised.

    logits: (N, V). Returns (N, V) float64 probabilities."""
    scaled = logits.to(torch.float64) / max(temperature, 1e-8)
    if top_k and 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
        keep_sorted = before < top_p  # always keeps the most likely token
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token t with CDF(t-1) <= u < CDF(t). probs: (N, V); uniforms: (N,). Returns (N,) int64."""
    cdf = probs.cumsum(dim=-1)  # (N, V)
    cdf[:, -1] = 1.0  # guard against rounding leaving u above the last bin
    # first index whose CDF exceeds u; a zero-probability token shares its predecessor's CDF, so never wins
    token = torch.searchsorted(cdf, uniforms.to(cdf.dtype).unsqueeze(-1), right=True).squeeze(-1)
    return token.clamp(max=probs.shape[-1] - 1)


def blocked_inverse_cdf_sample(weights: torch.Tensor, uniforms: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """inverse_cdf_sample on unnormalised weights (N, V) >= 0, in two levels: the block of `block` tokens
    holding u * total, then the token inside it. A full-vocabulary float64 cumsum costs ~0.7 s per step
    at V = 152k and 64 rows; this costs one pass over the weights. Returns (N,) int64."""
    rows, vocab = weights.shape
    full = vocab // block
    sums = [weights[:, : full * block].reshape(rows, full, block).sum(-1)]  # (N, full): float32 sums of 1024 terms
    if vocab > full * block:
        sums.append(weights[:, full * block :].sum(-1, keepdim=True))
    block_cdf = torch.cat(sums, dim=1).to(torch.float64).cumsum(-1)  # (N, nb)
    num_blocks = block_cdf.shape[1]
    target = uniforms.to(torch.float64) * block_cdf[:, -1]  # (N,)
    chosen = torch.searchsorted(block_cdf, target.unsqueeze(-1), right=True).squeeze(-1).clamp(max=num_blocks - 1)
    before = torch.where(chosen > 0, block_cdf.gather(1, (chosen - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0)
    index = chosen.unsqueeze(-1) * block + torch.arange(block, device=weights.device)  # (N, block)
    inner = weights.gather(1, index.clamp(max=vocab - 1)) * (index < vocab)  # (N, block), 0 past the vocabulary
    inner_cdf = inner.to(torch.float64).cumsum(-1) + before.unsqueeze(-1)  # (N, block)
    offset = torch.searchsorted(inner_cdf, target.unsqueeze(-1), right=True).squeeze(-1)  # (N,)
    # rounding can leave the target just above the block's own sum: take its last token with weight
    last_positive = block - 1 - (inner.flip(-1) > 0).to(torch.int8).argmax(-1)
    return chosen * block + torch.minimum(offset, last_positive)


def sample_tokens(logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float, top_k: int,
                  top_p: float) -> torch.Tensor:
    """The seeded draw of each row at completion position `position`. logits: (N, V); seeds: (N,). Returns (N,).

    Without top-k/top-p the weights exp((z - max z) / T) go straight to the two-level inverse CDF;
    the filters need the sorted distribution and take the full float64 path."""
    uniforms = row_uniforms(seeds.to(logits.device), position)
    if (top_k and 0 < top_k < logits.shape[-1]) or top_p < 1.0:
        return inverse_cdf_sample(filtered_probs(logits, temperature, top_k, top_p), uniforms)
    scaled = logits.float() if temperature == 1.0 else logits.float() / max(temperature, 1e-8)
    weights = (scaled - scaled.max(dim=-1, keepdim=True).values).exp_()  # (N, V), 1 at the arg-max
    return blocked_inverse_cdf_sample(weights, uniforms)


class SeededSampler(LogitsProcessor):
    """Makes greedy decoding in `model.generate` pick the seeded sample: all other logits set to -inf."""

    def __init__(self, seeds: torch.Tensor, prompt_length: int, temperature: float, top_k: int, top_p: float):
        self.seeds = seeds.to(torch.int64)  # (N,)
        self.prompt_length = prompt_length
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        position = input_ids.shape[1] - self.prompt_length
        tokens = sample_tokens(scores, self.seeds, position, self.temperature, self.top_k, self.top_p)
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, tokens.unsqueeze(1), 0.0)
        return forced
