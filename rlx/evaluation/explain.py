"""Plain-language notes printed under `rlx eval`'s table, where two of its metrics look alike but measure
different things."""

from __future__ import annotations


def metric_notes(summary: dict) -> list[str]:
    """Lines explaining the metrics of `summary` (rlx/evaluation/runner.py: summarize) that a reader would
    otherwise take for the same number. mean@k is the mean score of each problem's FIRST k samples, so mean@1
    reads one sample; pass@k is the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k) over all
    n samples, so pass@1 = c / n. Both estimate the one-sample success rate, from 1 and from n samples, and
    differ by sampling noise (and where scores are partial: pass counts scores >= metrics.correct_threshold)."""
    names = {name for result in summary.get("benchmarks", {}).values() for name in result.get("model", {})}
    notes = []
    if "mean@1" in names and "pass@1" in names:
        n = summary.get("sampling", {}).get("n")
        of_n = f"all n={n}" if n else "all n"
        notes.append("mean@k: mean score of each problem's first k samples (mean@1 reads one sample); pass@k: "
                     f"unbiased estimate from {of_n} samples that one of k passes (pass@1 = passing samples / n). "
                     "mean@1 and pass@1 estimate the same rate from 1 and from n samples, so they differ by sampling "
                     "noise.")
    if "greedy/accuracy" in names and "pass@1" in names:
        notes.append("greedy/accuracy: one greedy (temperature 0) completion per problem; pass@k and mean@k use the "
                     "sampled completions (sampling.temperature).")
    return notes


def headline_line(summary: dict) -> str:
    """`chain_sum greedy/accuracy=0.5000  gsm8k pass@1=0.1200`: each benchmark's headline metric (greedy
    accuracy, else pass@1; with env=: greedy success, else success), for the closing `done:` line."""
    parts = []
    for bench, result in summary.get("benchmarks", {}).items():
        name = next((n for n in (result.get("headline"), "greedy/accuracy", "greedy/success", "pass@1", "success")
                     if n in result["model"]), None)
        if name is not None:
            parts.append(f"{bench} {name}={result['model'][name]['value']:.4f}")
    return "  ".join(parts)
