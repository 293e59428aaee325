"""rlx synchronous vs pipeline (rollout.max_staleness=1) vs partial rollouts, beside TRL's synchronous GRPO, in one run.

    python benchmarks/async_vs_sync.py                        # make bench-async: the tiny model, then the 0.5B shape
    python benchmarks/async_vs_sync.py --settings "tiny 8x8x32" --rounds 2 --steps 6
    python benchmarks/async_vs_sync.py --settings "0.5b 2x4x64" --modes sync,k1-pinned,trl --steps 3

Same setup as benchmarks/grpo_vs_trl.py (same model files, prompts, batch, lr, no KL, forced completion length or
natural lengths, each run its own child process, the first step untimed), at rlx's defaults plus the async knobs:

    sync        rlx defaults, hardware.num_threads=THREADS (both phases use every thread)
    sync-1t     hardware.num_threads=1: each phase on one core, for the profile below
    k1          rollout.max_staleness=1 rollout.correction=tis: the producer thread samples batch s+1 while the
                trainer trains on batch s, each with THREADS torch threads (oversubscribed on 2 cores)
    k1-pinned   k1 with the producer thread on core 1 (rollout.producer_cpus=[1], one thread) and the trainer thread
                on core 0 (hardware.num_threads=1): one core each
    partial     rollout.partial=true rollout.correction=tis (natural-length settings: 2x groups in flight)
    k1-partial  both
    k1-rounds   k1-partial in token-budget rounds of 16 (rollout.segment_tokens=16: every unfinished row advances
                at most 16 tokens per round; what rollout=server runs, here on rollout=hf)
    k1-rounds-1x  k1-rounds with no more groups in flight than a step trains (rollout.partial_oversample=1)
    trl         TRL's GRPOTrainer, synchronous (benchmarks/grpo_vs_trl.py's worker), THREADS threads

Per mode: median step time, completion tokens/s, peak RSS, and the phase profile from the run's metrics:
generation (sync: perf/generation_time_s; pipeline: the producer's perf/rollout_time_s) and the update (step time
minus the wait for the batch). The profile answers how far each phase is from using both cores alone: speed-up of
a phase from 1 to THREADS threads (sync-1t vs sync). With one core each, the pipeline's step is max(generation on
1 core, update on 1 core) against the synchronous generation + update on 2 cores: the gain is bounded by those.
Results: benchmarks/results/async_vs_sync_<setting>.json, with the machine's load before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import grpo_vs_trl  # noqa: E402
from benchmarks.common import CACHE, load_summary, median, run_child, table, write_prompts  # noqa: E402

# name: (model kind of grpo_vs_trl.model_dir, prompts per step, samples per prompt, completion tokens: forced, or at
# most for "natural")
SETTINGS = {
    "tiny 8x8x32": ("tiny", 8, 8, 32),
    "tiny 16x8 natural<=48": ("tiny-natural", 16, 8, 48),
    "0.5b 2x4x64": ("0.5b", 2, 4, 64),
    "0.5b 2x4 natural<=128": ("0.5b-natural", 2, 4, 128),
}
MODES = {
    "sync": [],
    "sync-1t": ["hardware.num_threads=1"],
    "k1": ["rollout.max_staleness=1", "rollout.correction=tis"],
    "k1-pinned": ["rollout.max_staleness=1", "rollout.correction=tis", "rollout.producer_cpus=[1]",
                  "rollout.producer_threads=1", "hardware.num_threads=1"],
    "partial": ["rollout.partial=true", "rollout.correction=tis"],
    "k1-partial": ["rollout.max_staleness=1", "rollout.correction=tis", "rollout.partial=true"],
    "k1-rounds": ["rollout.max_staleness=1", "rollout.correction=tis", "rollout.partial=true",
                  "rollout.segment_tokens=16"],
    "k1-rounds-1x": ["rollout.max_staleness=1", "rollout.correction=tis", "rollout.partial=true",
                     "rollout.segment_tokens=16", "rollout.partial_oversample=1"],
}
FORCED_MODES = ["sync", "sync-1t", "k1", "k1-pinned", "trl"]
NATURAL_MODES = ["sync", "partial", "k1", "k1-partial", "trl"]
RESULTS = Path(__file__).resolve().parent / "results"


MODEL_DIR = grpo_vs_trl.model_dir


def model_dir(kind: str) -> Path:
    if kind == "tiny-natural":
        return grpo_vs_trl.TINY
    return MODEL_DIR(kind)


def forced(kind: str) -> bool:
    return not kind.endswith("-natural")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return load_summary()


def rlx_worker(setting: str, mode: str, steps: int, warmup: int, threads: int) -> dict:
    kind, prompts, group, length = SETTINGS[setting]
    run_dir = CACHE / "async_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        f"model.path={model_dir(kind)}", "data=file", f"data.train_path={CACHE / 'prompts.jsonl'}", "data.eval_size=8",
        "data.prompt_template='{question}'", "reward=exact_match", f"steps={steps + warmup}",
        f"prompts_per_step={prompts}", f"rollout.samples_per_prompt={group}", f"rollout.max_new_tokens={length}",
        f"rollout.min_new_tokens={length if forced(kind) else 0}", f"micro_batch_size={prompts * group}",
        f"optim.lr={grpo_vs_trl.LR}", "optim.warmup_steps=0", "optim.max_grad_norm=1.0", "algorithm.kl_coef=0.0",
        "eval.every=0", "eval.at_start=false", "save.final=false", "save.plot=false", "log.samples_every=0",
        "log.progress=false", f"hardware.num_threads={threads}", "checkpoint.every=0", f"hydra.run.dir={run_dir}",
        *MODES[mode],
    ]
    subprocess.run([sys.executable, "-m", "rlx", "train", *overrides], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_time_s" in r][warmup:]
    pipelined = "perf/rollout_time_s" in rows[0]
    generation = [r["perf/rollout_time_s"] if pipelined else r["perf/generation_time_s"] for r in rows]
    waited = [r["perf/generation_time_s"] for r in rows]  # pipeline: the trainer's wait for its batch
    return {"step_times": [r["perf/step_time_s"] for r in rows],
            "tokens": [r["completions/mean_length"] * prompts * group for r in rows],
            "generation_times": generation,
            "update_times": [r["perf/step_time_s"] - w for r, w in zip(rows, waited)],
            "trainer_idle": [r.get("perf/trainer_idle_s", w) for r, w in zip(rows, waited)],
            "producer_idle": [r.get("perf/producer_idle_s", 0.0) for r in rows],
            "staleness_mean": [r.get("rollout/staleness_mean", 0.0) for r in rows]}


def trl_worker(setting: str, steps: int, warmup: int, threads: int) -> dict:
    grpo_vs_trl.SETTINGS[setting] = SETTINGS[setting]  # this file's settings, TRL's worker as it is
    grpo_vs_trl.model_dir, grpo_vs_trl.forced = model_dir, forced
    return grpo_vs_trl.trl_worker(setting, steps, CACHE / "prompts.jsonl", warmup, threads)


def summarize(runs: list[dict]) -> dict:
    """Medians over the runs of each run's medians."""
    out = {"step_s": median([median(r["step_times"]) for r in runs]),
           "tokens_per_s": median([median(r["tokens"]) / median(r["step_times"]) for r in runs]),
           "peak_rss_mib": median([r["peak_mib"] for r in runs])}
    for key in ("generation_times", "update_times", "trainer_idle", "producer_idle"):
        values = [median(r[key]) for r in runs if r.get(key)]
        if values:
            out[key.replace("_times", "_s").replace("_idle", "_idle_s")] = median(values)
    return out


def profile(summary: dict, threads: int) -> dict:
    """How far each phase is from using `threads` cores alone, and what one core each can give (see the docstring)."""
    if "sync" not in summary or "sync-1t" not in summary:
        return {}
    two, one = summary["sync"], summary["sync-1t"]
    g2, u2, g1, u1 = two["generation_s"], two["update_s"], one["generation_s"], one["update_s"]
    return {"generation_speedup_from_threads": g1 / g2, "update_speedup_from_threads": u1 / u2,
            "generation_share_sync": g2 / (g2 + u2), "sync_step_s": g2 + u2,
            "one_core_each_bound_s": max(g1, u1), "overlap_gain_bound": (g2 + u2) / max(g1, u1),
            "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default="tiny 8x8x32,tiny 16x8 natural<=48,0.5b 2x4x64",
                        help="comma-separated subset of: " + ", ".join(SETTINGS))
    parser.add_argument("--modes", default=None, help="comma-separated modes (default: by setting, forced or natural)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default: 8 tiny, 3 for the 0.5B)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.worker == "trl":
            result = trl_worker(args.setting, args.steps, args.warmup, args.threads)
        else:
            result = rlx_worker(args.setting, args.mode, args.steps, args.warmup, args.threads)
        print(json.dumps(result), flush=True)
        return
    write_prompts(CACHE / "prompts.jsonl")
    rate = grpo_vs_trl.matmul_gflops(args.threads)
    for setting in args.settings.split(","):
        kind = SETTINGS[setting][0]
        model_dir(kind)  # build outside the timed children
        modes = args.modes.split(",") if args.modes else (FORCED_MODES if forced(kind) else NATURAL_MODES)
        steps = args.steps or (3 if kind.startswith("0.5b") else 8)
        runs: dict[str, list] = {mode: [] for mode in modes}
        loads = []
        for round_index in range(args.rounds):
            order = modes if round_index % 2 == 0 else list(reversed(modes))
            for mode in order:
                before = uptime()
                worker = ["--worker", "trl"] if mode == "trl" else ["--worker", "rlx", "--mode", mode]
                threads = 1 if mode in ("sync-1t", "k1-pinned") else args.threads
                out, rss = run_child([__file__, *worker, "--setting", setting, "--steps", str(steps), "--warmup",
                                      str(args.warmup), "--threads", str(threads)], args.timeout)
                out["peak_mib"] = rss
                runs[mode].append(out)
                loads.append({"mode": mode, "before": before, "after": uptime()})
                step = median(out["step_times"])
                print(f"[{setting}] round {round_index + 1} {mode}: step {step:.2f}s  "
                      f"{median(out['tokens']) / step:.0f} tok/s  peak RSS {rss:.0f} MiB  ({loads[-1]['after']})",
                      flush=True)
        summary = {mode: summarize(runs[mode]) for mode in modes}
        record = {"setting": setting, "summary": summary, "profile": profile(summary, args.threads), "runs": runs,
                  "threads": args.threads, "rounds": args.rounds, "steps": steps, "warmup": args.warmup,
                  "matmul_gflops": rate, "load": loads, "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
        RESULTS.mkdir(parents=True, exist_ok=True)
        name = "async_vs_sync_" + setting.replace(" ", "_").replace("<=", "_max") + ".json"
        (RESULTS / name).write_text(json.dumps(record, indent=1) + "\n")
        rows = []
        base = summary.get("trl", {}).get("tokens_per_s")
        sync = summary.get("sync", {}).get("tokens_per_s")
        for mode, s in summary.items():
            rows.append([mode, f"{s['step_s']:.2f}", f"{s['tokens_per_s']:.0f}",
                         f"{s['tokens_per_s'] / sync:.2f}x" if sync else "-",
                         f"{s['tokens_per_s'] / base:.2f}x" if base else "-",
                         f"{s.get('generation_s', float('nan')):.2f}", f"{s.get('update_s', float('nan')):.2f}",
                         f"{s['peak_rss_mib']:.0f}"])
        print(f"\n[{setting}] medians of {args.rounds} round(s) x {steps} timed steps; {load_summary()}")
        print(table(rows, ["mode", "step s", "tok/s", "vs rlx sync", "vs TRL", "generation s", "update s",
                           "peak RSS MiB"]))
        if record["profile"]:
            print("profile:", json.dumps({k: round(v, 3) for k, v in record["profile"].items()}))


if __name__ == "__main__":
    main()
