"""One decode token step at a real shape, split into its parts: the layers, the output head, the sampler.

    python benchmarks/decode_step.py [--shape qwen2.5-0.5b] [--layers 24] [--rows 8] [--steps 16] [--threads 2]

Builds the random-init shape once into benchmarks/.cache/ (rlx.models.shapes), prefills `--rows` rows of
a 32-token prompt through rlx.engines.hf's preallocated cache, then times, min over `--repeats` runs of
`--steps` steps each: the whole step (rlx.engines.fast_decode.DecodeStep + sampler), the step without
the sampler (default F.linear, rollout.onednn_decode, rollout.quantize=int8 and int8_layers, alternating; int8 includes
making the 8-bit copy once per generate call, timed apart), the head alone (final norm + lm_head), and each
sampler version alone on the step's logits.
The weight-read floor is the bytes of all weights / a measured read bandwidth (sum of a 1 GiB tensor); the int8
floor counts the projections and the head at one byte a weight.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rlx.engines.fast_decode import decode_step_for  # noqa: E402
from rlx.engines.hf import generation_cache  # noqa: E402
from rlx.engines.sampling import SAMPLERS, sample_tokens  # noqa: E402
from rlx.models.shapes import build_shaped_model  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache"


def timed(fn, steps: int, repeats: int) -> float:
    """Min over repeats of the mean seconds per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for t in range(steps):
            fn(t)
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def read_bandwidth() -> float:
    x = torch.ones(256 * 1024 * 1024)  # 1 GiB float32
    x.sum()
    best = min(_timed_sum(x) for _ in range(3))
    return x.numel() * 4 / best


def _timed_sum(x):
    start = time.perf_counter()
    x.sum()
    return time.perf_counter() - start


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    folder = CACHE / f"{args.shape}-{args.layers or 'all'}"
    if not (folder / "config.json").exists():
        build_shaped_model(args.shape, folder, num_layers=args.layers)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    start = time.perf_counter()
    int8 = decode_step_for(model, quantize="int8")
    int8_copy_s = time.perf_counter() - start  # made once per generate call (after every update)
    start = time.perf_counter()
    int8_layers = decode_step_for(model, quantize="int8_layers")  # the head stays float32 (oneDNN)
    int8_layers_copy_s = time.perf_counter() - start
    steps = {"default": decode_step_for(model), "onednn": decode_step_for(model, onednn=True), "int8": int8,
             "int8_layers": int8_layers}
    rows, prompt = args.rows, 32
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (rows, prompt))
    mask = torch.ones(rows, prompt, dtype=torch.long)
    seeds = torch.arange(rows, dtype=torch.int64) * 7919 + 1

    def fresh():
        cache = generation_cache(model, args.steps * args.repeats * 8 + 8)
        out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.past_key_values, out.logits[:, -1]

    cache, logits = fresh()
    state = {"attention": mask, "position": torch.full((rows,), prompt), "token": torch.zeros(rows, dtype=torch.long)}

    def layers_and_head(t, kind="default"):
        state["attention"] = torch.cat([state["attention"], state["attention"].new_ones(rows, 1)], dim=1)
        out = steps[kind](state["token"], state["position"], state["attention"], cache)
        state["position"] = state["position"] + 1
        return out

    def whole(t, sampler):
        out = layers_and_head(t)
        state["token"] = sample_tokens(out, seeds, t, 1.0, 0, 1.0, sampler=sampler)

    head_in = torch.randn(rows, model.config.hidden_size)

    def head(t):
        x = torch.nn.functional.rms_norm(head_in, (head_in.shape[-1],), model.model.norm.weight, 1e-6)
        return torch.nn.functional.linear(x, model.lm_head.weight)

    results = {}
    for name in SAMPLERS:
        results[f"step+sampler {name}"] = timed(lambda t, name=name: whole(t, name), args.steps, args.repeats)
    for _ in range(2):  # alternating
        for kind in steps:
            name = f"step without sampler, {kind}"
            results[name] = min(results.get(name, 1e9),
                                timed(lambda t, kind=kind: layers_and_head(t, kind), args.steps, args.repeats))
    results["head (norm + lm_head)"] = timed(head, args.steps, args.repeats)
    for name in SAMPLERS:
        results[f"sampler {name} alone"] = timed(
            lambda t, name=name: sample_tokens(logits, seeds, t, 1.0, 0, 1.0, sampler=name), args.steps, args.repeats)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = read_bandwidth()
    print(f"shape {args.shape}, layers {model.config.num_hidden_layers}, rows {rows}, threads {args.threads}, "
          f"load {os.getloadavg()[0]:.2f}")
    for name, seconds in results.items():
        print(f"{name:28s} {seconds * 1000:8.1f} ms")
    print(f"{'weight-read floor':28s} {weight_bytes / bandwidth * 1000:8.1f} ms  "
          f"({weight_bytes / 2**30:.2f} GiB at {bandwidth / 1e9:.1f} GB/s)")
    int8_bytes = sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))
    print(f"{'int8 weight-read floor':28s} {int8_bytes / bandwidth * 1000:8.1f} ms  "
          f"({int8_bytes / 2**30:.2f} GiB of int8 projections and head)")
    print(f"{'int8 copy (per generate call)':28s} {int8_copy_s * 1000:8.1f} ms")
    print(f"{'int8_layers copy (per call)':28s} {int8_layers_copy_s * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
