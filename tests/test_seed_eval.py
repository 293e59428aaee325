"""Evaluation methods of issue 29: performance profiles and the optimality gap (rlx report), AdaStop's sequential
comparison, and for `rlx eval compare=` the pass@k crossover k and the solved-set shrink / expand counts."""

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from rlx.errors import UserError
from rlx.evaluation.metrics import crossover_k, mean_pass_at_k, solved_set_changes
from rlx.evaluation.summary import summarize, support_lines
from rlx.report.adastop import adastop_compare
from rlx.report.profiles import optimality_gap, optimality_gap_ci, performance_profile, performance_profile_ci
from rlx.report.report import main as report_main
from rlx.report.report import write_report
from tests.test_report import _fake_run

# --------------------------------------------------------------------------------------------------
# performance profiles and the optimality gap
# --------------------------------------------------------------------------------------------------


def test_performance_profile_by_hand():
    """Scores [0.2, 0.5, 0.5, 0.9]; F(tau) = fraction strictly above tau: tau 0 -> 4/4; 0.5 -> 1/4 (only 0.9);
    0.9 -> 0. Two tasks pool their runs: {a: [0.2, 0.5], b: [0.5, 0.9]} gives the same profile."""
    assert performance_profile([0.2, 0.5, 0.5, 0.9], [0.0, 0.5, 0.9]).tolist() == [1.0, 0.25, 0.0]
    assert performance_profile({"a": [0.2, 0.5], "b": [0.5, 0.9]}, [0.0, 0.5, 0.9]).tolist() == [1.0, 0.25, 0.0]


def test_optimality_gap_by_hand():
    """gamma 1: [0.2, 0.5, 1.3] -> 1 - (0.2 + 0.5 + min(1.3, 1)) / 3 = 1 - 1.7 / 3 = 0.433333 (the score above the
    target earns nothing more); gamma 0.5 -> 0.5 - (0.2 + 0.5 + 0.5) / 3 = 0.1."""
    assert optimality_gap([0.2, 0.5, 1.3]) == pytest.approx(0.433333, abs=1e-6)
    assert optimality_gap([0.2, 0.5, 1.3], gamma=0.5) == pytest.approx(0.1)


def test_bootstrap_bands_contain_the_point_and_collapse_on_identical_runs():
    point, low, high = optimality_gap_ci([0.1, 0.4, 0.7, 0.9], n_resamples=400)
    assert low <= point <= high and high - low > 0
    profile, low, high = performance_profile_ci([0.6] * 5, [0.5, 0.7], n_resamples=100)
    assert profile.tolist() == low.tolist() == high.tolist() == [1.0, 0.0]


# --------------------------------------------------------------------------------------------------
# AdaStop (the authors' package)
# --------------------------------------------------------------------------------------------------


def test_adastop_decides_separated_and_identical_configurations():
    """c1 scores around 0.8, c2 around 0.5, c3 the same values as c1. n 5, K 2: c1 vs c2 'larger' (c1's first),
    c2 vs c3 'smaller', c1 vs c3 never rejected -> 'equal' at the last interim."""
    rng = np.random.default_rng(0)
    high, low = list(0.8 + 0.01 * rng.standard_normal(10)), list(0.5 + 0.01 * rng.standard_normal(10))
    result = adastop_compare({"c1": high, "c2": low, "c3": list(high)}, n=5, K=2, alpha=0.05)
    assert result["decisions"] == {"c1 vs c2": "larger", "c1 vs c3": "equal", "c2 vs c3": "smaller"}
    assert result["finished"] and result["needs"] == {}


def test_adastop_asks_for_the_seeds_the_next_interim_needs():
    """Identical configurations with 5 seeds each: interim 1 cannot decide, interim 2 needs 10 seeds each."""
    result = adastop_compare({"a": [0.5, 0.6, 0.7, 0.6, 0.5], "b": [0.5, 0.6, 0.7, 0.6, 0.5]}, n=5, K=2)
    assert result == {"decisions": {"a vs b": "continue"}, "interims": 1, "finished": False, "needs": {"a": 5, "b": 5}}
    short = adastop_compare({"a": [0.5, 0.6], "b": [0.5] * 5}, n=5, K=2)
    assert short["interims"] == 0 and short["needs"] == {"a": 3}
    with pytest.raises(UserError, match="compares configurations"):
        adastop_compare({"a": [1.0]}, n=1, K=1)


# --------------------------------------------------------------------------------------------------
# rlx report: the new sections
# --------------------------------------------------------------------------------------------------


def test_report_writes_profiles_optimality_gap_and_adastop(tmp_path):
    """c1 ends at [0.8, 0.9, 0.7, 0.6], c2 at [0.1, 0.2, 0.3, 0.2]: optimality gaps 1 - 0.75 = 0.25 and
    1 - 0.2 = 0.8; AdaStop with n 2, K 2 separates them."""
    sweep = tmp_path / "sweep"
    for seed, (a, b) in enumerate(zip([0.8, 0.9, 0.7, 0.6], [0.1, 0.2, 0.3, 0.2])):
        _fake_run(sweep / f"a{seed}", ["optim.lr=1e-4"], seed, a)
        _fake_run(sweep / f"b{seed}", ["optim.lr=3e-4"], seed, b)
    result = write_report([sweep], tmp_path / "report", n_resamples=200, adastop={"n": 2, "K": 2, "alpha": 0.05})
    assert (result["profiles"]["gaps"]["c1"][0] == pytest.approx(0.25)
            and result["profiles"]["gaps"]["c2"][0] == pytest.approx(0.8))
    assert (tmp_path / "report" / "profiles.png").is_file()
    assert result["adastop"]["decisions"] == {"c1 vs c2": "larger"}
    summary = result["summary"].read_text()
    assert "## Optimality gap and performance profile" in summary and "| c1 | 0.250 |" in summary
    assert "## AdaStop" in summary and "| c1 vs c2 | larger |" in summary


@pytest.mark.parametrize("argv,needle", [(["--adastop", "5"], "must be N,K"), (["--adastop", "5,0"], "must be N,K"),
                                         (["--adastop", "2,2", "--adastop-alpha", "1.5"], "--adastop-alpha=1.5")])
def test_report_refuses_bad_adastop_arguments(tmp_path, argv, needle):
    with pytest.raises(UserError, match=needle):
        report_main([str(tmp_path), *argv])


# --------------------------------------------------------------------------------------------------
# rlx eval compare=: crossover k and solved-set changes
# --------------------------------------------------------------------------------------------------


def test_crossover_k_by_hand():
    """Two problems, n = 2 samples each. Trained c = [2, 2]: pass@1 = pass@2 = 1.
    Base c = [2, 0]: pass@1 = pass@2 = 0.5 -> the trained model stays ahead: None.
    Base c = [1, 1]: pass@1 = 0.5 < 1, pass@2 = 1 - C(1,2)/C(2,2) = 1 >= 1 -> k = 2.
    Base c = [2, 2]: equal already at k = 1 -> 1."""
    n = [2, 2]
    assert crossover_k(n, [2, 2], n, [2, 0]) is None
    assert crossover_k(n, [2, 2], n, [1, 1]) == 2
    assert crossover_k(n, [2, 2], n, [2, 2]) == 1
    assert mean_pass_at_k([4, 4], [1, 0], 2) == pytest.approx(0.25)  # (1 - C(3,2)/C(4,2) = 0.5, 0) / 2


def test_solved_set_changes_by_hand():
    """Per-problem correct counts, trained [3, 0, 1, 0, 2] vs base [0, 2, 1, 0, 0]: problems 0 and 4 only the
    trained model (expand 2), problem 1 only the base (shrink 1), problem 2 both, problem 3 neither."""
    assert solved_set_changes([3, 0, 1, 0, 2], [0, 2, 1, 0, 0]) == {"shrink": 1, "expand": 2, "both": 1, "neither": 1}


def _records(counts, n=4):
    return [{"id": i, "scores": [1.0] * c + [0.0] * (n - c), "extracted": ["x"] * n, "greedy": None}
            for i, c in enumerate(counts)]


def test_eval_summary_reports_the_support_of_a_compare_run():
    """Model c = [4, 4, 0] of 4, compare c = [1, 1, 2]: model pass@1 = (1 + 1 + 0) / 3 = 0.667, compare
    (0.25 + 0.25 + 0.5) / 3 = 0.333; pass@2: model 0.667, compare (0.5 + 0.5 + 1 - C(2,2)/C(4,2) = 0.833) / 3 =
    0.611; pass@3: compare (0.75 + 0.75 + 1) / 3 = 0.833 >= 0.667 -> crossover 3. Solved: problem 2 by the
    compare model only (shrink 1), both 2."""
    metrics = OmegaConf.create({"ks": [1, 2], "bootstrap_resamples": 50, "confidence": 0.95, "bootstrap_seed": 0,
                                "correct_threshold": 1.0})
    out = summarize({"model": _records([4, 4, 0]), "compare": _records([1, 1, 2])}, metrics)
    assert out["support"] == {"samples": 4, "crossover_k": 3, "shrink": 1, "expand": 0, "both": 2, "neither": 0}
    lines = support_lines({"benchmarks": {"chain_sum": out}}, {"model": "trained", "compare": "base"})
    assert lines == ["chain_sum: base reaches trained's pass@k at k = 3; solved at least once in 4 samples: by trained "
                     "only 0 (expand), by base only 1 (shrink), both 2, neither 0"]
    assert "support" not in summarize({"model": _records([4])}, metrics)
    json.dumps(out)  # summary.json stays serialisable
