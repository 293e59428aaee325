"""Publish time of the gloo push (rlx/fleet/weight_stream.py) against the file push's file part, on this CPU.

    python benchmarks/weight_push.py                      # builtin:tiny and a random SmolLM2-135M-shaped model
    python benchmarks/weight_push.py --models tiny --repeats 5

gloo: WeightSender.send to a receiver process holding the same architecture (join excluded; manifest, buckets of
--bucket-mib, apply into the receiver's model, digest of both sides, acknowledgement included).
file: what rollout.server.publisher=file does before the server's reload (served_state_dict + safetensors write,
renamed into place), plus a reader's part of the reload (safetensors load_file + copy into a model of the same
shape), in one process. vLLM's own reload_weights cost is not in it (no vLLM here). The median of --repeats.
Writes --out (JSON, with the machine's load average at the end: shared machines skew both paths) and prints one
line per model and path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SMOLLM2_135M = dict(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, vocab_size=49152,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                    max_position_embeddings=2048)


def build(name: str, seed: int):
    torch.manual_seed(seed)
    if name == "tiny":
        from rlx.models.loading import load_causal_lm

        model = load_causal_lm("builtin:tiny")
        if seed:
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0, 0.02)
        return model
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M, torch_dtype="bfloat16")).to(torch.bfloat16)


def receive(name: str, host: str, port: int) -> None:
    from rlx.fleet.weight_stream import serve_model

    torch.set_num_threads(1)
    serve_model(build(name, seed=1), host, port, 1, 2, timeout_s=600)


def time_gloo(name: str, model, repeats: int, bucket_bytes: int) -> list[float]:
    from rlx.fleet.weight_stream import WeightSender, full_parameters, manifest_of

    sender = WeightSender(1, bucket_bytes=bucket_bytes, timeout_s=600)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    receiver = subprocess.Popen([sys.executable, __file__, "--receive", name, *map(str, sender.address)], env=env)
    sender.join()
    times = []
    for version in range(1, repeats + 1):
        began = time.perf_counter()
        sender.send(version, full_parameters(model), manifest_of(model.named_parameters()))
        times.append(time.perf_counter() - began)
    sender.close()
    receiver.wait(timeout=120)
    return times


def time_file(name: str, model, repeats: int) -> list[float]:
    from safetensors.torch import load_file

    from rlx.fleet.publishers import WEIGHTS_FILE, served_state_dict, write_weights

    reader = build(name, seed=1)
    folder = Path(tempfile.mkdtemp(prefix="rlx-push-"))
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        write_weights(served_state_dict(model), folder)
        loaded = load_file(str(folder / WEIGHTS_FILE))
        reader.load_state_dict(loaded, strict=False)
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2_135m_random"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mib", type=float, default=64)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "weight_push.json"))
    parser.add_argument("--receive", nargs=3, metavar=("MODEL", "HOST", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receive:
        receive(args.receive[0], args.receive[1], int(args.receive[2]))
        return
    torch.set_num_threads(1)
    results = []
    for name in args.models:
        model = build(name, seed=0)
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        row = {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
               "bytes": size, "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
               "bucket_mib": args.bucket_mib}
        row["gloo_s"] = time_gloo(name, model, args.repeats, int(args.bucket_mib * 2**20))
        row["file_s"] = time_file(name, model, args.repeats)
        for path in ("gloo", "file"):
            print(f"{name} ({size / 2**20:.1f} MiB {row['dtype']}): {path} push median "
                  f"{statistics.median(row[path + '_s']):.3f} s over {args.repeats}", flush=True)
        results.append(row)
    out = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "cpu": platform.processor()
           or platform.machine(), "threads": 1, "note": "file = served_state_dict + safetensors write + load_file + "
           "copy (no vLLM reload); gloo = manifest + buckets + apply + blake2b digests + ack (join excluded)",
           "load_average_1_5_15": [round(x, 1) for x in os.getloadavg()], "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
