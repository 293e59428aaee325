"""Per-objective loss weights (mixture.rule, rlx/algorithms/mixture.py): the RECAP-style rule against hand-derived
numbers, the fixed rule, the mixer's state, and the config errors. The tiny-model run whose weights move and its
exact resume are in tests/test_checkpoint_resume.py."""

import math
from types import SimpleNamespace

import pytest

from rlx.algorithms.mixture import (
    MIXING_RULES,
    build_mixer,
    floored_softmax_weights,
    normalised_weights,
    recap_priorities,
    window_signals,
)
from rlx.errors import UserError
from tests.conftest import run_rlx

SATURATED = [1.0, 1.0, 1.0, 1.0]  # solved every step: no trend, no spread
VOLATILE = [0.2, 0.8, 0.2, 0.8]
RISING = [0.2, 0.4, 0.6, 0.8]


def _settings(**over):
    base = dict(rule="recap", key="task", weights=None, window=4, temperature=1.0, floor=0.0)
    return SimpleNamespace(**{**base, **over})


def test_window_signals_match_hand_derived_numbers():
    # RISING: mean 0.5; least-squares slope 0.2 -> change over the window 0.2 x 3 = 0.6 -> c = 0.6 / 0.5 = 1.2;
    # deviations (-0.3, -0.1, 0.1, 0.3): population variance 0.2 / 4 = 0.05 -> s = sqrt(0.05) / 0.5 = 0.44721
    c, s = window_signals(RISING)
    assert c == pytest.approx(1.2, rel=1e-6) and s == pytest.approx(math.sqrt(0.05) / 0.5, rel=1e-6)
    # VOLATILE: mean 0.5; slope = sum (t - 1.5)(x - 0.5) / sum (t - 1.5)^2 = 0.6 / 5 = 0.12 -> c = 0.36 / 0.5 = 0.72;
    # every deviation is 0.3 -> s = 0.3 / 0.5 = 0.6
    c, s = window_signals(VOLATILE)
    assert c == pytest.approx(0.72, rel=1e-6) and s == pytest.approx(0.6, rel=1e-6)
    assert window_signals(SATURATED) == (0.0, 0.0)
    assert window_signals([0.7]) == (0.0, 0.0)  # one value: no signal yet
    assert window_signals([0.0, 0.0, 0.0]) == (0.0, 0.0)  # never solved: finite (eps), not a division by zero


def test_saturated_objective_loses_weight_volatile_gains_and_the_floor_holds():
    priorities = recap_priorities([window_signals(SATURATED), window_signals(VOLATILE)])
    assert priorities == pytest.approx([0.0, 1.32])  # p = c + s: 0 + 0, 0.72 + 0.6
    # softmax([0, 1.32]) = [1, e^1.32] / (1 + e^1.32) = [0.21082, 0.78918]; x K = 2 -> [0.42164, 1.57836]
    assert floored_softmax_weights(priorities, 1.0, 0.0) == pytest.approx([0.42164, 1.57836], abs=1e-5)
    # floor 0.3: shares 0.4 x [0.21082, 0.78918] + 0.3 = [0.38433, 0.61567] -> x 2 = [0.76865, 1.23135]
    floored = floored_softmax_weights(priorities, 1.0, 0.3)
    assert floored == pytest.approx([0.76865, 1.23135], abs=1e-5)
    assert min(floored) / 2 >= 0.3 - 1e-12 and sum(floored) == pytest.approx(2.0)
    # a priority far above the others: without the floor the saturated objective starves, with it keeps its share
    assert floored_softmax_weights([0.0, 50.0], 1.0, 0.0)[0] < 1e-20
    assert floored_softmax_weights([0.0, 50.0], 1.0, 0.25)[0] == pytest.approx(2 * 0.25)
    # a high temperature flattens the weights toward equal; equal priorities give exactly 1 each
    assert floored_softmax_weights(priorities, 1e6, 0.0) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert floored_softmax_weights([0.4, 0.4, 0.4], 0.5, 0.1) == [1.0, 1.0, 1.0]


def test_fixed_weights_are_rescaled_to_sum_to_the_number_of_objectives():
    assert normalised_weights([1.0, 3.0]) == pytest.approx([0.5, 1.5])
    mixer = build_mixer(_settings(rule="fixed", weights={"gcd": 3}), [{"task": "gcd"}, {"task": "leg_counting"}])
    mixer.observe({"gcd": 0.9})
    assert mixer.weights() == pytest.approx([1.5, 0.5])  # leg_counting unnamed: weight 1 before rescaling
    assert mixer.metrics() == pytest.approx({"mixture/weight/gcd": 1.5, "mixture/weight/leg_counting": 0.5,
                                             "mixture/signal/gcd/reward": 0.9})


def test_recap_mixer_moves_weights_and_its_state_restores_the_same_future():
    rows = [{"task": "solved"}, {"task": "shaky"}]
    mixer = build_mixer(_settings(), rows)
    assert mixer.weights() == [1.0, 1.0]  # no signal yet: equal
    for solved, shaky in zip(SATURATED, VOLATILE):
        mixer.observe({"solved": solved, "shaky": shaky})
    assert mixer.weights() == pytest.approx([0.42164, 1.57836], abs=1e-5)  # the hand-derived pair above
    assert mixer.metrics()["mixture/signal/shaky/instability"] == pytest.approx(0.6)
    saved = mixer.state_dict()
    twin = MIXING_RULES["recap"](["solved", "shaky"], _settings())
    twin.load_state_dict(saved)
    for m in (mixer, twin):
        m.observe({"solved": 1.0})  # the shaky objective drew no rows this step: its window stays
        m.observe({"solved": 1.0, "shaky": 0.5})
    assert twin.weights() == mixer.weights() and twin.metrics() == mixer.metrics()
    assert list(twin.windows["shaky"]) == [0.8, 0.2, 0.8, 0.5]  # window 4: the oldest value dropped


def test_bad_mixture_settings_are_one_line_user_errors():
    rows = [{"task": "chain_sum"}, {"task": "gcd"}]
    with pytest.raises(UserError, match="mixture.weights names 'gcdd', which is not an objective of this run"):
        build_mixer(_settings(rule="fixed", weights={"gcdd": 2}), rows)
    with pytest.raises(UserError, match=r"mixture.floor=0.6 x 2 objectives exceeds 1; set mixture.floor <= 0.5"):
        build_mixer(_settings(floor=0.6), rows)
    with pytest.raises(UserError, match="mixture.weights.gcd=0 is not valid"):
        build_mixer(_settings(rule="fixed", weights={"gcd": 0}), rows)
    with pytest.raises(UserError, match="has no column 'source'"):
        build_mixer(_settings(key="source"), rows)
    assert build_mixer(_settings(rule="none"), rows) is None


def test_an_unknown_objective_in_the_weights_exits_2_with_one_line(tmp_path):
    result = run_rlx(["train", "data=reasoning_gym", "data.task=[chain_sum,leg_counting]", "mixture.rule=fixed",
                      "mixture.weights={chain_sum: 2, leg_countin: 1}"], tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "mixture.weights names 'leg_countin', which is not a task of this run" in lines[0]
    assert "Traceback" not in result.stderr
    moved = run_rlx(["train", "mixture.rule=recap", "mixture.weights={chain_sum: 2}"], tmp_path, timeout=300)
    assert moved.returncode == 2 and "mixture.weights is read by mixture.rule=fixed only" in moved.stderr


def test_each_row_gets_its_objectives_weight_from_the_steps_mean_rewards():
    import torch

    from rlx.loops.policy_gradient import objective_weights

    rows = [{"task": "a"}, {"task": "b"}, {"task": "a"}, {"task": "b"}]
    batch = SimpleNamespace(source=SimpleNamespace(rows=rows), rewards=torch.tensor([1.0, 0.0, 0.5, 1.0]),
                            local=slice(None))
    mixer = build_mixer(_settings(rule="fixed", weights={"a": 3}), rows)
    weights, metrics = objective_weights(mixer, batch, SimpleNamespace(num_processes=1), "task")
    assert weights.tolist() == [1.5, 0.5, 1.5, 0.5]  # a: 3 -> 1.5, b: 1 -> 0.5 (rescaled to sum to 2)
    assert metrics["mixture/signal/a/reward"] == 0.75 and metrics["mixture/signal/b/reward"] == 0.5


def test_the_weights_scale_the_loss_and_equal_weights_change_nothing(tmp_path):
    """One step of three runs from one seed: no mixture; recap, whose first step has no signal yet (weights exactly
    1); fixed weights 3:1. The first two train identically, the third does not."""
    import json

    common = ["data=reasoning_gym", "data.task=[chain_sum,leg_counting]", "data.train_size=64", "data.eval_size=4",
              "steps=1", "prompts_per_step=8", "rollout.samples_per_prompt=4", "eval.every=0", "eval.at_start=false",
              "save.final=false", "save.plot=false", "log.samples_every=0", "log.progress=false",
              "checkpoint.at_end=false", "hardware.num_threads=1"]
    sweep = tmp_path / "sweep"
    result = run_rlx(["train", "-m", "mixture.rule=none,recap,fixed", *common, f"hydra.sweep.dir={sweep}"],
                     tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    fixed_sweep = tmp_path / "fixed"
    result = run_rlx(["train", "-m", "mixture.rule=fixed", "mixture.weights={chain_sum: 3}", *common,
                      f"hydra.sweep.dir={fixed_sweep}"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    none, recap, equal, fixed = [json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])
                                 for folder in (sweep / "0", sweep / "1", sweep / "2", fixed_sweep / "0")]
    assert "mixture/weight/chain_sum" not in none
    assert recap["mixture/weight/chain_sum"] == equal["mixture/weight/chain_sum"] == 1.0
    assert fixed["mixture/weight/chain_sum"] == 1.5 and fixed["mixture/weight/leg_counting"] == 0.5
    for same in (recap, equal):
        assert same["train/loss"] == none["train/loss"] and same["train/grad_norm"] == none["train/grad_norm"]
    assert none["train/grad_norm"] > 0 and fixed["train/grad_norm"] != none["train/grad_norm"]
