"""The harness examples against the built-in environments they mirror, same recipe and budget, 3 seeds:

    env=corridor                      vs  env=harness env.target=examples.corridor_harness.run
    env=tool_use                      vs  env=harness env.target=examples.tool_harness.run (calculator tool schema)

    python benchmarks/harness_examples.py [--seeds 0 1 2] [--out benchmarks/results/harness_examples.json]

Each run is a real `rlx train` subprocess on one core (hardware.num_threads=1), pinned with taskset when it
exists; the JSON holds held-out eval/success (sampled, 100 tasks) at step 0 and at the end, the final
training metrics and the wall time of each run. docs/agents/harness.md quotes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORRIDOR_HARNESS = ["env=harness", "env.target=examples.corridor_harness.run", "env.max_new_tokens=3",
                    "env.max_turns=8"]
TOOL_HARNESS = ["env=harness", "env.target=examples.tool_harness.run", "env.tool_parser=tags",
                f"env.chat_template={REPO / 'examples' / 'tiny_tools.jinja'}", "env.max_new_tokens=24",
                "env.max_turns=3"]
RUNS = {  # name: (recipe, overrides)
    "corridor/env": ("agent_grpo_corridor_tiny", []),
    "corridor/harness": ("agent_grpo_corridor_tiny", CORRIDOR_HARNESS),
    "tool/env": ("agent_grpo_tool_tiny", []),
    "tool/harness": ("agent_grpo_tool_tiny", TOOL_HARNESS),
}


def run_one(recipe: str, overrides: list[str], seed: int, outputs: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), RLX_OUTPUTS=str(outputs), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    command = [*pin, sys.executable, "-m", "rlx", "train", recipe, *overrides, f"seed={seed}", "hardware.num_threads=1",
               "log.progress=false", "save.plot=false", "save.final=false", f"name=bench_{seed}"]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    (run_dir,) = [p for p in (outputs / "train").iterdir() if p.name.endswith(f"bench_{seed}")]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success" in r]
    shutil.rmtree(run_dir)
    return {"seed": seed, "eval_success_start": evals[0]["eval/success"], "eval_success_end": evals[-1]["eval/success"],
            "eval_curve": [(r["step"], r["eval/success"]) for r in evals], "wall_s": round(wall, 1),
            "generation_s_mean": round(sum(r.get("perf/generation_time_s", 0) for r in rows)
                                       / max(1, len(rows) - len(evals)), 3),
            "command": " ".join(["rlx", "train", recipe, *overrides, f"seed={seed}", "hardware.num_threads=1"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "harness_examples.json"))
    args = parser.parse_args(argv)
    results = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} CPUs (shared), one core per run",
               "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            recipe, overrides = RUNS[name]
            records = []
            for seed in args.seeds:
                records.append(run_one(recipe, overrides, seed, Path(tmp)))
                print(f"{name} seed {seed}: eval/success {records[-1]['eval_success_start']:.2f} -> "
                      f"{records[-1]['eval_success_end']:.2f} ({records[-1]['wall_s']:.0f} s)", flush=True)
            results["runs"][name] = records
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    for name, records in results["runs"].items():
        ends = [r["eval_success_end"] for r in records]
        print(f"{name:18s} {records[0]['eval_success_start']:.2f} -> {sum(ends) / len(ends):.3f}  "
              f"({', '.join(f'{e:.2f}' for e in ends)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
