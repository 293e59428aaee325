"""A hand-written one-token decode step for Llama-family decoders (Llama, Qwen2, Qwen3, Mistral).

During decoding each step feeds one token per row through the whole network. For small models (and
small batches on a GPU) that step is dominated not by arithmetic but by the framework around it:
module calls and hooks, attention-mask construction, cache bookkeeping and output dataclasses. This
step does the same arithmetic as transformers' modules with plain tensor ops on their weights:

    x = embed[token]
    per layer:  h = RMSNorm(x);  q, k, v = h Wq, h Wk, h Wv  (+ per-head RMSNorm on q, k for Qwen3)
                q, k = RoPE(q, k, position);  append k, v to the layer's preallocated KV buffer
                x = x + softmax(q K^T * d^-1/2 + mask) V Wo
                x = x + (silu(RMSNorm(x) Wg) * (RMSNorm(x) Wu)) Wd
    logits = RMSNorm(x) W_lm

Grouped-query attention reads the shared K/V heads through a reshape of q, (a, kv, h/kv, d), rather
than repeating K and V. RoPE goes through the model's own rotary module, so scaled variants (Llama 3,
YaRN, ...) stay correct. The logits equal the transformers forward's up to float rounding
(tests/test_fast_decode.py). Anything else (other architectures, LoRA-wrapped or quantised linears,
sliding-window layers) returns None from `decode_step_for` and decoding uses the model's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rlx.parallel import is_sharded

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps), the mean over the last dim, computed in float32 (as Llama's RMSNorm)."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the last dim in the half-split layout: x * cos + [-x2, x1] * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _plain_linear(module) -> bool:
    return type(module) is nn.Linear  # peft's LoRA layers and quantised linears are subclasses or wrappers


def decode_step_for(model) -> DecodeStep | None:
    """A DecodeStep over `model`'s weights, or None when the model is outside what it reproduces exactly."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_TYPES:
        return None
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return None
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or [])):
        return None
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return None
    if is_sharded(model):  # ZeRO-3 / FSDP2 parameters hold shards: the modules' forward gathers them
        return None
    base = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if base is None or not hasattr(base, "layers") or head is None or not _plain_linear(head):
        return None
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(_plain_linear(m) for m in linears):
            return None
    return DecodeStep(model)


class DecodeStep:
    """logits (a, V) for one new token per row, appending its keys and values to a generation cache
    whose layers are rollout.hf.PreallocatedLayer (the cache the prompt prefill filled)."""

    def __init__(self, model):
        base = model.model
        self.base, self.head = base, model.lm_head
        self.layers = list(base.layers)
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = getattr(model.config, "num_key_value_heads", None) or self.heads
        self.scaling = attn.scaling
        self.qk_norm = hasattr(attn, "q_norm")

    def __call__(self, token: torch.Tensor, position: torch.Tensor, attention: torch.Tensor, cache) -> torch.Tensor:
        """token, position: (a,); attention: (a, L) 1 on real tokens, the new one last; cache: its layers
        hold L - 1 positions before the call and L after.

        The step computes in the dtype the prompt prefill used, read from the cache: a prefill under
        bf16 autocast over fp32 weights (Accelerate's mixed precision wraps the model's forward, which
        this step bypasses) filled a bf16 cache, and the step then runs under the same autocast."""
        compute = cache.layers[0].values.dtype  # (keys may be float32 even then: RoPE promotes them)
        if compute != self.head.weight.dtype:
            with torch.autocast(token.device.type, dtype=compute):
                return self._step(token, position, attention, cache)
        return self._step(token, position, attention, cache)

    def _step(self, token, position, attention, cache) -> torch.Tensor:
        rows = token.shape[0]
        d, h, kv = self.head_dim, self.heads, self.kv_heads
        x = self.base.embed_tokens(token)  # (a, H)
        cos, sin = self.base.rotary_emb(x, position.unsqueeze(1))  # (a, 1, d) each: broadcast over heads
        masked = attention == 0  # (a, L)
        blocked = masked.view(rows, 1, 1, -1) if masked.any() else None  # (a, 1, 1, L)
        for index, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            normed = rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)  # (a, H)
            q = F.linear(normed, attn.q_proj.weight, attn.q_proj.bias).view(rows, h, d)  # (a, h, d)
            k = F.linear(normed, attn.k_proj.weight, attn.k_proj.bias).view(rows, kv, d)  # (a, kv, d)
            v = F.linear(normed, attn.v_proj.weight, attn.v_proj.bias).view(rows, kv, 1, d)  # (a, kv, 1, d)
            if self.qk_norm:
                q = rms_norm(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
                k = rms_norm(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            keys, values = cache.layers[index].update(k.unsqueeze(2), v)  # (a, kv, L, d) each
            grouped = q.view(rows, kv, h // kv, d)  # (a, kv, h/kv, d): query heads sharing a K/V head
            scores = torch.matmul(grouped, keys.transpose(-1, -2)) * self.scaling  # (a, kv, h/kv, L)
            if blocked is not None:
                scores = scores.masked_fill(blocked, float("-inf"))
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            mixed = torch.matmul(weights, values).reshape(rows, h * d)  # (a, h*d)
            x = x + F.linear(mixed, attn.o_proj.weight, attn.o_proj.bias)
            normed = rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
            gate = F.linear(normed, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(normed, mlp.up_proj.weight, mlp.up_proj.bias)
            x = x + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        x = rms_norm(x, self.base.norm.weight, self.base.norm.variance_epsilon)
        return F.linear(x, self.head.weight, self.head.bias)  # (a, V)
