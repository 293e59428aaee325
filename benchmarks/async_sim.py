"""A small simulator: from measured per-phase times, the speed-up of pipeline mode (staleness k = 1..4) over the
synchronous loop on N = 8 and 64 GPUs.

    python benchmarks/async_sim.py                       # inputs from benchmarks/results/async_vs_sync_0.5b_*.json
    python benchmarks/async_sim.py --gen-share 0.75 --tail 0.3 --cv 0.3 --sync 0.05

The model (every number relative to one synchronous step on 8 GPUs = 1):
  - generation takes the share g of a synchronous step; a part t of it is the long tail (decoding the longest rows
    of the batch after most have finished: per-token latency, which more GPUs do not shorten), the rest (1 - t)
    is throughput, shared by the generating GPUs; the tail of a batch varies from batch to batch (lognormal, mean
    1, coefficient of variation cv: the longest completion of a batch is a random draw);
  - the update takes 1 - g, shared by the training GPUs (ideal data parallelism);
  - a weight push takes `sync` (a broadcast: it does not shrink with N).
  Synchronous (colocated, every GPU generates then trains): step = g (1 - t) 8/N + g t X_b + (1 - g) 8/N + sync.
  Pipeline (disaggregated: n_g GPUs generate, N - n_g train, the best split), rlx's schedule: batch b is sampled
  once the weights of update b-1-k are published and the previous batch is sampled (one batch at a time, as the
  producer thread does); the trainer updates on batch b once it is sampled and update b-1 is done. The push
  (sync) is the producer's, between two batches. Simulated over 4,000 steps; the speed-up is the ratio of the
  mean step times. Partial rollouts are modelled as cutting the tail by the fraction measured (--partial-cut).
What it leaves out: continuous batching across batches (AReaL streams rows; rlx's producer samples one batch at a
time), the trainer's idle memory, network limits of the push beyond a constant, and data-parallel inefficiency.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# published figures of peers, for the docs table beside the simulation (their hardware, models and tasks)
PEERS = [
    ("AReaL (Fu et al. 2025), fully asynchronous vs synchronous", "2.57x (2.77x in its later release)"),
    ("ROLL Flash (2025), asynchronous RLVR / agentic", "2.24x / 2.72x"),
    ("APRIL (2025), partial rollouts", "+22.5% rollout throughput (up to +44%)"),
]


def simulate(gen_share: float, tail: float, cv: float, sync: float, gpus: int, staleness: int | None, generators: int = 0,
             steps: int = 4000, seed: int = 0) -> float:
    """Mean step time (relative to one synchronous step on 8 GPUs). staleness None: synchronous on all `gpus`."""
    rng = random.Random(seed)
    sigma = math.sqrt(math.log(1 + cv * cv))
    draws = [rng.lognormvariate(-sigma * sigma / 2, sigma) for _ in range(steps)]  # mean 1
    scale = 8 / gpus
    if staleness is None:
        total = sum(gen_share * (1 - tail) * scale + gen_share * tail * x + (1 - gen_share) * scale + sync for x in draws)
        return total / steps
    trainers = gpus - generators
    produce = [gen_share * (1 - tail) * 8 / generators + gen_share * tail * x + sync for x in draws]
    update = (1 - gen_share) * 8 / trainers
    sampled, updated = [0.0] * (steps + 1), [0.0] * (steps + 1)  # end times (index = batch/step, 1-based)
    producer_free = 0.0
    for b in range(1, steps + 1):
        weights = updated[b - 1 - staleness] if b - 1 - staleness >= 1 else 0.0
        start = max(producer_free, weights)
        sampled[b] = producer_free = start + produce[b - 1]
        updated[b] = max(sampled[b], updated[b - 1]) + update
    warm = steps // 10
    return (updated[steps] - updated[warm]) / (steps - warm)


def best_pipeline(gen_share, tail, cv, sync, gpus, staleness) -> tuple[float, int]:
    """(mean step time, generating GPUs) at the best split of `gpus`."""
    return min((simulate(gen_share, tail, cv, sync, gpus, staleness, g), g) for g in range(1, gpus))


def measured_inputs() -> dict:
    """g, t, cv from the 0.5B benchmark files when present: g from the synchronous forced-length run, t from the
    natural-length run (1 - generation of the forced run / generation of the natural run, equal mean lengths), cv
    from the natural run's per-step generation times, and the tail cut of partial rollouts."""
    inputs = {}
    forced_file, natural_file = RESULTS / "async_vs_sync_0.5b_2x4x64.json", RESULTS / "async_vs_sync_0.5b_2x4_natural_max128.json"
    if forced_file.is_file():
        sync = json.loads(forced_file.read_text())["summary"]["sync"]
        inputs["gen_share"] = sync["generation_s"] / (sync["generation_s"] + sync["update_s"])
    if natural_file.is_file():
        record = json.loads(natural_file.read_text())
        times = [t for run in record["runs"]["sync"] for t in run["generation_times"]]
        mean = sum(times) / len(times)
        inputs["cv"] = math.sqrt(sum((t - mean) ** 2 for t in times) / max(len(times) - 1, 1)) / mean
        if forced_file.is_file():
            forced = json.loads(forced_file.read_text())["summary"]["sync"]["generation_s"]
            inputs["tail"] = max(0.0, 1 - forced / record["summary"]["sync"]["generation_s"])
        if "partial" in record["summary"]:
            partial, whole = record["summary"]["partial"]["generation_s"], record["summary"]["sync"]["generation_s"]
            inputs["partial_cut"] = max(0.0, min(1.0, (whole - partial) / max(whole * inputs.get("tail", 1.0), 1e-9)))
    return inputs


def main(argv=None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gen-share", type=float, help="generation's share of a synchronous step (default: measured, "
                                                        "else 0.75, the H100 figure of issue 27)")
    parser.add_argument("--tail", type=float, help="share of generation in the long tail (default: measured, else 0.3)")
    parser.add_argument("--cv", type=float, help="variation of a batch's tail (default: measured, else 0.3)")
    parser.add_argument("--sync", type=float, default=0.02, help="a weight push, share of a synchronous 8-GPU step")
    parser.add_argument("--partial-cut", type=float, help="share of the tail partial rollouts avoid (default: measured)")
    parser.add_argument("--json", help="also write the table as JSON here")
    args = parser.parse_args(argv)
    measured = measured_inputs()
    g = args.gen_share if args.gen_share is not None else measured.get("gen_share", 0.75)
    tail = args.tail if args.tail is not None else measured.get("tail", 0.3)
    cv = args.cv if args.cv is not None else measured.get("cv", 0.3)
    cut = args.partial_cut if args.partial_cut is not None else measured.get("partial_cut", 0.0)
    print(f"inputs: generation share {g:.2f}, tail share {tail:.2f}, tail variation {cv:.2f}, push {args.sync:.2f}, "
          f"partial rollouts cut {cut:.2f} of the tail" + (f" (measured: {', '.join(sorted(measured))})" if measured else ""))
    rows, record = [], []
    for gpus in (8, 64):
        sync_time = simulate(g, tail, cv, args.sync, gpus, None)
        for k in (1, 2, 3, 4):
            piped, generators = best_pipeline(g, tail, cv, args.sync, gpus, k)
            partial, _ = best_pipeline(g, tail * (1 - cut), cv, args.sync, gpus, k)
            rows.append([str(gpus), str(k), f"{generators}/{gpus - generators}", f"{sync_time / piped:.2f}x",
                         f"{sync_time / partial:.2f}x"])
            record.append({"gpus": gpus, "staleness": k, "generating_gpus": generators, "speedup": sync_time / piped,
                           "speedup_partial": sync_time / partial})
    header = ["GPUs", "staleness k", "generate/train GPUs", "pipeline vs sync", "+ partial rollouts"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    print("\n".join(lines))
    print("\npublished by peers (their hardware, models, tasks): " + "; ".join(f"{a}: {b}" for a, b in PEERS))
    if args.json:
        Path(args.json).write_text(json.dumps({"inputs": {"gen_share": g, "tail": tail, "cv": cv, "sync": args.sync,
                                                          "partial_cut": cut}, "table": record}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
