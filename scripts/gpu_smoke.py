"""GPU smoke test: a few GRPO steps on each GPU path, on a random-init Qwen2.5-0.5B-shaped model.

    make test-gpu                       # every path
    python scripts/gpu_smoke.py --only gpu_bf16 vllm --steps 3

No download: the model is rlx.models.shapes' qwen2.5-0.5b (494M parameters, 24 layers, 151,936
vocabulary, tied embeddings), random weights stored in bf16 like the published checkpoint. Each path is
one `rlx train` child process; the script prints one line per path:
    PASS <path>: s/step=.. tokens/s=.. peak_gpu_mem=..GiB        (medians over the steps after the first)
    FAIL <path> (rc=..): <the error line>
peak_gpu_mem samples nvidia-smi every 0.5 s, so it includes vLLM's reserved cache. Everything is written
under outputs/gpu_smoke/ (logs, run directories). Exit code 0 when every path passed, 1 otherwise, 2 when
no CUDA device is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# path name -> rlx train overrides (on top of the common ones)
PATHS: dict[str, list[str]] = {
    "gpu_bf16": ["hardware=gpu", "model.dtype=bfloat16"],  # the model presets: bf16 weights + bf16 autocast
    "gpu_fp32_autocast": ["hardware=gpu", "model.dtype=float32"],  # fp32 weights + bf16 autocast
    "gpu_bf16_gc": ["hardware=gpu", "model.dtype=bfloat16", "hardware.gradient_checkpointing=true"],
    "gpu_bf16_kl_entropy": ["hardware=gpu", "model.dtype=bfloat16", "algorithm.kl_coef=0.05",
                            "algorithm.entropy_coef=0.01"],
    "gpu_lora": ["hardware=gpu", "model.dtype=bfloat16", "model.lora.enabled=true", "algorithm.kl_coef=0.05"],
    "vllm": ["hardware=gpu", "model.dtype=bfloat16", "rollout=vllm"],
    "vllm_lora": ["hardware=gpu", "model.dtype=bfloat16", "rollout=vllm", "model.lora.enabled=true"],
    "fsdp2": ["hardware=fsdp", "hardware.num_processes=1", "hardware.cpu=false", "hardware.mixed_precision=bf16",
              "model.dtype=float32"],
    "deepspeed_zero2": ["hardware=deepspeed_zero2", "hardware.num_processes=1", "hardware.cpu=false",
                        "hardware.mixed_precision=bf16", "model.dtype=float32"],
}
NEEDS = {"vllm": "vllm", "vllm_lora": "vllm", "deepspeed_zero2": "deepspeed"}


def gpu_memory_sampler(stop: threading.Event, samples: list[int]) -> None:
    """Used GPU memory (MiB) of device 0 every 0.5 s until `stop` is set."""
    while not stop.is_set():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
            samples.append(int(out.splitlines()[0]))
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
        stop.wait(0.5)


def run_path(name: str, overrides: list[str], model: Path, out: Path, args) -> bool:
    run_dir, log = out / "runs" / name, out / f"{name}.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    common = [f"model.path={model}", f"steps={args.steps}", f"prompts_per_step={args.prompts}",
              f"rollout.samples_per_prompt={args.group}", f"rollout.max_new_tokens={args.tokens}",
              f"rollout.min_new_tokens={args.tokens}", f"micro_batch_size={args.micro}", "optim.warmup_steps=0",
              "eval.every=0", "eval.at_start=false", "save.final=false", "save.plot=false", "log.progress=false",
              "checkpoint.every=0", f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               RLX_OUTPUTS=str(out / "outputs"))
    samples: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=gpu_memory_sampler, args=(stop, samples), daemon=True)
    sampler.start()
    start = time.monotonic()
    with log.open("w") as handle:
        try:
            rc = subprocess.run([sys.executable, "-m", "rlx", "train", *common, *overrides], stdout=handle,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    stop.set()
    sampler.join()
    wall = time.monotonic() - start
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    rows = [r for r in rows if "perf/step_time_s" in r]
    peak = f"{max(samples) / 1024:.1f}GiB" if samples else "n/a"
    if rc == 0 and len(rows) >= args.steps:
        timed = rows[1:] or rows  # the first step carries start-up costs (allocator, kernels, graphs)
        step_s = statistics.median(r["perf/step_time_s"] for r in timed)
        tokens_s = statistics.median(r["perf/tokens_per_s"] for r in timed)
        gen = statistics.median(r["perf/generation_time_s"] for r in timed)
        print(f"PASS {name}: s/step={step_s:.2f} tokens/s={tokens_s:.0f} generation={100 * gen / step_s:.0f}% "
              f"peak_gpu_mem={peak} first_step_s={rows[0]['perf/step_time_s']:.1f} wall={wall:.0f}s", flush=True)
        return True
    lines = log.read_text(errors="replace").splitlines()
    errors = [line for line in lines if line.startswith("error: ") or "Error:" in line or "Killed" in line]
    reason = "timed out" if rc == 124 else (errors[-1].strip()[:300] if errors else f"see {log}")
    print(f"FAIL {name} (rc={rc}): {reason} | steps_logged={len(rows)} peak_gpu_mem={peak} wall={wall:.0f}s",
          flush=True)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(PATHS), help="run only these paths")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256, help="completion tokens (forced: min = max)")
    parser.add_argument("--micro", type=int, default=32, help="micro_batch_size")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per path")
    parser.add_argument("--model", default=None, help="a model folder to use instead of building the 0.5B shape")
    parser.add_argument("--out", default=str(ROOT / "outputs" / "gpu_smoke"))
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device visible (torch.cuda.is_available() is False); run `make test-gpu` on a "
              "machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else out / "qwen2.5-0.5b-shape"
    if not args.model and not (model / "config.json").is_file():
        from rlx.models.shapes import build_shaped_model

        build_shaped_model("qwen2.5-0.5b", model, dtype="bfloat16")
    print(f"gpu_smoke: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, model {model}; {args.steps} steps "
          f"of {args.prompts} prompts x {args.group} samples x {args.tokens} tokens", flush=True)
    results = []
    for name in args.only or list(PATHS):
        module = NEEDS.get(name)
        if module and subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode:
            print(f"FAIL {name}: `import {module}` fails in {sys.executable}; install it (pip install -e "
                  f"'.[{module}]')")
            results.append(False)
            continue
        results.append(run_path(name, PATHS[name], model, out, args))
    print(f"gpu_smoke: {sum(results)}/{len(results)} paths passed; logs in {out}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
