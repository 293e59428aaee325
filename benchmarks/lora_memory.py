"""Where LoRA's peak memory goes: transformers' own training step of a model (forward, backward, AdamW over what
trains), plain and with LoRA, under glibc's default allocator and with its mmap threshold fixed.

    python benchmarks/lora_memory.py --threads 2          (SmolLM2-135M-Instruct, 32 x (48 + 56) tokens, ~6 min)

Each variant runs in its own child process (its peak RSS is its own), 3 steps, on the same random tokens. glibc
raises its mmap threshold each time a large block is freed (up to 32 MiB), after which tensors of that size come from
the heap and freed ones stay in the process; MALLOC_MMAP_THRESHOLD_ fixes the threshold, so every large tensor is
mapped and unmapped (memory returned at once, each page faulted in again). LoRA's forward allocates more transient
tensors of a projection's output size (base output, adapter output, scaled, summed) than the plain one, which that
dynamic threshold keeps. Results: benchmarks/results/lora_memory_smollm2.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import CACHE, load_summary, machine_summary, median, run_child, table  # noqa: E402
from benchmarks.grpo_vs_trl import RESULTS, model_dir  # noqa: E402
from benchmarks.lora_vs_full import completion_loss, training_model  # noqa: E402

FIXED_THRESHOLD = 128 * 1024  # glibc's initial mmap threshold, fixed (bytes)


def worker(model_path: str, lora: bool, threads: int, rows: int, prompt_tokens: int, completion_tokens: int,
           steps: int) -> dict:
    """`steps` training steps of the model (loss: mean log-probability of the completion positions, the head on
    those only); per step its time and the process's peak RSS so far (MiB)."""
    import torch

    model, ids = training_model(model_path, threads, rows, prompt_tokens, completion_tokens, lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    times, peaks = [], []
    for _ in range(steps):
        start = time.perf_counter()
        completion_loss(model, ids, completion_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"step_times": times, "peak_mib_by_step": peaks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--completion-tokens", type=int, default=56)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.lora, args.threads, args.rows, args.prompt_tokens,
                                args.completion_tokens, args.steps)))
        return
    path = str(model_dir("smollm2-natural"))
    CACHE.mkdir(parents=True, exist_ok=True)
    results = {}
    for allocator in ("default", "fixed"):
        for variant in ("full", "lora"):
            saved = os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
            if allocator == "fixed":
                os.environ["MALLOC_MMAP_THRESHOLD_"] = str(FIXED_THRESHOLD)
            try:
                out, rss = run_child([__file__, "--worker", path, "--threads", str(args.threads), "--steps",
                                      str(args.steps), "--rows", str(args.rows), "--prompt-tokens",
                                      str(args.prompt_tokens), "--completion-tokens", str(args.completion_tokens),
                                      *(["--lora"] if variant == "lora" else [])], args.timeout)
            finally:
                os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
                if saved is not None:
                    os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
            results[f"{variant} {allocator}"] = {**out, "peak_mib": rss, "median_step_s": median(out["step_times"])}
            print(f"{variant}, {allocator} allocator: step {median(out['step_times']):.2f}s, peak RSS {rss:.0f} MiB "
                  f"({load_summary()})", flush=True)
    print(table([[name, f"{r['median_step_s']:.2f}", f"{r['peak_mib']:.0f}"] for name, r in results.items()],
                ["variant, allocator", "step s (median)", "peak RSS MiB"]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lora_memory_smollm2.json").write_text(json.dumps({
        "results": results, "fixed_threshold_bytes": FIXED_THRESHOLD, "threads": args.threads, "steps": args.steps,
        "rows": args.rows, "prompt_tokens": args.prompt_tokens, "completion_tokens": args.completion_tokens,
        "date": time.strftime("%Y-%m-%d"), "machine": machine_summary(), "load": load_summary(),
        "command": "python benchmarks/lora_memory.py " + " ".join(sys.argv[1:])}, indent=1) + "\n")


if __name__ == "__main__":
    main()
