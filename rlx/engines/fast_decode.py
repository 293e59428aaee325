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
(tests/test_fast_decode.py). peft LoRA linears (plain LoRA, no DoRA or other variant) are computed as peft
does, unmerged: x W^T + b + scaling * (x A^T) B^T (+ B's bias with lora_bias), so a LoRA policy decodes
through this step too. Anything else (other architectures, quantised linears, sliding-window layers)
returns None from `decode_step_for` and decoding uses the model's forward.

8-bit decoding (`quantize="int8"`, rollout.quantize): every projection and the output head run from an int8 copy
of their weights made when the step is built (once per generate call, so after every update), symmetric per output
channel, s_c = max_j |W_cj| / 127, q_cj = round(W_cj / s_c), through fbgemm's dynamic int8 linear. The activations
are quantised per row: each row x_r is divided by m_r = max_j |x_rj| and two input columns (+1, -1, with zero
weights) are appended, so the kernel's per-tensor range is [-1, 1] whatever else is in the batch. Its grid there has
127 levels (reduce_range), too coarse for a row with an outlier channel (the rest rounds to a level or two), so the
rounding residual goes through the same call as extra rows, scaled to [-1, 1] on its own: y = m_r (u W^T +
m'_r (r / m'_r) W^T) + b, activations to ~13 bits at the cost of 2x rows in a product bound by reading the weights.
A row's logits then depend on that row alone (integer products are exact), so chunking and rows leaving the batch
change no draw, as in float32. A decode step reads a quarter of the float32 bytes; its logits differ from the
float32 step's by the weights' rounding (about 1% of their range), so the tokens are drawn from a nearby policy,
which the trainer corrects for with rollout.correction (FlashRL, Liu, Yao et al. 2025: truncated importance
sampling makes 8-bit rollouts match full-precision ones). `quantize="int8_layers"` keeps the output head in float32
(through oneDNN's copy where it runs): at a 150k-word vocabulary the head is most of the 8-bit copy's making and, on
SmolLM2, most of the gap to float32.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from rlx.runtime.parallel import is_sharded

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


def lora_parts(module) -> list[tuple[nn.Linear, nn.Linear, float]] | None:
    """(A, B, scaling) of each active adapter of a peft LoRA linear; [] when its adapters are off or merged
    into the base weight (peft then runs the base layer alone); None when `module` is not a plain-LoRA
    wrapper of an nn.Linear (DoRA and other variants, quantised bases) or drops out while decoding."""
    base = getattr(module, "base_layer", None)
    if base is None or not _plain_linear(base) or not hasattr(module, "lora_A"):
        return None
    if module.disable_adapters or module.merged:
        return []
    parts = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if name in getattr(module, "lora_variant", {}):  # DoRA, ...: their own forward
            return None
        dropout = module.lora_dropout[name]
        if dropout.training and getattr(dropout, "p", 0) > 0:
            return None
        parts.append((module.lora_A[name], module.lora_B[name], module.scaling[name]))
    return parts


def _decodable_linear(module) -> bool:
    return _plain_linear(module) or lora_parts(module) is not None


def unwrapped(model):
    """The transformers model inside a peft wrapper (PeftModel -> LoraModel -> model), else `model`."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def decode_step_for(model, onednn: bool = False, quantize: str = "none") -> DecodeStep | None:
    """A DecodeStep over `model`'s weights, or None when the model is outside what it reproduces exactly.
    onednn: on the CPU, run the projections through oneDNN on a copy of the weights (DecodeStep); quantize="int8":
    through an int8 copy of them (module docstring)."""
    model = unwrapped(model)
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
        if not all(_decodable_linear(m) for m in linears):
            return None
    return DecodeStep(model, onednn, quantize)


QUANTIZE = ("none", "int8", "int8_layers")  # rollout.quantize: the decode step's weights (int8_layers: the head
# stays float32, through oneDNN where it runs: most of the 8-bit gap and of the copy's cost is the head's)


QUANTIZE_ROWS = 2048  # output channels quantised at a time: their float rows stay in cache between the passes


def int8_weights(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (out, in + 2) int8, s (out,) float32) of a float weight, per output channel c: s_c = max|W_c| / 127,
    q_cj = round(W_cj / s_c) (half to even), and two zero columns for int8_matmul's range columns. Written into q
    block by block of QUANTIZE_ROWS channels (one read of the weights, no float-sized temporary of the whole)."""
    w = weight.detach()
    rows, width = w.shape
    q = torch.zeros(rows, width + 2, dtype=torch.int8)
    scales = torch.empty(rows, dtype=torch.float32)
    for lo in range(0, rows, QUANTIZE_ROWS):
        block = w[lo:lo + QUANTIZE_ROWS].float().cpu()  # the weights themselves when float32: never written
        s = block.abs().amax(dim=1).div_(127).clamp_(min=1e-12)
        scales[lo:lo + QUANTIZE_ROWS] = s
        q[lo:lo + QUANTIZE_ROWS, :width] = (block / s[:, None]).round_()  # |W / s| <= 127: exact in int8
    return q, scales


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """(fbgemm's packed int8 weight, float bias or None) of a float linear: int8_weights' copy (per output channel,
    with the range columns; module docstring), packed for fbgemm's dynamic linear."""
    q, scales = int8_weights(weight)
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch 2.13 warns that its quantized tensors are deprecated (for torchao);
        warnings.simplefilter("ignore", UserWarning)  # the fbgemm ops run as before (docs/scaling/quantized.md)
        packed = torch._make_per_channel_quantized_tensor(q, scales.double(), zeros, 0)
    return torch.ops.quantized.linear_prepack(packed, None), (bias.detach().float().cpu() if bias is not None else None)


ACTIVATION_LEVELS = 63.5  # fbgemm's grid on [-1, 1] with reduce_range: u -> round(63.5 u) / 63.5


def int8_matmul(x: torch.Tensor, packed: tuple) -> torch.Tensor:
    """x W^T + b through int8_linear's copy, each row on its own scale, in two passes (module docstring):
    u = x_r / m_r, its rounding residual r = u - round(63.5 u) / 63.5 scaled to [-1, 1] by m'_r, both through the
    kernel in one call (2 x rows: the weights are read once), y = m_r (u W^T + m'_r (r / m'_r) W^T) + b. The range
    columns (+1, -1) pin the kernel's activation range to [-1, 1]. x: (rows, in)."""
    weight, bias = packed
    rows = x.shape[0]
    m = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)  # (rows, 1)
    u = x / m
    residual = u - torch.round(u * ACTIVATION_LEVELS) / ACTIVATION_LEVELS  # what the kernel's rounding drops
    m2 = residual.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    ends = x.new_tensor([1.0, -1.0]).expand(2 * rows, 2)
    both = torch.ops.quantized.linear_dynamic(torch.cat([torch.cat([u, residual / m2]), ends], dim=1), weight, True)
    out = m * (both[:rows] + m2 * both[rows:])
    return out if bias is None else out + bias


def int8_available(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and "fbgemm" in torch.backends.quantized.supported_engines


def onednn_available(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()


class DecodeStep:
    """logits (a, V) for one new token per row, appending its keys and values to a generation cache
    whose layers are rollout.hf.PreallocatedLayer (the cache the prompt prefill filled).

    onednn (float32 on the CPU): every projection and the output head run as oneDNN inner products on a
    copy of the weights converted once per DecodeStep (one per generate call, so it follows the policy's
    updates). At a few rows per step MKL's GEMM with a transposed weight reads the weights ~2x slower than
    oneDNN's inner product (benchmarks/decode_step.py); the copy costs the weights' memory again while
    generating. Float rounding differs from F.linear's, so draws can differ from the default path.

    quantize="int8" (on the CPU): the same, from an int8 copy of the weights (int8_linear; a quarter of their
    float32 bytes): the logits are a nearby policy's, not the float32 step's (module docstring)."""

    def __init__(self, model, onednn: bool = False, quantize: str = "none"):
        base = model.model
        self.base, self.head = base, model.lm_head
        self.layers = list(base.layers)
        self.packed = {}  # id(linear module) -> (oneDNN weight, oneDNN bias or None), or its int8 copy
        self.quantized = set()  # id of every linear whose copy is int8
        self.adapters = {}  # id(LoRA linear) -> [(A, B, scaling)] of its active adapters
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                parts = None if _plain_linear(m) else lora_parts(m)
                if parts is not None:
                    self.adapters[id(m)] = parts
        if quantize not in QUANTIZE:
            raise ValueError(f"quantize must be one of {QUANTIZE}, got {quantize!r}")
        self.int8 = quantize != "none"  # the projections run from an int8 copy; the head too unless int8_layers
        if self.int8 and not int8_available(self.head.weight):
            raise ValueError("int8 decoding runs on the CPU (fbgemm); this model is on " + str(self.head.weight.device))
        float_onednn = onednn_available(self.head.weight)
        if self.int8 or (onednn and float_onednn):
            with torch.no_grad():
                for layer in self.layers:
                    attn, mlp = layer.self_attn, layer.mlp
                    for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                              mlp.down_proj):
                        self._pack(m, self.int8)
                if quantize != "int8_layers" or float_onednn:
                    self._pack(self.head, quantize == "int8")
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = getattr(model.config, "num_key_value_heads", None) or self.heads
        self.scaling = attn.scaling
        self.qk_norm = hasattr(attn, "q_norm")

    def _pack(self, module, int8: bool) -> None:
        """The module's weight copy: int8 (int8_linear, in `quantized`) or oneDNN float32."""
        base = getattr(module, "base_layer", module)  # a LoRA linear: its base weight (the adapters run apart)
        if int8:
            self.packed[id(module)] = int8_linear(base.weight, base.bias)
            self.quantized.add(id(module))
            return
        bias = base.bias.detach().to_mkldnn() if base.bias is not None else None
        self.packed[id(module)] = (base.weight.detach().to_mkldnn(), bias)

    def linear(self, x: torch.Tensor, module) -> torch.Tensor:
        """x W^T + b for a (rows, in) x, through the oneDNN copy when there is one; a LoRA linear adds
        scaling * B(A(x)) per active adapter, with x in the adapters' dtype, as peft's forward does."""
        adapters = self.adapters.get(id(module))
        base = module if adapters is None else module.base_layer
        packed = self.packed.get(id(module)) if x.dtype == torch.float32 else None
        if packed is None:
            out = F.linear(x, base.weight, base.bias)
        elif id(module) in self.quantized:
            out = int8_matmul(x, packed)
        else:
            out = torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), *packed).to_dense()
        if adapters:
            dtype = out.dtype
            for lora_a, lora_b, scaling in adapters:
                xa = x.to(lora_a.weight.dtype)
                out = out + F.linear(F.linear(xa, lora_a.weight, lora_a.bias), lora_b.weight, lora_b.bias) * scaling
            out = out.to(dtype)
        return out

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
            q = self.linear(normed, attn.q_proj).view(rows, h, d)  # (a, h, d)
            k = self.linear(normed, attn.k_proj).view(rows, kv, d)  # (a, kv, d)
            v = self.linear(normed, attn.v_proj).view(rows, kv, 1, d)  # (a, kv, 1, d)
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
            x = x + self.linear(mixed, attn.o_proj)
            normed = rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
            gate = self.linear(normed, mlp.gate_proj)
            up = self.linear(normed, mlp.up_proj)
            x = x + self.linear(F.silu(gate) * up, mlp.down_proj)
        x = rms_norm(x, self.base.norm.weight, self.base.norm.variance_epsilon)
        return self.linear(x, self.head)  # (a, V)
