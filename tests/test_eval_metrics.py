"""Evaluation metrics against hand-derived numbers (derivations in the comments)."""

import math

import numpy as np
import pytest

from rlx.evaluation.metrics import (
    bootstrap_ci,
    maj_at_k,
    majority_vote,
    mean_at_k,
    paired_bootstrap_diff,
    pass_at_k,
    pass_at_k_per_problem,
)

# --------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # pass@1 = c/n = 2/5
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (4, 1, 3, 0.75),  # 1 - C(3,3)/C(4,3) = 1 - 1/4
        (5, 0, 3, 0.0),  # no correct sample
        (5, 4, 2, 1.0),  # n-c = 1 < k: every pair holds a correct sample
        (5, 5, 5, 1.0),
        (200, 1, 1, 1 / 200),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_exact_binomials_for_large_n():
    # math.comb is exact integer arithmetic; the product form must agree without overflowing.
    n, c, k = 1000, 37, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-10)


def test_pass_at_1_is_fraction_correct():
    for n in range(1, 12):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_rejects_k_larger_than_n():
    with pytest.raises(ValueError, match=r"pass@6 is undefined with only n=5"):
        pass_at_k(5, 2, 6)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (0, 0, 1)])
def test_pass_at_k_rejects_invalid_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_k_per_problem():
    out = pass_at_k_per_problem([5, 5, 5, 10], [0, 2, 5, 3], k=2)
    # 1 - C(7,2)/C(10,2) = 1 - 21/45 = 24/45
    np.testing.assert_allclose(out, [0.0, 0.7, 1.0, 24 / 45])
    np.testing.assert_allclose(pass_at_k_per_problem(5, [0, 2], k=1), [0.0, 0.4])


# --------------------------------------------------------------------------------------------
# maj@k / mean@k
# --------------------------------------------------------------------------------------------


def test_majority_vote_tie_goes_to_first_occurrence():
    # "4" and "5" both get two votes; "4" appeared first.
    answers = ["4", "5", "4", None, "5"]
    scores = [1.0, 0.0, 1.0, 0.0, 0.0]
    assert majority_vote(answers, scores) == ("4", 1.0)
    # Reversing the order makes "5" first.
    assert majority_vote(answers[::-1], scores[::-1]) == ("5", 0.0)


def test_majority_vote_none_never_wins():
    assert majority_vote([None, None, None, "3"], [0, 0, 0, 1]) == ("3", 1.0)
    assert majority_vote([None, None], [0.5, 0.5]) == (None, 0.0)
    assert majority_vote([], []) == (None, 0.0)


def test_majority_vote_score_is_mean_over_the_winners_samples():
    assert majority_vote(["a", "b", "a"], [1.0, 0.0, 0.5]) == ("a", 0.75)


def test_majority_vote_length_mismatch():
    with pytest.raises(ValueError):
        majority_vote(["a"], [1.0, 0.0])


def test_maj_at_k_uses_first_k_samples():
    answers = ["a", "b", "b", "a", "a"]
    scores = [0.0, 1.0, 1.0, 0.0, 0.0]
    assert maj_at_k(answers, scores, k=1) == 0.0  # "a"
    assert maj_at_k(answers, scores, k=3) == 1.0  # "b" 2 votes vs "a" 1
    assert maj_at_k(answers, scores, k=4) == 0.0  # tie 2-2 -> "a" came first
    assert maj_at_k(answers, scores, k=5) == 0.0  # "a" 3 votes
    with pytest.raises(ValueError):
        maj_at_k(answers, scores, k=6)


def test_mean_at_k():
    assert mean_at_k([1, 0, 1, 1], k=2) == 0.5
    assert mean_at_k([1, 0, 1, 1], k=4) == 0.75
    with pytest.raises(ValueError):
        mean_at_k([1, 0], k=3)


# --------------------------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------------------------


def test_bootstrap_constant_values_have_zero_width():
    assert bootstrap_ci(np.full(20, 0.25), n_resamples=200) == (0.25, 0.25, 0.25)


def test_bootstrap_is_deterministic_and_brackets_the_point():
    values = np.random.default_rng(1).random(50)
    first = bootstrap_ci(values, n_resamples=500, seed=3)
    assert first == bootstrap_ci(values, n_resamples=500, seed=3)
    assert first.point == pytest.approx(values.mean())
    assert first.low < first.point < first.high


def test_bootstrap_accepts_other_statistics():
    values = np.array([0.0, 0.0, 1.0, 5.0, 100.0])
    point, low, high = bootstrap_ci(values, n_resamples=300, statistic=np.median)
    assert point == 1.0
    assert low <= point <= high <= 100.0


def test_bootstrap_interval_covers_true_mean_at_nominal_rate():
    # 200 simulated benchmarks of 100 Bernoulli(0.3) problems; a 95% interval should cover 0.3
    # in ~95% of them.  The percentile bootstrap runs slightly under nominal at P=100, and the
    # Monte-Carlo error of 200 trials is ~1.5 points, so accept 0.90..0.99.
    rng = np.random.default_rng(12345)
    true_p, trials = 0.3, 200
    covered = 0
    for trial in range(trials):
        values = (rng.random(100) < true_p).astype(np.float64)
        _, low, high = bootstrap_ci(values, n_resamples=500, seed=trial)
        covered += low <= true_p <= high
    assert 0.90 <= covered / trials <= 0.99


def test_paired_bootstrap_constant_shift():
    b = np.random.default_rng(0).random(40)
    result = paired_bootstrap_diff(b + 0.1, b, n_resamples=300)
    # Every resample shifts every problem by exactly 0.1.
    assert result.diff == pytest.approx(0.1)
    assert result.low == pytest.approx(0.1)
    assert result.high == pytest.approx(0.1)
    assert result.frac_positive == 1.0


def test_paired_interval_is_tighter_than_unpaired():
    # Problems vary a lot in difficulty, A is B plus a little noise: pairing removes the
    # difficulty variance that two independent intervals would each carry.
    rng = np.random.default_rng(7)
    difficulty = rng.random(200)
    a = difficulty + 0.02 + 0.01 * rng.standard_normal(200)
    b = difficulty
    diff, low, high, frac_positive = paired_bootstrap_diff(a, b, n_resamples=500)
    ci_a = bootstrap_ci(a, n_resamples=500)
    ci_b = bootstrap_ci(b, n_resamples=500)
    assert low < diff < high
    assert high - low < 0.2 * ((ci_a.high - ci_a.low) + (ci_b.high - ci_b.low))
    assert frac_positive == 1.0


def test_paired_bootstrap_antisymmetric_and_validates():
    rng = np.random.default_rng(2)
    a, b = rng.random(30), rng.random(30)
    ab = paired_bootstrap_diff(a, b, n_resamples=400, seed=5)
    ba = paired_bootstrap_diff(b, a, n_resamples=400, seed=5)
    assert ab.diff == pytest.approx(-ba.diff)
    assert ab.low == pytest.approx(-ba.high)
    assert ab.frac_positive + ba.frac_positive <= 1.0
    with pytest.raises(ValueError):
        paired_bootstrap_diff(a, b[:-1])
    with pytest.raises(ValueError):
        bootstrap_ci(a, confidence=1.5)
    with pytest.raises(ValueError):
        bootstrap_ci([])
