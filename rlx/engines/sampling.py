"""Seeded per-row sampling: the token drawn for sample i depends only on (its seed, its position, its logits).

Sampling through the global torch RNG makes sample i depend on every row generated before it, so the
same global batch split across processes (or across generation chunks) would draw different tokens.
Here each row carries its own seed; a counter-based hash turns (seed, position) into one uniform
number u, and the token is found by inverse-CDF sampling from the (temperature, top-k, top-p)
filtered distribution. A 2-process run then samples exactly what a 1-process run samples.
"""

from __future__ import annotations

import torch

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


def row_uniforms(seeds: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per row from (seed, position). seeds: (N,) int64; position: one for every row, or (N,)
    int64, each row's own (a row continued from a prefix). Returns (N,) float64."""
    if isinstance(position, torch.Tensor):
        positions = position.to(device=seeds.device, dtype=torch.int64)
    else:
        positions = torch.full_like(seeds, position, dtype=torch.int64)
    x = _mix32(seeds.to(torch.int64) ^ _mix32(positions + 0x27D4EB2F))
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


def sample_tokens_v1(logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float, top_k: int,
                     top_p: float) -> torch.Tensor:
    """Sampler v1: the seeded draw of each row at completion position `position`. logits: (N, V); seeds: (N,).

    Without top-k/top-p the weights exp((z - max z) / T) go straight to the two-level inverse CDF;
    the filters need the sorted distribution and take the full float64 path (a float64 sort of the
    whole vocabulary: ~0.25 s per token step for 8 rows at V = 152k). Returns (N,) int64."""
    uniforms = row_uniforms(seeds.to(logits.device), position)
    if (top_k and 0 < top_k < logits.shape[-1]) or top_p < 1.0:
        return inverse_cdf_sample(filtered_probs(logits, temperature, top_k, top_p), uniforms)
    return _plain_sample(logits, uniforms, temperature)


def _plain_sample(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float) -> torch.Tensor:
    """Unfiltered draw: weights exp((z - max z) / T) in float32, two-level inverse CDF (both versions)."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / max(temperature, 1e-8)
    weights = (scaled - scaled.max(dim=-1, keepdim=True).values).exp_()  # (N, V), 1 at the arg-max
    return blocked_inverse_cdf_sample(weights, uniforms)


def nucleus_sample(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_k: int, top_p: float,
                   candidates: int = 1024) -> torch.Tensor:
    """Top-k / top-p draw in float32 over the most likely tokens only, in descending-probability order (sampler v2).

    With p = softmax(z / T) over the vocabulary and the tokens sorted by p (descending, ties by the
    order torch.topk returns), top-k keeps the first k and renormalises: q_i = p_i / sum_{j<k} p_j.
    Top-p (Holtzman et al. 2020) then keeps token i iff the mass strictly before it, Q_{i-1} = sum_{j<i} q_j,
    is < top_p, i.e. the prefix ending at the first i with Q_i >= top_p, whose mass is M = Q_i.
    The draw is the inverse CDF over that prefix: the first i with Q_i > u * M. Because the kept set
    is a prefix of the sorted order, only the first `candidates` (or k) tokens need sorting: torch.topk
    finds them, and a row whose nucleus is not inside them (flat distributions) repeats with 16x as many,
    up to the whole vocabulary. Every number depends on its own row only. logits: (N, V); uniforms: (N,).
    Returns (N,) int64 token ids."""
    rows, vocab = logits.shape
    scaled = logits.float() if temperature == 1.0 else logits.float() / max(temperature, 1e-8)
    keep = top_k if top_k and 0 < top_k < vocab else vocab
    width = keep if keep < vocab else min(vocab, candidates)  # top-k sorts its k; top-p alone starts with candidates
    log_total = torch.logsumexp(scaled, dim=-1, keepdim=True)  # (N, 1): log sum_j exp(z_j / T)
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    rest = torch.arange(rows, device=logits.device)  # rows not drawn yet
    while True:
        values, order = torch.topk(scaled[rest], width, dim=-1)  # (n, width) descending
        part = torch.empty(rest.numel(), dtype=torch.long, device=logits.device)
        done = _prefix_draw((values - log_total[rest]).exp_(), order, uniforms[rest], top_p, keep < vocab,
                            width == keep, part)
        tokens[rest[done]] = part[done]
        if bool(done.all()):
            return tokens
        rest = rest[~done]  # the nucleus reaches past the sorted tokens (flat rows): sort 16x more
        width = min(vocab, width * 16)


def _prefix_draw(probs, order, uniforms, top_p, renormalise, complete, out) -> torch.Tensor:
    """out = each row's draw, valid for the rows whose kept prefix lies inside its sorted tokens: returned (N,) bool.

    probs (N, W): p_i of the W most likely tokens, descending; order (N, W): their ids; renormalise: top-k
    (the W tokens are the k kept ones, divide by their mass); complete: the W tokens are all a row may keep."""
    cum = probs.cumsum(-1)  # (N, W): P_i = p_0 + ... + p_i
    if renormalise:
        cum = cum / cum[:, -1:]  # Q_i
    last = torch.full((cum.shape[0],), cum.shape[1] - 1, dtype=torch.long, device=cum.device)  # all W kept
    found = torch.full_like(last, complete, dtype=torch.bool)
    if top_p < 1.0:
        reached = cum >= top_p  # (N, W)
        last = torch.where(reached.any(-1), reached.to(torch.int8).argmax(-1), last)  # first i with Q_i >= top_p
        found = found | reached.any(-1)
    mass = cum.gather(1, last.unsqueeze(1))  # (N, 1): M
    target = uniforms.to(cum.dtype).unsqueeze(1) * mass  # (N, 1)
    index = torch.searchsorted(cum, target, right=True).squeeze(1)  # first i with Q_i > u * M
    index = torch.minimum(index, last)  # rounding can leave the target at M itself
    drawn = order.gather(1, index.unsqueeze(1)).squeeze(1)
    out.copy_(drawn)
    return found


def sample_tokens_v2(logits: torch.Tensor, seeds: torch.Tensor, position: int, temperature: float, top_k: int,
                     top_p: float) -> torch.Tensor:
    """Sampler v2: as v1 without filters (same draws); with top-k/top-p, nucleus_sample in float32 over the
    sorted candidates instead of v1's float64 sort of the whole vocabulary (different draws: the CDF runs
    in descending-probability order rather than vocabulary order). Returns (N,) int64."""
    uniforms = row_uniforms(seeds.to(logits.device), position)
    if (top_k and 0 < top_k < logits.shape[-1]) or top_p < 1.0:
        return nucleus_sample(logits, uniforms, temperature, top_k, top_p)
    return _plain_sample(logits, uniforms, temperature)


# rollout.sampler: the versioned draw. A run records its version in config.yaml; a config without the key
# (runs from before versions existed) means v1, so a resumed old run keeps drawing what it drew.
# v3 draws as v2 from the logits of the oneDNN decode step (engines/fast_decode.py DecodeStep(onednn=True): on the
# CPU in float32, ~1.45x faster token steps at the 0.5B shape; elsewhere the same logits as v2): the logits differ
# from v2's by float rounding (<1e-4 from the transformers forward), so the draws may differ: a version of its own.
SAMPLERS = {"v1": sample_tokens_v1, "v2": sample_tokens_v2, "v3": sample_tokens_v2}
ONEDNN_DECODE = frozenset({"v3"})  # versions whose decode step runs its projections through oneDNN
LEGACY_SAMPLER = "v1"


def sample_tokens(logits: torch.Tensor, seeds: torch.Tensor, position: int | torch.Tensor, temperature: float,
                  top_k: int, top_p: float, sampler: str = "v2") -> torch.Tensor:
    """The seeded draw of each row at completion position `position` (one int, or (N,) per row) with sampler version
    `sampler`. logits: (N, V); seeds: (N,). Returns (N,) int64."""
    return SAMPLERS[sampler](logits, seeds, position, temperature, top_k, top_p)
