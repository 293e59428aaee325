"""Hand-derived checks of rlx.report.stats; the arithmetic is written next to each number."""

import math

import numpy as np
import pytest

from rlx.report.stats import (
    align_curves,
    iqm,
    mean_and_band,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
    t_critical_value,
)

# Two-sided 95% critical values t_{0.975, df}.
# df=1: tan(pi * (0.975 - 0.5)) = tan(0.475 pi) = 12.7062047...
# df=2: closed form (2p - 1) / sqrt(2 p (1 - p)), p = 0.975 -> 0.95 / sqrt(0.04875) = 4.3026527...
# df=3: 3.1824463 (standard t table)
T1 = math.tan(0.475 * math.pi)
T2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T3 = 3.182446305


# ---------------------------------------------------------------- iqm


def test_iqm_of_one_to_eight():
    # n=8, cut 8//4 = 2 from each end: keep 3,4,5,6 -> 18 / 4 = 4.5
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)


def test_iqm_of_ten_values_cuts_two_from_each_end():
    # n=10, int(0.25 * 10) = 2 from each end (scipy trim_mean): sorted 1..9,100 -> keep 3..8
    # (3+4+5+6+7+8) / 6 = 33 / 6 = 5.5; the outlier 100 and the 1 are gone
    assert iqm([100, 9, 1, 8, 2, 7, 3, 6, 4, 5]) == pytest.approx(5.5)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 2, 10], 13 / 3),  # n=3: 3//4 = 0, nothing cut, plain mean
        ([1, 2, 3, 4, 50], 3.0),  # n=5: cut 1 each end -> (2+3+4)/3
        ([0, 1, 2, 3, 4, 60], 2.5),  # n=6: cut 1 each end -> (1+2+3+4)/4
        ([-9, 1, 2, 3, 4, 5, 90], 3.0),  # n=7: cut 1 each end -> (1+2+3+4+5)/5
        ([5.0], 5.0),  # n=1
    ],
)
def test_iqm_when_n_is_not_a_multiple_of_four(values, expected):
    assert iqm(values) == pytest.approx(expected)


def test_iqm_flattens_runs_by_tasks():
    # (4 runs, 2 tasks) holds 1..8 -> same as the flat case: 4.5
    assert iqm(np.arange(1, 9).reshape(4, 2)) == pytest.approx(4.5)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")]])
def test_iqm_rejects_empty_and_nan(bad):
    with pytest.raises(ValueError):
        iqm(bad)


# ---------------------------------------------------------------- stratified bootstrap


@pytest.mark.parametrize("statistic", ["iqm", "mean", "median"])
def test_bootstrap_of_identical_values_has_zero_width(statistic):
    # every resample of [0.5, 0.5, 0.5, 0.5] is the same multiset -> one value, zero width
    point, low, high = stratified_bootstrap_ci(
        np.full(4, 0.5), statistic=statistic, n_resamples=200
    )
    assert (point, low, high) == (0.5, 0.5, 0.5)


def test_bootstrap_resamples_within_each_task():
    # task a is all 0, task b all 1, 4 runs each: a stratified resample always keeps 4 zeros and
    # 4 ones -> mean 0.5 and iqm mean(0,0,1,1) = 0.5 every time.  Pooled resampling would not.
    scores = {"a": [0.0] * 4, "b": [1.0] * 4}
    for statistic in ("mean", "iqm"):
        assert stratified_bootstrap_ci(scores, statistic, n_resamples=300) == (
            0.5,
            0.5,
            0.5,
        )


def test_bootstrap_interval_contains_point_and_shrinks_with_more_runs():
    rng = np.random.default_rng(123)
    few = rng.normal(size=(5, 3))  # (runs, tasks)
    many = rng.normal(size=(80, 3))
    point, low, high = stratified_bootstrap_ci(few, "iqm", n_resamples=1000, seed=1)
    assert low < point < high
    point_many, low_many, high_many = stratified_bootstrap_ci(
        many, "iqm", n_resamples=1000, seed=1
    )
    assert low_many < point_many < high_many
    assert high_many - low_many < 0.5 * (
        high - low
    )  # width ~ 1/sqrt(runs): sqrt(5/80) = 0.25


def test_bootstrap_is_seeded_and_dict_matches_columns():
    matrix = np.array([[0.1, 0.9], [0.4, 0.7], [0.3, 0.2]])  # (3 runs, 2 tasks)
    as_dict = {"t0": matrix[:, 0], "t1": matrix[:, 1]}
    first = stratified_bootstrap_ci(matrix, "mean", n_resamples=500, seed=7)
    assert stratified_bootstrap_ci(matrix, "mean", n_resamples=500, seed=7) == first
    assert stratified_bootstrap_ci(as_dict, "mean", n_resamples=500, seed=7) == first
    assert stratified_bootstrap_ci(matrix, "mean", n_resamples=500, seed=8) != first
    # point = mean of all six scores = 2.6 / 6
    assert first[0] == pytest.approx(2.6 / 6)


def test_bootstrap_accepts_a_callable_and_unequal_runs():
    scores = {"a": [1.0, 2.0], "b": [3.0, 4.0, 5.0]}
    point, low, high = stratified_bootstrap_ci(scores, np.max, n_resamples=200)
    # point = max(1..5) = 5; a resample's max is at most 5 and at least max(b resample) >= 3
    assert point == 5.0 and 3.0 <= low <= high <= 5.0


def test_bootstrap_rejects_bad_arguments():
    with pytest.raises(ValueError):
        stratified_bootstrap_ci([1.0, 2.0], "mode")
    with pytest.raises(ValueError):
        stratified_bootstrap_ci([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError):
        stratified_bootstrap_ci({"a": []})


# ---------------------------------------------------------------- probability of improvement


def test_probability_of_improvement_hand_values():
    # every x beats every y -> 9 wins / 9 pairs = 1
    assert probability_of_improvement([1, 2, 3], [0, 0, 0]) == 1.0
    # x vs itself: wins (2>1, 3>1, 3>2) = 3, ties 3 -> (3 + 0.5*3) / 9 = 0.5
    assert probability_of_improvement([1, 2, 3], [1, 2, 3]) == pytest.approx(0.5)
    # ties: x=[1,2,2], y=[2,3]: 1<2, 1<3, 2=2, 2<3, 2=2, 2<3 -> (0 + 0.5*2) / 6 = 1/6
    assert probability_of_improvement([1, 2, 2], [2, 3]) == pytest.approx(1 / 6)
    # x=[1,3], y=[1,2]: 1=1, 1<2, 3>1, 3>2 -> (2 + 0.5) / 4 = 0.625
    assert probability_of_improvement([1, 3], [1, 2]) == pytest.approx(0.625)
    # symmetry: P(X>Y) + 0.5 P(X=Y) + P(Y>X) + 0.5 P(Y=X) = 1 -> 1 - 0.625
    assert probability_of_improvement([1, 2], [1, 3]) == pytest.approx(0.375)


def test_probability_of_improvement_averages_tasks():
    # task a: 1 (above), task b: 0.625 (above) -> (1 + 0.625) / 2 = 0.8125
    x = {"a": [1, 2, 3], "b": [1, 3]}
    y = {"b": [1, 2], "a": [0, 0, 0]}
    assert probability_of_improvement(x, y) == pytest.approx(0.8125)
    # x columns [1,2,3],[1,2,3]; y columns [0,0,0],[1,2,3] -> (1 + 0.5) / 2 = 0.75
    x_matrix = np.array([[1, 1], [2, 2], [3, 3]])
    y_matrix = np.array([[0, 1], [0, 2], [0, 3]])
    assert probability_of_improvement(x_matrix, y_matrix) == pytest.approx(0.75)


def test_probability_of_improvement_rejects_mismatched_tasks():
    with pytest.raises(ValueError):
        probability_of_improvement({"a": [1]}, {"b": [1]})


def test_probability_of_improvement_ci():
    # x always beats y in every resample -> (1, 1, 1); identical constants always tie -> 0.5
    assert probability_of_improvement_ci([1, 2, 3], [0, 0, 0], n_resamples=200) == (
        1.0,
        1.0,
        1.0,
    )
    assert probability_of_improvement_ci([2, 2], [2, 2, 2], n_resamples=200) == (
        0.5,
        0.5,
        0.5,
    )
    rng = np.random.default_rng(5)
    x, y = rng.normal(0.5, 1.0, size=(10, 2)), rng.normal(0.0, 1.0, size=(10, 2))
    point, low, high = probability_of_improvement_ci(x, y, n_resamples=1000, seed=3)
    assert 0.0 <= low < point < high <= 1.0
    assert probability_of_improvement_ci(x, y, n_resamples=1000, seed=3) == (
        point,
        low,
        high,
    )


# ---------------------------------------------------------------- t values and bands


@pytest.mark.parametrize(
    ("confidence", "df", "expected"),
    [
        (0.95, 1, T1),
        (0.95, 2, T2),
        (0.95, 3, T3),
        (0.95, 4, 2.776445105),  # t table
        (0.95, 30, 2.042272456),  # t table
        (
            0.90,
            2,
            2.919985580,
        ),  # closed form: 0.9 / sqrt(2 * 0.95 * 0.05) = 0.9 / sqrt(0.095)
        (0.99, 7, 3.499483297),  # t table
    ],
)
def test_t_critical_value(confidence, df, expected):
    assert t_critical_value(confidence, df) == pytest.approx(expected, abs=1e-8)


def test_t_critical_value_tends_to_normal():
    # t_{0.975, df} -> z_{0.975} = 1.959964 as df grows; 1.960201 at df=10000
    assert t_critical_value(0.95, 10_000) == pytest.approx(1.960201, abs=1e-6)


def test_mean_and_band_two_seeds():
    # step 0: values 1, 3 -> mean 2, s = sqrt(((1-2)^2 + (3-2)^2) / 1) = sqrt(2), se = sqrt(2)/sqrt(2) = 1
    # step 1: values 2, 6 -> mean 4, s = sqrt(4 + 4) = 2 sqrt(2), se = 2
    # half width = t_{0.975, 1} * se = 12.7062 * [1, 2]
    mean, low, high = mean_and_band(np.array([[1.0, 2.0], [3.0, 6.0]]))
    np.testing.assert_allclose(mean, [2.0, 4.0])
    np.testing.assert_allclose(low, [2.0 - T1, 4.0 - 2 * T1])
    np.testing.assert_allclose(high, [2.0 + T1, 4.0 + 2 * T1])


def test_mean_and_band_three_seeds():
    # n = 3 seeds -> df = 2, t_{0.975, 2} = T2 = 4.302653
    # step 0: 1, 2, 3 -> mean 2, s = sqrt((1 + 0 + 1) / 2) = 1, se = 1/sqrt(3), half = 4.3027/1.7321 = 2.4841
    # step 1: 0, 3, 6 -> mean 3, s = sqrt((9 + 0 + 9) / 2) = 3, se = sqrt(3), half = 4.3027*1.7321 = 7.4524
    mean, low, high = mean_and_band([[1, 0], [2, 3], [3, 6]])
    half = np.array([T2 / math.sqrt(3), T2 * math.sqrt(3)])
    np.testing.assert_allclose(mean, [2.0, 3.0])
    np.testing.assert_allclose(high - mean, half, rtol=1e-8)
    np.testing.assert_allclose(mean - low, half, rtol=1e-8)
    np.testing.assert_allclose(half, [2.484138, 7.452413], atol=1e-6)


def test_mean_and_band_four_seeds():
    # n = 4 -> df = 3, T3 = 3.182446; values 1, 2, 3, 6 -> mean 3,
    # s = sqrt((4 + 1 + 0 + 9) / 3) = sqrt(14/3), se = s / 2 = 1.080123, half = 3.437435
    mean, low, high = mean_and_band([[1.0], [2.0], [3.0], [6.0]])
    half = T3 * math.sqrt(14 / 3) / 2
    np.testing.assert_allclose(
        [low[0], mean[0], high[0]], [3.0 - half, 3.0, 3.0 + half]
    )
    assert half == pytest.approx(3.437435, abs=1e-6)


def test_mean_and_band_other_confidence():
    # 90%, three seeds 1, 2, 3: t_{0.95, 2} = 2.919986, se = 1/sqrt(3) -> half 1.685854
    mean, _, high = mean_and_band([[1.0], [2.0], [3.0]], confidence=0.90)
    np.testing.assert_allclose(high - mean, [2.919985580 / math.sqrt(3)], rtol=1e-8)


def test_mean_and_band_one_seed_is_the_mean():
    for curves in (
        [[1.0, 5.0, 2.0]],
        [([0, 10, 20], [1.0, 5.0, 2.0])],
        [1.0, 5.0, 2.0],
    ):
        mean, low, high = mean_and_band(curves)
        np.testing.assert_array_equal(mean, [1.0, 5.0, 2.0])
        np.testing.assert_array_equal(low, mean)
        np.testing.assert_array_equal(high, mean)


def test_different_step_grids_use_common_steps():
    # seed 0 ran to step 20, seed 1 crashed after step 10 (and logged it out of order);
    # seed 2 logged step 10 twice after a resume: the later value 4 wins.
    curves = [
        ([0, 10, 20], [1.0, 2.0, 3.0]),
        ([10, 0], [4.0, 3.0]),
        ([0, 10, 10, 20, 30], [2.0, 9.0, 3.0, 7.0, 8.0]),
    ]
    steps, matrix = align_curves(curves)
    np.testing.assert_array_equal(steps, [0, 10])
    np.testing.assert_array_equal(matrix, [[1.0, 2.0], [3.0, 4.0], [2.0, 3.0]])
    # step 0: 1, 3, 2 -> mean 2, s = 1; step 10: 2, 4, 3 -> mean 3, s = 1; 3 seeds -> df 2,
    # half = T2 / sqrt(3) = 2.4841 at both steps
    mean, low, high = mean_and_band(curves)
    np.testing.assert_allclose(mean, [2.0, 3.0])
    np.testing.assert_allclose(high - mean, [T2 / math.sqrt(3)] * 2, rtol=1e-8)
    np.testing.assert_allclose(mean - low, [T2 / math.sqrt(3)] * 2, rtol=1e-8)


def test_align_curves_errors():
    with pytest.raises(ValueError):
        align_curves([([0, 1], [1.0, 2.0]), ([2, 3], [1.0, 2.0])])  # no shared step
    with pytest.raises(ValueError):
        align_curves([([0, 1], [1.0])])  # steps and values differ in length
    with pytest.raises(ValueError):
        align_curves([])


def test_seed_band_aligns_the_seeds_and_says_none_when_they_share_no_step():
    from rlx.report.stats import seed_band

    steps, mean, low, high, seeds = seed_band([([1, 2, 3, 4], [1.0, 2.0, 3.0, 9.0]), ([1, 2, 3], [4.0, 5.0, 6.0])])
    assert steps.tolist() == [1, 2, 3] and mean.tolist() == [2.5, 3.5, 4.5] and seeds == 2  # step 4: one seed only
    half = 12.7062 * (3 / np.sqrt(2)) / np.sqrt(2)  # t(0.975, 1) x sample std / sqrt(n); std of (1, 4) = 3 / sqrt(2)
    assert high.tolist() == pytest.approx([2.5 + half, 3.5 + half, 4.5 + half], rel=1e-4)
    assert low.tolist() == pytest.approx([2.5 - half, 3.5 - half, 4.5 - half], rel=1e-4)
    assert seed_band([([1], [1.0]), ([2], [2.0])]) is None
    assert seed_band([([1], [1.0]), ([], [])]) is None
    assert seed_band([]) is None
