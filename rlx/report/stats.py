"""Multi-run aggregation: IQM, stratified bootstrap intervals, probability of improvement,
mean curves with confidence bands.  Pure numpy, no scipy.

Follows Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical
Precipice" (NeurIPS), sections 4-5.  Where this module departs from the paper's reference code:
- A statistic is computed on the pooled scores of all (run, task) pairs.  For "iqm" this is the
  paper's definition.  For "mean" it equals the paper's mean of per-task means when every task has
  the same number of runs; "median" is the median of the pooled scores, not the paper's median of
  per-task means.
- Non-finite scores raise ValueError instead of propagating NaN into every bootstrap sample.

Shapes: a "scores" argument is one of
  dict task -> (runs,)     runs may differ between tasks,
  (runs, tasks) array      one column per task,
  (runs,) array            a single task.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

Scores = Mapping[str, ArrayLike] | ArrayLike
Statistic = str | Callable[[np.ndarray], float]


def iqm(values: ArrayLike) -> float:
    """Interquartile mean: the mean of the sorted values left after cutting k = floor(n / 4) from
    each end, n = number of values.  Any shape is flattened first, so (runs, tasks) pools all scores.

    Computed by scipy.stats.trim_mean(x, 0.25), which cuts k = floor(0.25 * n), the paper's
    definition: n = 8 keeps the middle 4, n = 10 keeps the middle 6 (2 cut from each end),
    n = 5 keeps the middle 3, n <= 3 keeps everything.
    """
    from scipy.stats import trim_mean

    return float(trim_mean(_finite_1d(values, "values"), 0.25))


def stratified_bootstrap_ci(
    scores: Scores,
    statistic: Statistic = "iqm",
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Point estimate and percentile bootstrap interval of an aggregate statistic over runs.

    Each resample draws, independently for every task (stratum), as many runs as that task has,
    with replacement, then applies `statistic` to the pooled resampled scores.  The interval is
    [q(alpha/2), q(1 - alpha/2)] of the n_resamples statistics, alpha = 1 - confidence, with
    numpy's linear-interpolation percentile.  Agarwal et al. 2021, section 4 (stratified bootstrap).

    statistic: "iqm" | "mean" | "median", or any callable flat array -> float.
    Returns (point, low, high), point = statistic of the original scores.
    """
    _check_bootstrap_args(n_resamples, confidence)
    stat_fn = _resolve_statistic(statistic)
    strata = _strata(scores)
    rng = np.random.default_rng(seed)
    resampled = np.concatenate(
        [
            runs[rng.integers(0, runs.size, size=(n_resamples, runs.size))]
            for runs in strata.values()
        ],
        axis=1,
    )  # (n_resamples, total runs)
    boot = np.array([stat_fn(row) for row in resampled])  # (n_resamples,)
    point = float(stat_fn(np.concatenate(list(strata.values()))))
    low, high = _percentile_interval(boot, confidence)
    return point, low, high


def probability_of_improvement(x: Scores, y: Scores) -> float:
    """P(X > Y) + 0.5 P(X = Y) for a score X of algorithm x and Y of algorithm y.

    Per task: (1 / (n m)) sum_i sum_j ([x_i > y_j] + 0.5 [x_i = y_j]), the Mann-Whitney U statistic
    divided by n m.  Over several tasks, the unweighted mean of the per-task values.
    Agarwal et al. 2021, section 5 ("probability of improvement").
    x, y: scores with the same tasks (dict keys or number of columns); runs may differ.
    """
    x_strata, y_strata = _paired_strata(x, y)
    return float(
        np.mean([_improvement(x_strata[task], y_strata[task]) for task in x_strata])
    )


def probability_of_improvement_ci(
    x: Scores,
    y: Scores,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """probability_of_improvement with a stratified percentile bootstrap interval.

    Each resample draws, per task, the runs of x and the runs of y independently with replacement,
    then averages the per-task probabilities.  Interval as in stratified_bootstrap_ci.
    Returns (point, low, high).
    """
    _check_bootstrap_args(n_resamples, confidence)
    x_strata, y_strata = _paired_strata(x, y)
    rng = np.random.default_rng(seed)
    per_task = []
    for task in x_strata:
        x_runs, y_runs = x_strata[task], y_strata[task]
        x_boot = x_runs[
            rng.integers(0, x_runs.size, size=(n_resamples, x_runs.size))
        ]  # (R, n)
        y_boot = y_runs[
            rng.integers(0, y_runs.size, size=(n_resamples, y_runs.size))
        ]  # (R, m)
        per_task.append(_improvement(x_boot, y_boot))  # (R,)
    boot = np.mean(per_task, axis=0)  # (R,)
    low, high = _percentile_interval(boot, confidence)
    return probability_of_improvement(x, y), low, high


def align_curves(
    curves: Sequence[tuple[ArrayLike, ArrayLike]],
) -> tuple[np.ndarray, np.ndarray]:
    """Put per-seed curves on their common steps.

    curves: one (steps, values) pair per seed, e.g. read from each seed's metrics.jsonl.
    Keeps only the steps every seed logged (the intersection), sorted ascending, so a run that
    crashed early truncates the aggregate instead of silently changing the number of seeds
    mid-curve.  A step logged twice by one seed (a resumed run) keeps its last value.
    Returns (steps (S,), values (seeds, S)).  Raises ValueError when no step is shared.
    """
    if len(curves) == 0:
        raise ValueError("curves is empty")
    per_seed = []
    for steps, values in curves:
        steps, values = np.ravel(steps), np.ravel(np.asarray(values, dtype=float))
        if steps.size != values.size:
            raise ValueError(f"a curve has {steps.size} steps but {values.size} values")
        per_seed.append(
            dict(zip(steps.tolist(), values.tolist()))
        )  # later duplicates win
    common = sorted(set.intersection(*(set(seed) for seed in per_seed)))
    if not common:
        raise ValueError("the curves share no step")
    matrix = np.array(
        [[seed[step] for step in common] for seed in per_seed], dtype=float
    )
    return np.array(common), matrix


def mean_and_band(
    curves: ArrayLike | Sequence[tuple[ArrayLike, ArrayLike]],
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds and a Student-t confidence band for that mean, step by step.

    band = mean +- t_{n-1} * s / sqrt(n), s = sample std (ddof=1) over the n seeds,
    t_{n-1} = t_critical_value(confidence, n - 1).  It is an interval for the mean, not the
    spread of the seeds.  With one seed the band collapses onto the mean.  NaN values propagate.

    curves: a (seeds, steps) array, or one (steps, values) pair per seed, aligned on the steps all
    seeds share (see align_curves, which also returns those steps).
    Returns (mean, low, high), each (steps,).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if _is_pairs(curves):
        _, matrix = align_curves(curves)
    else:
        matrix = np.asarray(curves, dtype=float)
        if matrix.ndim == 1:
            matrix = matrix[None, :]  # a single seed
        if matrix.ndim != 2 or matrix.size == 0:
            raise ValueError(
                f"expected a non-empty (seeds, steps) array, got shape {matrix.shape}"
            )
    n_seeds = matrix.shape[0]
    mean = matrix.mean(axis=0)  # (steps,)
    if n_seeds == 1:
        return mean, mean.copy(), mean.copy()
    half_width = (
        t_critical_value(confidence, n_seeds - 1)
        * matrix.std(axis=0, ddof=1)
        / math.sqrt(n_seeds)
    )
    return mean, mean - half_width, mean + half_width


def seed_band(
    curves: Sequence[tuple[ArrayLike, ArrayLike]], confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None:
    """The band drawn for a configuration's seeds (rlx report's curves.png, rlx view's curves): align_curves
    then mean_and_band.  Returns (steps, mean, low, high, seeds), each array (S,), or None when a curve is
    empty or the curves share no step."""
    if not curves or any(len(steps) == 0 for steps, _ in curves):
        return None
    try:
        steps, matrix = align_curves(curves)  # (S,), (seeds, S)
    except ValueError:
        return None
    mean, low, high = mean_and_band(matrix, confidence)
    return steps, mean, low, high, matrix.shape[0]


def t_critical_value(confidence: float, df: int) -> float:
    """Two-sided Student-t critical value t with P(|T| <= t) = confidence, T ~ t(df): the
    (1 + confidence) / 2 quantile of t(df), from scipy.stats.t.
    E.g. confidence 0.95: df=1 -> 12.7062, df=2 -> 4.3027, df=3 -> 3.1824, df=30 -> 2.0423.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if int(df) != df or df < 1:
        raise ValueError(f"df must be a positive integer, got {df}")
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2.0, int(df)))


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray | float:
    """Mean over all pairs of [x_i > y_j] + 0.5 [x_i = y_j].  x (..., n), y (..., m) -> (...)."""
    x_col, y_row = x[..., :, None], y[..., None, :]  # (..., n, 1), (..., 1, m)
    wins = (x_col > y_row).mean(axis=(-2, -1))
    ties = (x_col == y_row).mean(axis=(-2, -1))
    return wins + 0.5 * ties


def _resolve_statistic(statistic: Statistic) -> Callable[[np.ndarray], float]:
    named = {"iqm": iqm, "mean": np.mean, "median": np.median}
    if callable(statistic):
        return statistic
    if statistic not in named:
        raise ValueError(
            f"statistic must be one of {sorted(named)} or a callable, got {statistic!r}"
        )
    return named[statistic]


def _strata(scores: Scores) -> dict[str, np.ndarray]:
    """Scores as task -> finite (runs,) array; columns of a 2-D array are named "0", "1", ..."""
    if isinstance(scores, Mapping):
        if not scores:
            raise ValueError("scores has no task")
        return {
            str(task): _finite_1d(runs, f"scores[{task!r}]")
            for task, runs in scores.items()
        }
    array = np.asarray(scores, dtype=float)
    if array.ndim == 1:
        return {"0": _finite_1d(array, "scores")}
    if array.ndim != 2:
        raise ValueError(
            f"scores must be (runs,) or (runs, tasks), got shape {array.shape}"
        )
    return {
        str(task): _finite_1d(array[:, task], f"scores[:, {task}]")
        for task in range(array.shape[1])
    }


def _paired_strata(
    x: Scores, y: Scores
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    x_strata, y_strata = _strata(x), _strata(y)
    if set(x_strata) != set(y_strata):
        raise ValueError(
            f"x and y cover different tasks: {sorted(x_strata)} vs {sorted(y_strata)}"
        )
    return x_strata, y_strata


def _finite_1d(values: ArrayLike, name: str) -> np.ndarray:
    flat = np.ravel(np.asarray(values, dtype=float))
    if flat.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(flat)):
        raise ValueError(f"{name} contains NaN or inf")
    return flat


def _check_bootstrap_args(n_resamples: int, confidence: float) -> None:
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _percentile_interval(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    low, high = np.percentile(boot, [100.0 * alpha / 2, 100.0 * (1 - alpha / 2)])
    return float(low), float(high)


def _is_pairs(curves: object) -> bool:
    """True for a list of (steps, values) pairs, False for a (seeds, steps) matrix."""
    if (
        isinstance(curves, np.ndarray)
        or not isinstance(curves, Sequence)
        or len(curves) == 0
    ):
        return False
    first = curves[0]
    return (
        isinstance(first, (tuple, list)) and len(first) == 2 and np.ndim(first[0]) == 1
    )
