"""The seed ideas' ablation table (docs/algorithms/seed-ideas.md, "Proof of value"), from the runs of
`rlx sweep seed_ablation`: per row, the option's recipe against its baseline's on the same steps, 5 seeds each.

    rlx sweep seed_ablation recipes=A,B,...   (two shells side by side, each a subset; conf/sweep/seed_ablation.yaml)
    python benchmarks/seed_ablation.py SWEEP_DIR [SWEEP_DIR ...] [--out benchmarks/results/seed_ablation.json]
    python benchmarks/seed_ablation.py --rows smollm2 SWEEP_DIR ...
        (the real model's rows: rlx sweep smollm2_seed_ablation)

Per row: the final held-out score of each seed (eval/accuracy greedy on 200 questions, or eval/success of 100
sampled episodes), its IQM with a stratified bootstrap 95% interval, the probability of improvement
P(option > baseline) with its bootstrap interval (rlx/report/stats.py, Agarwal et al. 2021), and the mechanism
metric that shows the option acted: its mean over the training steps of each run, averaged over seeds, for the
option and for the baseline (where the baseline logs it). Writes the JSON and prints the markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
from pathlib import Path

from rlx.report.runs import find_runs
from rlx.report.stats import probability_of_improvement_ci, stratified_bootstrap_ci

# option, its recipe, the baseline's recipe, the final metric, the mechanism metric and what it shows
ROWS = [
    ("NGRPO", "seed_ngrpo_tiny", "seed_grpo_hard_tiny", "eval/accuracy", "train/ngrpo_dead_groups_revived",
     "share of all-wrong groups that carry a gradient"),
    ("hints, prefix (continuation)", "seed_hints_prefix_tiny", "seed_grpo_hard_tiny", "eval/accuracy",
     "hints/rescued_frac", "share of all-fail groups rescued by a hinted re-sample"),
    ("hints, in the prompt (Guide ratio)", "seed_hints_guide_tiny", "seed_grpo_hard_tiny", "eval/accuracy",
     "hints/rescued_frac", "share of all-fail groups rescued by a hinted re-sample"),
    ("hints, in the prompt, + dual clip 3", "seed_hints_guide_dualclip_tiny", "seed_grpo_hard_tiny", "eval/accuracy",
     "hints/rescued_frac", "share of all-fail groups rescued by a hinted re-sample"),
    ("unlikeliness reward", "seed_unlikeliness_tiny", "seed_grpo_hard_tiny", "eval/accuracy",
     "shaping/unlikeliness_delta_abs", "mean |reward change| from the likelihood rank"),
    ("A-GRAE", "seed_agrae_tiny", "seed_grpo_hard_tiny", "eval/accuracy", "transform/agrae_delta_abs",
     "mean |advantage change|"),
    ("EAD (annealed decoding)", "seed_ead_tiny", "seed_grpo_hard_tiny", "eval/accuracy", "rollout/temperature_mean",
     "mean sampling temperature of the sampled tokens"),
    ("EAD, decay scaled to short answers", "seed_ead_scaled_tiny", "seed_grpo_hard_tiny", "eval/accuracy",
     "rollout/temperature_mean", "mean sampling temperature of the sampled tokens"),
    ("noisy verifier + backward correction", "seed_noisy_backward_tiny", "seed_noisy_tiny", "eval/accuracy",
     "shaping/noise_backward_delta_abs", "mean |reward change| of the correction"),
    ("noisy verifier (30% FN, 10% FP), uncorrected", "seed_noisy_tiny", "seed_grpo_hard_tiny", "eval/accuracy",
     "noise/flipped_frac", "share of verdicts flipped"),
    ("replay into all-wrong groups", "seed_replay_tiny", "seed_grpo_small_tiny", "eval/accuracy",
     "replay/filled_frac", "share of all-wrong groups given a buffered correct sample"),
    ("learnability prompt sampling", "seed_learnability_tiny", "seed_grpo_small_tiny", "eval/accuracy",
     "train/frac_zero_std_groups", "share of groups with tied rewards (no signal)"),
    ("G-RA (gated step rewards)", "seed_gra_tiny", "seed_progress_corridor_tiny", "eval/success", "env/gated_frac",
     "share of episodes whose step rewards were cut"),
    ("HGPO (history-consistent groups)", "seed_hgpo_grid_tiny", "gigpo_grid_tiny", "eval/success",
     "env/hgpo_depth_used", "mean deepest usable history level"),
]


# the same options on a real model, SmolLM2-135M-Instruct (docs/real-model-laptop.md; rlx sweep smollm2_seed_ablation):
# chain_sum with 3 terms, groups of 4, 12 steps, 3 seeds
SMOLLM2_ROWS = [
    ("replay into all-wrong groups", "smollm2_replay_chain_sum3", "smollm2_grpo_chain_sum3", "eval/accuracy",
     "replay/filled_frac", "share of all-wrong groups given a buffered correct sample"),
    ("NGRPO", "smollm2_ngrpo_chain_sum3", "smollm2_grpo_chain_sum3", "eval/accuracy",
     "train/ngrpo_dead_groups_revived", "share of all-wrong groups that carry a gradient"),
    ("hints, prefix (continuation)", "smollm2_hints_chain_sum3", "smollm2_grpo_chain_sum3", "eval/accuracy",
     "hints/rescued_frac", "share of all-fail groups rescued by a hinted re-sample"),
    ("noisy verifier (30% FN, 10% FP), uncorrected", "smollm2_noisy_chain_sum3", "smollm2_grpo_chain_sum3",
     "eval/accuracy", "noise/flipped_frac", "share of verdicts flipped"),
    ("noisy verifier + backward correction", "smollm2_noisy_backward_chain_sum3", "smollm2_noisy_chain_sum3",
     "eval/accuracy", "shaping/noise_backward_delta_abs", "mean |reward change| of the correction"),
]
ROW_SETS = {"tiny": (ROWS, "seed_ablation"), "smollm2": (SMOLLM2_ROWS, "smollm2_seed_ablation")}


def recipe_of(run) -> str | None:
    for item in run.overrides:
        if item.startswith("recipes="):
            return item.split("=", 1)[1]
    return None


def mechanism(runs, metric: str) -> float | None:
    """Mean over seeds of each run's mean of `metric` over its logged training steps (None: never logged)."""
    means = []
    for run in runs:
        _, values = run.curve(metric)
        if values:
            means.append(statistics.fmean(values))
    return statistics.fmean(means) if means else None


def samples_per_step(runs) -> float | None:
    """Mean over steps and seeds of the completions (or episodes) generated per step: the prompts drawn x G, plus
    the hinted re-samples (hints/hinted_groups x algorithm.hints.samples): the budget each row spends."""
    from omegaconf import OmegaConf

    means = []
    for run in runs:
        config = OmegaConf.load(run.path / "config.yaml")
        group, hint_samples = config.rollout.samples_per_prompt, OmegaConf.select(config, "algorithm.hints.samples")
        per_step = []
        for row in run.rows:
            if "train/loss" not in row:
                continue
            drawn = row.get("train/prompts_drawn", config.prompts_per_step) * group
            per_step.append(drawn + row.get("hints/hinted_groups", 0) * (hint_samples or 0))
        if per_step:
            means.append(statistics.fmean(per_step))
    return statistics.fmean(means) if means else None


def evaluated_to_the_end(run, metric: str) -> bool:
    """A run counts when it did not fail, or when it failed only after its last step's evaluation was logged (a
    final checkpoint that could not be written, say): its final score is then the one a clean run would report."""
    if not run.failed:
        return True
    from omegaconf import OmegaConf

    steps, _ = run.curve(metric)
    last = OmegaConf.load(run.path / "config.yaml").steps
    if steps and steps[-1] >= last:
        print(f"note: {run.path} failed after its step-{last} evaluation ({run.failed[:80]}); its {metric} is kept")
        return True
    return False


def finals(runs, metric: str) -> list[float]:
    return [v for v in (r.final_value(metric) for r in sorted(runs, key=lambda r: r.seed or 0)
                        if evaluated_to_the_end(r, metric)) if v is not None]


def table(rows: list[dict]) -> str:
    def f(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = ["| option (recipe) | vs baseline (recipe) | metric | option IQM [95% CI] | baseline IQM [95% CI] | "
             "P(option > baseline) [95% CI] | mechanism metric: option / baseline | samples per step |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, b = r["option"], r["baseline"]
        lines.append(
            f"| {r['label']} (`{o['recipe']}`) | `{b['recipe']}` | {r['metric']} | "
            f"{f(o['iqm'])} [{f(o['ci'][0])}, {f(o['ci'][1])}] | {f(b['iqm'])} [{f(b['ci'][0])}, {f(b['ci'][1])}] | "
            f"{f(r['p_improvement'], 2)} [{f(r['p_ci'][0], 2)}, {f(r['p_ci'][1], 2)}] | "
            f"`{r['mechanism']}` {f(o['mechanism'])} / {f(b['mechanism'])} | "
            f"{f(o['samples_per_step'], 0)} / {f(b['samples_per_step'], 0)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--rows", choices=sorted(ROW_SETS), default="tiny",
                        help="tiny: the 0.9M model's table; "
                             "smollm2: the real model's (rlx sweep smollm2_seed_ablation)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: benchmarks/results/<sweep>.json (seed_ablation or smollm2_seed_ablation)")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    row_set, sweep = ROW_SETS[args.rows]
    out = args.out or Path(f"benchmarks/results/{sweep}.json")
    by_recipe: dict[str, list] = {}
    for run in find_runs(args.dirs):
        by_recipe.setdefault(recipe_of(run), []).append(run)
    rows = []
    for label, option, baseline, metric, mech, meaning in row_set:
        if option not in by_recipe or baseline not in by_recipe:
            print(f"skipped {label}: no runs of {option if option not in by_recipe else baseline}")
            continue
        sides = {}
        for side, recipe in (("option", option), ("baseline", baseline)):
            runs = by_recipe[recipe]
            values = finals(runs, metric)
            if not values:
                break
            iqm, low, high = stratified_bootstrap_ci(values, "iqm", n_resamples=args.resamples)
            _, start = runs[0].curve(metric)
            sides[side] = {"recipe": recipe, "seeds": len(values), "finals": values, "iqm": iqm, "ci": [low, high],
                           "mean": statistics.fmean(values), "start": start[0] if start else None,
                           "mechanism": mechanism(runs, mech), "samples_per_step": samples_per_step(runs),
                           "failed": sum(bool(r.failed) for r in runs)}
        if len(sides) < 2:
            print(f"skipped {label}: no finished runs of {option if 'option' not in sides else baseline}")
            continue
        p, p_low, p_high = probability_of_improvement_ci(sides["option"]["finals"], sides["baseline"]["finals"],
                                                         n_resamples=args.resamples)
        rows.append({"label": label, "metric": metric, "mechanism": mech, "mechanism_meaning": meaning,
                     "p_improvement": p, "p_ci": [p_low, p_high], **sides})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"date": datetime.date.today().isoformat(), "commit": commit,
              "command": f"rlx sweep {sweep} (two subsets side by side, one thread per run); "
                         f"python benchmarks/seed_ablation.py --rows {args.rows} SWEEP_DIRS",
              "machine": "2 shared CPU cores, torch CPU, one thread per run", "bootstrap_resamples": args.resamples,
              "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    markdown = table(rows)
    out.with_suffix(".md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
