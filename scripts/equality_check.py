"""Before/after equality of training runs: the same metrics.jsonl values and the same final weights.

A refactor that keeps behaviour must leave every run of this list unchanged at a fixed seed and one thread:

    python scripts/equality_check.py capture OUT_BEFORE      # on the commit before the change
    python scripts/equality_check.py capture OUT_AFTER       # on the commit after it
    python scripts/equality_check.py compare OUT_BEFORE OUT_AFTER
    python scripts/equality_check.py capture OUT --only default dapo   # a subset (compare takes --only too)

`capture` runs each configuration below with the `rlx` of the current environment and keeps, per run, its
metrics rows (timing metrics left out) and a SHA-256 of every tensor of final/. `compare` prints, per run,
the largest difference of any metric present on both sides and whether the weights are bit-identical (and
their largest absolute difference where they are not). Exit 1 when a run differs beyond --tolerance.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# label -> overrides; one run per family, the default run at full length, and the policy-gradient options the
# loops share (packing, token budgets, dynamic sampling, the median pivot, forking tokens, KL, PPO-style epochs)
RUNS = {
    "default": [],
    "grpo_options": ["steps=6", "eval.every=3", "algorithm.epochs=2", "algorithm.mini_batches=2",
                     "algorithm.kl_coef=0.05",
                     "packed_forward=true", "micro_batch_tokens=2048", "rollout.temperature=0.8"],
    "dapo": ["algorithm=dapo", "steps=6", "eval.every=3"],
    "mc_grpo_forking": ["algorithm=mc_grpo", "algorithm.forking_rho=0.5", "steps=6", "eval.every=3"],
    "rloo_kl_reward": ["algorithm=rloo", "algorithm.kl_coef=0.05", "algorithm.kl_in=reward",
                       "algorithm.kl_estimator=k1", "steps=6", "eval.every=3"],
    "ppo": ["algorithm=ppo", "steps=6", "eval.every=3"],
    "sft": ["algorithm=sft", "steps=20", "eval.every=10"],
    "dpo": ["algorithm=dpo", "data=prefs", "steps=10", "eval.every=5"],
    "reward_model": ["algorithm=reward_model", "data=prefs", "steps=10", "eval.every=5"],
    "gigpo_corridor": ["algorithm=gigpo", "env=corridor", "model.path=builtin:tiny_agent", "data.source=none",
                       "steps=6", "eval.every=3"],
    "agent_grpo_grid_epochs": ["algorithm=agent_grpo", "env=grid", "model.path=builtin:tiny_agent", "data.source=none",
                               "steps=4", "eval.every=2", "algorithm.epochs=2"],
    "gigpo_t07": ["algorithm=gigpo", "env=corridor", "model.path=builtin:tiny_agent", "data.source=none",
                  "rollout.temperature=0.7", "algorithm.epochs=2", "steps=2", "eval.every=2"],
    # the seed presets whose estimator or credit rule declares needs (keyed groups, extra samples, inputs)
    "seed_ngrpo": ["seed_ngrpo_tiny", "steps=4", "eval.every=2"],
    "seed_hints_guide": ["seed_hints_guide_tiny", "steps=4", "eval.every=2"],
    "seed_replay": ["seed_replay_tiny", "steps=4", "eval.every=2"],
    "pass_at_k": ["algorithm.transforms=[pass_at_k]", "steps=4", "eval.every=2"],
    # the difficulty-aware prompt source (pass rates learnt from each draw's verdicts, retirement) with dynamic sampling
    "prompt_sampling": ["algorithm.prompt_sampling.mode=hard", "algorithm.prompt_sampling.retire_after=1",
                        "algorithm.dynamic_sampling=true", "data.train_size=12", "steps=6", "eval.every=3"],
    "seed_gra": ["seed_gra_tiny", "steps=4", "eval.every=2"],
    "seed_hgpo": ["seed_hgpo_grid_tiny", "steps=4", "eval.every=2"],
    "epo_band": ["algorithm=gigpo", "env=corridor", "model.path=builtin:tiny_agent", "data.source=none",
                 "algorithm.entropy_smoothing.coef=0.1", "algorithm.epochs=2", "steps=4", "eval.every=2"],
    # the producer modes: pipeline (one batch ahead), partial rollouts, and a harness program through the gateway
    "pipeline": ["rollout.max_staleness=1", "rollout.correction=tis", "steps=6", "eval.every=3"],
    "partial": ["rollout.partial=true", "rollout.correction=tis", "steps=6", "eval.every=3"],
    "partial_rounds_pipeline": ["rollout.partial=true", "rollout.correction=tis", "rollout.segment_tokens=4",
                                "rollout.max_staleness=1", "steps=6", "eval.every=3"],
    "harness": ["algorithm=agent_grpo", "env=harness", "env.target=examples.corridor_harness.run",
                "model.path=builtin:tiny_agent", "data.source=none", "env.eval_episodes=8", "steps=3", "eval.every=3"],
    # every other preset, a few steps each: the policy-gradient ones, the preference ones, the multi-turn one
    "preset_agrae": ["algorithm=agrae", "steps=4", "eval.every=2"],
    "preset_dr_grpo": ["algorithm=dr_grpo", "steps=4", "eval.every=2"],
    "preset_gspo": ["algorithm=gspo", "steps=4", "eval.every=2"],
    "preset_laser": ["algorithm=laser", "steps=4", "eval.every=2"],
    "preset_laser_d": ["algorithm=laser_d", "steps=4", "eval.every=2"],
    "preset_lite_ppo": ["algorithm=lite_ppo", "steps=4", "eval.every=2"],
    "preset_reinforce_pp": ["algorithm=reinforce_pp", "steps=4", "eval.every=2"],
    "preset_reinforce_pp_baseline": ["algorithm=reinforce_pp_baseline", "steps=4", "eval.every=2"],
    "preset_unlikeliness": ["algorithm=unlikeliness", "steps=4", "eval.every=2"],
    "preset_cdpo": ["algorithm=cdpo", "data=prefs", "steps=6", "eval.every=3"],
    "preset_hinge": ["algorithm=hinge", "data=prefs", "steps=6", "eval.every=3"],
    "preset_ipo": ["algorithm=ipo", "data=prefs", "steps=6", "eval.every=3"],
    "preset_ln_dpo": ["algorithm=ln_dpo", "data=prefs", "steps=6", "eval.every=3"],
    "preset_orpo": ["algorithm=orpo", "data=prefs", "steps=6", "eval.every=3"],
    "preset_robust_dpo": ["algorithm=robust_dpo", "data=prefs", "steps=6", "eval.every=3"],
    "preset_simpo": ["algorithm=simpo", "data=prefs", "steps=6", "eval.every=3"],
    "preset_mt_grpo": ["algorithm=mt_grpo", "env=corridor", "model.path=builtin:tiny_agent", "data.source=none",
                       "steps=4", "eval.every=2"],
    # rank 0 samples the global batch for two gloo processes (pipeline mode) and broadcasts it
    "rank_zero_ddp": ["hardware=ddp", "hardware.cpu=true", "hardware.num_processes=2", "rollout.max_staleness=1",
                      "rollout.correction=tis", "steps=4", "eval.every=2"],
    # a fleet of two fake vLLM servers (tests/fake_vllm.py, version-sensitive draws, a tail of lengths): partial
    # rollouts in rounds, pipeline mode, and rounds that overlap across steps; {fleet0} {fleet1} {work} are filled in
    "fleet_two_fakes": ["rollout=server", "rollout.server.urls=[{fleet0},{fleet1}]", "rollout.server.work_dir={work}",
                        "rollout.partial=true", "rollout.correction=tis", "rollout.partial_oversample=2",
                        "rollout.segment_tokens=2", "rollout.max_new_tokens=12", "rollout.max_staleness=1",
                        "rollout.server.invariance_probe_rows=0", "rollout.server.overlap_steps=true",
                        "algorithm.overlong_buffer=10", "steps=5", "eval.every=5"],
}
TIMING = ("perf/", "time", "rollout/overlap_")  # metric names holding wall-clock figures, and the speculative
# work of overlapping rounds (how much was drawn ahead and dropped follows thread timing; the rows trained do not:
# tests/test_overlap.py strips them too): never compared


def weights_digest(final: Path) -> dict:
    from safetensors.torch import load_file

    digest = {}
    for file in sorted(final.glob("*.safetensors")):
        for name, tensor in sorted(load_file(str(file)).items()):
            digest[name] = hashlib.sha256(tensor.contiguous().view(-1).view(dtype=__import__("torch").uint8)
                                          .numpy().tobytes()).hexdigest()
    return digest


def capture(out: Path, only: list[str] | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rlx = str(Path(sys.executable).parent / "rlx")
    for label, overrides in RUNS.items():
        if only and label not in only:
            continue
        run_dir = out / label
        fleet = []
        if any("{fleet" in o for o in overrides):  # fake servers on ports the OS picks, closed after the run
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.fake_vllm import FakeVLLM

            fleet = [FakeVLLM(versioned=True, tail=5) for _ in range(2)]
            fill = {"fleet0": fleet[0].url, "fleet1": fleet[1].url, "work": str(out / f"{label}_servers")}
            overrides = [o.format(**fill) if "{" in o else o for o in overrides]
        start = time.time()
        cmd = [rlx, "train", *overrides, "hardware.num_threads=1", "log.progress=false", "seed=0",
               f"hydra.run.dir={run_dir}"]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        finally:
            for fake in fleet:
                fake.close()
        (out / f"{label}.log").write_text(proc.stdout + proc.stderr)
        record = {"returncode": proc.returncode, "seconds": round(time.time() - start, 1),
                  "overrides": RUNS[label]}
        if proc.returncode == 0:
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
            record["metrics"] = [{k: v for k, v in row.items() if not any(t in k for t in TIMING)} for row in rows]
            if (run_dir / "final").is_dir():
                record["weights"] = weights_digest(run_dir / "final")
        (out / f"{label}.json").write_text(json.dumps(record))
        print(f"{label}: exit {proc.returncode} in {record['seconds']} s", flush=True)


def _max_metric_diff(before: list[dict], after: list[dict]) -> tuple[float, str, int]:
    worst, where, common = 0.0, "", 0
    if len(before) != len(after):
        return float("inf"), f"{len(before)} vs {len(after)} rows", 0
    for row_b, row_a in zip(before, after):
        for key in row_b.keys() & row_a.keys() - {k for k in row_b if any(t in k for t in TIMING)}:
            vb, va = row_b[key], row_a[key]
            if not isinstance(vb, (int, float)) or not isinstance(va, (int, float)):
                if vb != va:
                    return float("inf"), f"{key} at step {row_b.get('step')}: {vb!r} vs {va!r}", common
                continue
            common += 1
            diff = abs(float(vb) - float(va))
            if diff > worst or diff != diff:
                worst, where = diff, f"{key} at step {row_b.get('step')}"
    return worst, where, common


def compare(before_dir: Path, after_dir: Path, tolerance: float, only: list[str] | None = None) -> int:
    bad = 0
    for label in RUNS:
        if only and label not in only:
            continue
        fb, fa = before_dir / f"{label}.json", after_dir / f"{label}.json"
        if not fb.is_file() or not fa.is_file():
            print(f"{label:24s} missing on one side")
            continue
        b, a = json.loads(fb.read_text()), json.loads(fa.read_text())
        if b["returncode"] or a["returncode"]:
            print(f"{label:24s} exit codes {b['returncode']} / {a['returncode']}")
            bad += b["returncode"] != a["returncode"]
            continue
        worst, where, common = _max_metric_diff(b["metrics"], a["metrics"])
        wb, wa = b.get("weights", {}), a.get("weights", {})
        same_weights = wb == wa
        added = sorted({k for row in a["metrics"] for k in row} - {k for row in b["metrics"] for k in row})
        print(f"{label:24s} metrics: {common} values compared, max |diff| {worst:.3g} ({where or '-'}); "
              f"weights {'bit-identical' if same_weights else 'DIFFER'} ({len(wb)} tensors); "
              f"{b['seconds']} s -> {a['seconds']} s" + (f"; new metrics: {', '.join(added)}" if added else ""))
        bad += worst > tolerance or (not same_weights and tolerance == 0)
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("out", type=Path)
    cap.add_argument("--only", nargs="*")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("--tolerance", type=float, default=0.0)
    cmp_.add_argument("--only", nargs="*")
    args = parser.parse_args()
    if args.command == "capture":
        capture(args.out, args.only)
    else:
        raise SystemExit(compare(args.before, args.after, args.tolerance, args.only))


if __name__ == "__main__":
    main()
