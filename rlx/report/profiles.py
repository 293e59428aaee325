"""Performance profiles and the optimality gap over runs, with stratified bootstrap bands.  Pure numpy.

Definitions of Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical Precipice", section 4.2 and
5), as the authors' library rliable computes them (rliable/library.py run_score_deviation and
create_performance_profile; rliable/metrics.py aggregate_optimality_gap):
  performance profile (score distribution)  F(tau) = (1 / (N M)) sum_{n, m} 1[x_{n,m} > tau]
                                            the fraction of (run, task) scores above tau
  optimality gap                            OG = gamma - (1 / (N M)) sum_{n, m} min(x_{n,m}, gamma)
                                            how far the runs fall short of a target gamma on average
Both pool every (run, task) score; bands come from the stratified bootstrap of rlx.report.stats (runs
resampled within each task). Shapes of `scores` as in rlx.report.stats.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from rlx.report.stats import Scores, _check_bootstrap_args, _percentile_interval, _strata


def performance_profile(scores: Scores, taus: ArrayLike) -> np.ndarray:
    """F(tau) for each tau: the fraction of pooled scores strictly above tau. Example: scores
    [0.2, 0.5, 0.5, 0.9], taus [0, 0.5, 0.9] -> [1.0, 0.25, 0.0]. Returns (len(taus),)."""
    pooled = np.concatenate(list(_strata(scores).values()))  # (runs over all tasks,)
    return (pooled[None, :] > np.asarray(taus, dtype=float)[:, None]).mean(axis=1)


def optimality_gap(scores: Scores, gamma: float = 1.0) -> float:
    """gamma - mean(min(x, gamma)) over the pooled scores. Example: [0.2, 0.5, 1.3], gamma 1 ->
    1 - (0.2 + 0.5 + 1.0) / 3 = 0.4333. Lower is better; scores above gamma earn nothing more."""
    pooled = np.concatenate(list(_strata(scores).values()))
    return float(gamma - np.minimum(pooled, gamma).mean())


def _bootstrap_pools(scores: Scores, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, total runs): each row resamples the runs of every task with replacement (stratified)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([runs[rng.integers(0, runs.size, size=(n_resamples, runs.size))]
                           for runs in _strata(scores).values()], axis=1)


def performance_profile_ci(scores: Scores, taus: ArrayLike, n_resamples: int = 2000, confidence: float = 0.95,
                           seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The profile and a pointwise stratified percentile bootstrap band. Returns (profile, low, high),
    each (len(taus),)."""
    _check_bootstrap_args(n_resamples, confidence)
    taus = np.asarray(taus, dtype=float)
    boot = (_bootstrap_pools(scores, n_resamples, seed)[:, None, :] > taus[None, :, None]).mean(axis=2)  # (R, T)
    bounds = [_percentile_interval(boot[:, i], confidence) for i in range(taus.size)]
    low, high = (np.array(b) for b in zip(*bounds)) if bounds else (np.zeros(0), np.zeros(0))
    return performance_profile(scores, taus), low, high


def optimality_gap_ci(scores: Scores, gamma: float = 1.0, n_resamples: int = 2000, confidence: float = 0.95,
                      seed: int = 0) -> tuple[float, float, float]:
    """optimality_gap with a stratified percentile bootstrap interval: (point, low, high)."""
    _check_bootstrap_args(n_resamples, confidence)
    boot = gamma - np.minimum(_bootstrap_pools(scores, n_resamples, seed), gamma).mean(axis=1)  # (R,)
    low, high = _percentile_interval(boot, confidence)
    return optimality_gap(scores, gamma), low, high


def default_taus(groups_scores: list[np.ndarray], points: int = 51) -> np.ndarray:
    """An even grid from the smallest to the largest score of every configuration (the x-axis of a plot)."""
    pooled = np.concatenate([np.ravel(s) for s in groups_scores]) if groups_scores else np.zeros(1)
    low, high = float(pooled.min()), float(pooled.max())
    return np.linspace(low, high if high > low else low + 1.0, points)
