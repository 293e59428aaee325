"""Train every policy-gradient preset on the default task from the same start, same budget, several seeds.

    python benchmarks/algorithms.py                       # all presets x seeds 0 1 2, 40 steps each
    python benchmarks/algorithms.py --presets grpo dapo --seeds 0 --steps 20

Each run is a real `rlx train algorithm=<preset> seed=<s> steps=<n>` subprocess on the built-in tiny
model (hardware.num_threads=1), evaluated greedily on the 200 held-out questions before the first
update and after the last. Seeds are the outer loop, so an interrupted benchmark still covers every
preset. Finished runs are reused on a rerun (same --out-dir). Writes a markdown table to --table and
stdout: held-out accuracy before, after (mean over seeds and per seed) and the change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRESETS = ["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "lite_ppo", "mc_grpo", "gspo",
           "ppo"]


def run_one(preset: str, seed: int, steps: int, run_dir: Path, extra: list[str]) -> dict | None:
    metrics_file = run_dir / "metrics.jsonl"
    if not (metrics_file.is_file() and _final(metrics_file, steps)):
        args = [sys.executable, "-m", "rlx", "train", f"algorithm={preset}", f"seed={seed}", f"steps={steps}",
                f"eval.every={steps}", "hardware.num_threads=1", "log.samples_every=0", "log.progress=false",
                "save.final=false", "save.plot=false", f"hydra.run.dir={run_dir}", *extra]
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false")
        if run_dir.exists():
            for f in run_dir.glob("metrics.jsonl"):
                f.unlink()
        start = time.time()
        done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{preset} seed {seed} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            return None
        (run_dir / "wall_s.txt").write_text(f"{time.time() - start:.1f}\n")
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    wall = run_dir / "wall_s.txt"
    return {"before": evals[0]["eval/accuracy"], "after": evals[-1]["eval/accuracy"],
            "wall_s": float(wall.read_text()) if wall.is_file() else float("nan")}


def _final(metrics_file: Path, steps: int) -> bool:
    lines = [line for line in metrics_file.read_text().splitlines() if line.strip()]
    return bool(lines) and json.loads(lines[-1]).get("step") == steps and "eval/accuracy" in json.loads(lines[-1])


def table(results: dict, presets: list[str], seeds: list[int], steps: int) -> str:
    head = "| preset | before | after (mean) | change | " + " | ".join(f"seed {s}" for s in seeds) + " | s/run |"
    lines = [head, "|" + "---|" * (5 + len(seeds))]
    for preset in presets:
        runs = results.get(preset, {})
        if not runs:
            continue
        afters = [r["after"] for r in runs.values()]
        before = statistics.mean(r["before"] for r in runs.values())
        after = statistics.mean(afters)
        per_seed = " | ".join(f"{runs[s]['after']:.3f}" if s in runs else "-" for s in seeds)
        wall = statistics.mean(r["wall_s"] for r in runs.values())
        lines.append(f"| {preset} | {before:.3f} | {after:.3f} | {after - before:+.3f} | {per_seed} | {wall:.0f} |")
    return "\n".join(lines) + f"\n\nHeld-out accuracy (200 questions, greedy) before and after {steps} steps.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=PRESETS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out-dir", type=Path, default=REPO / "outputs" / "bench_algorithms")
    parser.add_argument("--table", type=Path, default=REPO / "benchmarks" / "results" / "algorithms.md")
    parser.add_argument("overrides", nargs="*", help="extra rlx overrides applied to every run")
    args = parser.parse_args()
    results: dict = {}
    args.table.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/algorithms.py " + " ".join(sys.argv[1:])
    for seed in args.seeds:
        for preset in args.presets:
            outcome = run_one(preset, seed, args.steps, args.out_dir / f"{preset}_seed{seed}", args.overrides)
            if outcome is not None:
                results.setdefault(preset, {})[seed] = outcome
                print(f"{preset} seed {seed}: {outcome['before']:.3f} -> {outcome['after']:.3f} "
                      f"({outcome['wall_s']:.0f} s)", flush=True)
            text = table(results, args.presets, args.seeds, args.steps)
            args.table.write_text(f"`{command.strip()}`\n\n{text}")
    print(text)


if __name__ == "__main__":
    main()
