"""Evaluation metrics: pass@k, maj@k, mean@k and bootstrap confidence intervals.

Everything here is pure numpy on per-problem numbers; benchmarks and samplers live elsewhere.

Conventions
- A benchmark has P problems; problem p was sampled n_p times and c_p of those samples were correct.
- "Per-problem values" are one number per problem (a pass@k, a maj@k score, a 0/1 accuracy...).
  The benchmark score is their mean, and its uncertainty comes from resampling *problems*
  (the unit that was drawn from a population), never individual samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

Statistic = Callable[..., np.ndarray]


# --------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem.  Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code" (Codex), eq. 1:

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that a random size-k subset of the n samples holds at least one of the c
    correct ones.  The binomials overflow for n in the hundreds, so we use the product form

        C(n - c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)

    (cancel the factorials: (n-c)! (n-k)! / (n! (n-c-k)!) = prod_{i=n-c+1}^{n} (i - k) / i).
    When n - c < k every size-k subset contains a correct sample and pass@k = 1.

    Example: n=5, c=2, k=2 -> 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7.
    """
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"number of correct samples c={c} must lie in [0, n={n}]")
    if k < 1:
        raise ValueError(f"k must be >= 1, got k={k}")
    if k > n:
        raise ValueError(
            f"pass@{k} is undefined with only n={n} samples per problem: draw at least k samples"
        )
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)  # (c,)
    return float(1.0 - np.prod(1.0 - k / i))


def pass_at_k_per_problem(
    num_samples: int | Sequence[int] | np.ndarray,
    num_correct: Sequence[int] | np.ndarray,
    k: int,
) -> np.ndarray:
    """pass@k for each problem.  num_samples: (P,) or one int shared by all problems;
    num_correct: (P,).  Returns (P,) float64; the benchmark pass@k is its mean."""
    correct = np.asarray(num_correct, dtype=np.int64).reshape(-1)  # (P,)
    samples = np.broadcast_to(np.asarray(num_samples, dtype=np.int64), correct.shape)  # (P,)
    return np.array([pass_at_k(int(n), int(c), k) for n, c in zip(samples, correct)])


# --------------------------------------------------------------------------------------------
# Voting and averaging over the samples of one problem
# --------------------------------------------------------------------------------------------


def majority_vote(
    answers: Sequence[str | None], scores: Sequence[float]
) -> tuple[str | None, float]:
    """Self-consistency vote over the samples of one problem.  Wang et al. 2022,
    "Self-Consistency Improves Chain of Thought Reasoning in Language Models".

    answers[i] is the extracted final answer of sample i (None when none could be extracted),
    scores[i] its score (usually 1.0 if correct else 0.0).  The winner is the most frequent
    non-None answer; a tie goes to the answer that appeared first.  Returns (winner, score),
    where score is the mean score of the samples that gave the winner (they agree whenever the
    score depends only on the answer).  If every answer is None: (None, 0.0).
    """
    if len(answers) != len(scores):
        raise ValueError(f"{len(answers)} answers but {len(scores)} scores")
    votes: dict[str, list[float]] = {}  # insertion order = first occurrence
    for answer, score in zip(answers, scores):
        if answer is not None:
            votes.setdefault(answer, []).append(float(score))
    if not votes:
        return None, 0.0
    # max() keeps the first of equal keys, and dict order is first-occurrence order.
    winner = max(votes, key=lambda answer: len(votes[answer]))
    return winner, float(np.mean(votes[winner]))


def _check_k(k: int, available: int) -> None:
    if not 1 <= k <= available:
        raise ValueError(f"k={k} must lie in [1, {available}] (the number of samples given)")


def maj_at_k(answers: Sequence[str | None], scores: Sequence[float], k: int) -> float:
    """maj@k: the score of the majority answer among the first k samples (see majority_vote).
    Using the first k (not a random subset) keeps it deterministic; samples are i.i.d. anyway."""
    _check_k(k, len(answers))
    return majority_vote(answers[:k], scores[:k])[1]


def mean_at_k(scores: Sequence[float], k: int) -> float:
    """mean@k: the average score of the first k samples (an estimate of pass@1 from k draws)."""
    _check_k(k, len(scores))
    return float(np.mean(np.asarray(scores[:k], dtype=np.float64)))


# --------------------------------------------------------------------------------------------
# Bootstrap over problems
# --------------------------------------------------------------------------------------------


class BootstrapCI(NamedTuple):
    point: float  # the statistic on the original problems
    low: float
    high: float


class BootstrapDiff(NamedTuple):
    diff: float  # statistic(a) - statistic(b) on the original problems
    low: float
    high: float
    frac_positive: float  # fraction of resamples with diff > 0


def _resample_indices(num_problems: int, n_resamples: int, seed: int) -> np.ndarray:
    if num_problems < 1:
        raise ValueError("the bootstrap needs at least one problem")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, num_problems, size=(n_resamples, num_problems))  # (R, P)


def _percentiles(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(stats, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_ci(
    per_problem_values: Sequence[float] | np.ndarray,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    statistic: Statistic = np.mean,
) -> BootstrapCI:
    """Percentile bootstrap interval over problems.  Efron & Tibshirani 1993, "An Introduction
    to the Bootstrap", ch. 13.

    Draw R resamples of the P problems with replacement, compute the statistic on each, and
    report the (1-confidence)/2 and (1+confidence)/2 quantiles of those R values.
    per_problem_values: (P,).  statistic must accept an `axis` keyword (np.mean, np.median);
    it is applied to a (R, P) array with axis=1 so the whole bootstrap is one vectorized call.
    Returns (point, low, high), point = statistic(per_problem_values).
    """
    values = np.asarray(per_problem_values, dtype=np.float64).reshape(-1)  # (P,)
    idx = _resample_indices(values.size, n_resamples, seed)  # (R, P)
    stats = statistic(values[idx], axis=1)  # (R,)
    low, high = _percentiles(stats, confidence)
    return BootstrapCI(float(statistic(values)), low, high)


def paired_bootstrap_diff(
    values_a: Sequence[float] | np.ndarray,
    values_b: Sequence[float] | np.ndarray,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    statistic: Statistic = np.mean,
) -> BootstrapDiff:
    """Paired percentile bootstrap for statistic(a) - statistic(b) when a and b were scored on
    the same P problems (values_a[p], values_b[p] belong to problem p).

    Each resample draws problem indices once and uses them for both systems, so problem
    difficulty, which both share, cancels; the interval is much tighter than from two
    independent bootstraps.  Koehn 2004, "Statistical Significance Tests for Machine
    Translation Evaluation", paired bootstrap resampling.

    Returns (diff, low, high, frac_positive).  frac_positive is the fraction of resamples with
    diff > 0, free once the resamples exist: near 1 means A beats B on almost every resampled
    benchmark (Koehn's "A is better with confidence frac_positive").  It is a bootstrap
    summary, not a p-value from a null-hypothesis test.
    """
    a = np.asarray(values_a, dtype=np.float64).reshape(-1)  # (P,)
    b = np.asarray(values_b, dtype=np.float64).reshape(-1)  # (P,)
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same problems: {a.size} vs {b.size}")
    idx = _resample_indices(a.size, n_resamples, seed)  # (R, P)
    diffs = statistic(a[idx], axis=1) - statistic(b[idx], axis=1)  # (R,)
    low, high = _percentiles(diffs, confidence)
    point = float(statistic(a) - statistic(b))
    return BootstrapDiff(point, low, high, float(np.mean(diffs > 0)))


# --------------------------------------------------------------------------------------------
# Does training narrow the support? Crossover k and solved-set changes (compare=)
# --------------------------------------------------------------------------------------------


def mean_pass_at_k(num_samples: Sequence[int] | np.ndarray, num_correct: Sequence[int] | np.ndarray, k: int) -> float:
    """The benchmark pass@k: the mean over problems of the unbiased per-problem pass@k."""
    return float(np.mean(pass_at_k_per_problem(num_samples, num_correct, k)))


def crossover_k(model_samples, model_correct, base_samples, base_correct,
                ks: Sequence[int] | None = None) -> int | None:
    """The smallest k at which the base model's pass@k reaches the trained model's (base >= trained), the
    crossover of Yue et al. 2025 ("Does Reinforcement Learning Really Incentivize Reasoning Capacity in
    LLMs Beyond the Base Model?"): RL raises pass@1 but the base catches up and overtakes at large k.
    Both on the same problems (arrays aligned by problem). ks: the k tried, ascending (default 1..n_min,
    n_min the fewest samples any problem has). 1 when the base is never behind; None when the trained
    model stays ahead at every k tried. Example: trained c = [2, 2] of n = 2, base c = [2, 0] of 2:
    pass@1 1.0 vs 0.5, pass@2 1.0 vs 0.5 -> None; base c = [1, 1]: pass@1 0.5, pass@2 1.0 -> k = 2."""
    smallest = int(min(np.min(model_samples), np.min(base_samples)))
    for k in (list(ks) if ks is not None else range(1, smallest + 1)):
        if mean_pass_at_k(base_samples, base_correct, k) >= mean_pass_at_k(model_samples, model_correct, k):
            return int(k)
    return None


def solved_set_changes(model_correct, base_correct) -> dict[str, int]:
    """How the set of problems solved at least once (pass@n, n = all samples drawn) changed from the base
    to the trained model (the support shrinkage / expansion of Yue et al. 2025 and "The Invisible Leash"):
      shrink  solved by the base only          expand  solved by the trained model only
      both    solved by both                   neither solved by neither
    model_correct, base_correct: (P,) correct-sample counts per problem, aligned by problem."""
    model = np.asarray(model_correct).reshape(-1) > 0
    base = np.asarray(base_correct).reshape(-1) > 0
    if model.shape != base.shape:
        raise ValueError(f"solved sets need the same problems: {model.size} vs {base.size}")
    return {"shrink": int((base & ~model).sum()), "expand": int((model & ~base).sum()),
            "both": int((model & base).sum()), "neither": int((~model & ~base).sum())}


# --------------------------------------------------------------------------------------------
# A suite: the macro mean over benchmarks, resampled benchmark by benchmark
# --------------------------------------------------------------------------------------------


def macro_mean_ci(
    per_benchmark: Sequence[tuple[np.ndarray, np.ndarray | None]],
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[BootstrapCI, BootstrapDiff | None]:
    """The mean over B benchmarks of each benchmark's mean (every benchmark weighs the same, however many problems it
    has), with a stratified percentile bootstrap: each resample redraws the problems of every benchmark within that
    benchmark (the benchmarks themselves are fixed). per_benchmark: (a, b) per benchmark, a the model's (P_b,) values
    and b the paired compare= model's (P_b,) values on the same problems, or None; the difference of the macro means
    uses the same resampled problems for both (paired_bootstrap_diff, benchmark by benchmark).
    Returns (the model's macro mean and interval, the paired difference or None when any b is None)."""
    paired = all(b is not None for _, b in per_benchmark)
    means_a, means_d = np.zeros(n_resamples), np.zeros(n_resamples)
    for index, (a, b) in enumerate(per_benchmark):
        a = np.asarray(a, dtype=np.float64).reshape(-1)
        idx = _resample_indices(a.size, n_resamples, seed + index)  # (R, P_b)
        means_a += a[idx].mean(axis=1) / len(per_benchmark)
        if paired:
            b = np.asarray(b, dtype=np.float64).reshape(-1)
            means_d += (a[idx].mean(axis=1) - b[idx].mean(axis=1)) / len(per_benchmark)
    point = float(np.mean([np.mean(a) for a, _ in per_benchmark]))
    value = BootstrapCI(point, *_percentiles(means_a, confidence))
    if not paired:
        return value, None
    diff = float(np.mean([np.mean(a) - np.mean(b) for a, b in per_benchmark]))
    return value, BootstrapDiff(diff, *_percentiles(means_d, confidence), float(np.mean(means_d > 0)))
