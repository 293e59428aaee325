"""Shared pieces of the rlx-vs-TRL benchmarks: model files, prompts, child processes, summaries.

Each measurement runs in its own child process so its peak RSS (from os.wait4) is its own; the
parent alternates the tools round by round (rlx, trl, trl, rlx, ...) so slow phases of a shared
machine hit both, and reports medians.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
TINY = ROOT / "rlx" / "models" / "assets" / "tiny"
LARGE_VOCAB = 151_936  # Qwen2.5's vocabulary size


def large_vocab_model(target: Path = CACHE / "tiny_151k") -> Path:
    """The shipped tiny model with its vocabulary grown to 151,936 entries (built once, cached).

    The tokenizer keeps its byte-level BPE merges and gains 151,599 plain vocabulary entries
    ("<letters>" strings of the byte-level alphabet, reachable only by sampling); the model's tied
    embedding is resized with transformers' `resize_token_embeddings` (new rows drawn around the mean
    of the old ones), so it samples across the whole vocabulary. Context grows to 512 positions."""
    if (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.models.shapes import grow_tokenizer

    grow_tokenizer(target, LARGE_VOCAB)
    if (TINY / "generation_config.json").is_file():
        (target / "generation_config.json").write_text((TINY / "generation_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert len(tokenizer) == LARGE_VOCAB, len(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(TINY)
    model.resize_token_embeddings(LARGE_VOCAB, mean_resizing=True)
    model.config.max_position_embeddings = 512
    model.save_pretrained(target)
    return target


def write_prompts(path: Path, count: int = 400, seed: int = 0) -> Path:
    """chain_sum-style questions with their answers, one JSON row each: {"prompt", "answer"}."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for _ in range(count):
            terms = [rng.randint(0, 9) for _ in range(rng.randint(2, 4))]
            handle.write(json.dumps({"prompt": "Compute " + " + ".join(map(str, terms)), "answer": str(sum(terms))})
                         + "\n")
    return path


def run_child(args: list[str], timeout: float, gpu_memory: bool = False) -> tuple[dict, float]:
    """Run `python <args>`; return the JSON its last stdout line holds and its peak RSS in MiB (with
    `gpu_memory`: GPU 0's peak used memory in MiB instead, from nvidia-smi every 0.2 s, so it counts the
    CUDA context and the allocator's cache as a user sees them)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               WANDB_DISABLED="true")
    log = CACHE / "child.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        start = time.monotonic()
        gpu_peak = 0
        while True:
            if gpu_memory:
                gpu_peak = max(gpu_peak, _gpu_used_mib())
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("{") and line.endswith("}")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {' '.join(args)} failed ({proc.returncode}):\n{text[-3000:]}")
    return json.loads(lines[-1]), gpu_peak if gpu_memory else usage.ru_maxrss / 1024  # ru_maxrss: KiB on Linux


def _gpu_used_mib() -> int:
    """GPU 0's used memory in MiB (nvidia-smi); 0 when it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return 0


def median(values):
    return statistics.median(values) if values else float("nan")


def machine_summary() -> str:
    """The machine a result was measured on: CPU model and cores (and the GPU, when one is visible)."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")), "") if cpuinfo.is_file() else ""
    text = f"{os.cpu_count()} CPU cores ({model or platform.processor() or platform.machine()})"
    try:
        import torch

        if torch.cuda.is_available():
            text += f", {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return text


def load_summary() -> str:
    """One line on how busy the machine was (the numbers are inflated by contention)."""
    load1, load5, _ = os.getloadavg()
    return f"load average {load1:.1f} (1 min) / {load5:.1f} (5 min) on {os.cpu_count()} CPU cores"


def table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
