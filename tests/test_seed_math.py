"""The seed ideas of issue 29, one hand-derived golden test per formula (the derivation in each docstring),
plus a direction test wherever the option changes the gradient. Pure functions only; the loop wiring is
issue 29 part 2."""

import math

import pytest
import torch

from rlx.algorithms.advantages import group_advantages, outcome_advantages
from rlx.algorithms.agent_credit import (
    HGPOSettings,
    gated_returns,
    gra_advantages,
    hgpo_advantages,
    loo_advantages,
)
from rlx.algorithms.entropy_band import entropy_band_penalty, epo_phase_weight
from rlx.algorithms.gigpo import CREDIT, gigpo_advantages
from rlx.algorithms.grouping import fixed_groups, group_rank, group_standardize
from rlx.algorithms.losses import clipped_surrogate
from rlx.algorithms.ngrpo import DROP_STRATEGIES, ngrpo_advantages
from rlx.algorithms.shaping import (
    SHAPERS,
    GroupSignals,
    apply_shapers,
    backward_correction,
    concise_rewards,
    difficulty_buckets,
    inject_verifier_noise,
    laser_d_targets,
    laser_rewards,
    par_rewards,
    unlikeliness_rewards,
    win_rate_rewards,
)
from rlx.algorithms.transforms import (
    TRANSFORMS,
    agrae_advantages,
    apply_transforms,
    efficiency_advantages,
    forward_correction_weights,
    pass_at_k_advantages,
)
from rlx.registry import Registry

T = torch.tensor


def close(actual, expected, tol=1e-5):
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64),
                          atol=tol)


# --------------------------------------------------------------------------------------------------
# the Registry helper
# --------------------------------------------------------------------------------------------------


def test_registry_registers_by_decorator_and_names_the_valid_choices():
    registry = Registry("widget")

    @registry.register("b")
    def b():
        return "b"

    registry.register("a")(lambda: "a")
    assert registry["b"]() == "b" and registry.names() == ("b", "a") and "a" in registry and len(registry) == 2
    with pytest.raises(ValueError, match=r"^unknown widget 'c'; valid choices: b, a$"):
        registry["c"]
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("a")(lambda: None)


def test_group_rank_is_per_group_and_stable():
    """Values [-1, -3, -2, -0.5 | -5, -1] in groups [0, 0, 0, 0 | 1, 1]: ascending ranks within each group,
    group 0: -3 -> 0, -2 -> 1, -1 -> 2, -0.5 -> 3; group 1: -5 -> 0, -1 -> 1. Ties: [2, 2] -> [0, 1]."""
    assert group_rank(T([-1.0, -3, -2, -0.5, -5, -1]), T([0, 0, 0, 0, 1, 1])).tolist() == [2, 0, 1, 3, 0, 1]
    assert group_rank(T([2.0, 2.0]), T([7, 7])).tolist() == [0, 1]
    # groups need not be adjacent nor sorted
    assert group_rank(T([5.0, 1.0, 4.0, 0.0]), T([3, 1, 3, 1])).tolist() == [1, 1, 0, 0]


# --------------------------------------------------------------------------------------------------
# 1. NGRPO
# --------------------------------------------------------------------------------------------------


def test_ngrpo_matches_hand_derived_numbers():
    """k = 1, r_max = 1, groups of 3.
    all wrong [0, 0, 0] + virtual 1: mean 1/4; squared deviations 3 x 1/16 + 9/16 = 12/16; unbiased var
      (12/16) / 3 = 1/4, std 1/2 -> A = (0 - 1/4) / (1/2) = -0.5 for each sample.
    [1, 0, 0] + 1: mean 1/2; squares 4 x 1/4 = 1; var 1/3, std 0.577350 -> A = +-0.5 / 0.577350 = +-0.866025.
    all correct [1, 1, 1] + 1: no spread -> 0.
    k = 2, group [0, 0] + [1, 1]: mean 1/2, squares 4 x 1/4 = 1, var 1/3 -> A = -0.866025.
    A group of one (authors' rule mu 0, sigma 1): [0.3] -> 0.3 / (1 + 1e-6)."""
    rewards = T([0.0, 0, 0, 1, 0, 0, 1, 1, 1])
    advantages, metrics = ngrpo_advantages(rewards, fixed_groups(9, 3))
    assert close(advantages, [-0.5] * 3 + [0.866025, -0.866025, -0.866025] + [0.0] * 3)
    assert metrics["train/ngrpo_dead_groups_revived"] == 1.0  # the one all-wrong group now carries signal
    two, _ = ngrpo_advantages(T([0.0, 0.0]), T([0, 0]), virtual_samples=2)
    assert close(two, [-0.866025, -0.866025])
    single, _ = ngrpo_advantages(T([0.3]), T([4]))
    assert close(single, [0.3 / (1 + 1e-6)], 1e-9)


def test_ngrpo_gives_all_wrong_groups_a_negative_push_where_grpo_gives_none():
    """Direction: a tabular policy that sampled the same wrong answer three times. GRPO's advantage is 0
    (no gradient); NGRPO's is -0.5, so one SGD step on the clipped surrogate lowers that answer's log-prob."""
    rewards = T([0.0, 0.0, 0.0])
    assert group_advantages(rewards, 3).abs().max() == 0
    ngrpo, _ = ngrpo_advantages(rewards, fixed_groups(3, 3))
    logits = torch.zeros(3, requires_grad=True)  # one state, 3 answers; every sample drew answer 0

    def logp():
        return torch.log_softmax(logits, 0)[0].expand(3, 1)  # (N=3, T=1)

    before = logp()[0, 0].item()
    loss, _ = clipped_surrogate(logp(), logp().detach(), ngrpo, torch.ones(3, 1), 0.16, 0.24)
    loss.mean().backward()
    with torch.no_grad():
        logits -= 1.0 * logits.grad
    assert logp()[0, 0].item() < before - 1e-3


def test_ngrpo_through_the_estimator_registry_and_its_refusals():
    rewards = T([0.0, 0, 0, 1, 0, 0])
    groups = fixed_groups(6, 3)
    advantages, keep, metrics = outcome_advantages(rewards, groups, "ngrpo", scale="group", eps=1e-6,
                                                   virtual_reward=1.0, virtual_samples=1)
    assert close(advantages, [-0.5] * 3 + [0.866025, -0.866025, -0.866025]) and keep.all()
    assert metrics == {"train/ngrpo_dead_groups_revived": 1.0}
    with pytest.raises(ValueError, match="algorithm.scale=group"):
        outcome_advantages(rewards, groups, "ngrpo", scale="batch", eps=1e-6)
    # a total reward above r_max (a format bonus on top of accuracy 1) would make the "max" sample not the max
    with pytest.raises(ValueError, match=r"algorithm.virtual_reward=1.0 is below a sampled reward 1.1"):
        ngrpo_advantages(T([1.1, 0.0]), T([0, 0]))


def test_ngrpo_asymmetric_clip_bounds_negative_tokens_at_0_84_and_positive_at_1_24():
    """The authors' clip 0.16 / 0.24 is rlx's clip_low / clip_high: A = -1, ratio 0.5 -> the clipped term
    -0.84 * -1 = 0.84 is the max of (0.5, 0.84): loss 0.84 (ratio held at 0.84); A = +1, ratio 1.5 -> loss
    -min(1.5, 1.24) = -1.24."""
    logp, old = torch.log(T([[0.5], [1.5]])), torch.zeros(2, 1)
    loss, _ = clipped_surrogate(logp, old, T([-1.0, 1.0]), torch.ones(2, 1), 0.16, 0.24)
    assert close(loss.flatten(), [0.84, -1.24])


def test_drop_strategies_follow_the_authors_filter():
    """Groups [1, 1, 1] (all correct), [0, 0, 0] (all wrong), [1, 0, 0] (mixed): DAPO's `tied` drops the
    first two, NGRPO's `all_correct` only the first, `all_incorrect` only the second."""
    rewards = T([1.0, 1, 1, 0, 0, 0, 1, 0, 0])
    correct, groups = rewards.bool(), fixed_groups(9, 3)
    per_group = {name: DROP_STRATEGIES[name](rewards, correct, groups)[::3].tolist() for name in DROP_STRATEGIES}
    assert per_group == {"tied": [True, True, False], "all_correct": [True, False, False],
                         "all_incorrect": [False, True, False]}


# --------------------------------------------------------------------------------------------------
# 2. Length shaping gated on correctness
# --------------------------------------------------------------------------------------------------


def test_laser_rewards_only_correct_answers_within_the_target():
    """rewards [1, 1, 0, 0], correct [T, T, F, F], lengths [5, 15, 5, 15], L_T 10, alpha 0.5:
    only sample 0 is correct AND short -> [1.5, 1, 0, 0]. The short wrong answer earns nothing."""
    shaped = laser_rewards(T([1.0, 1, 0, 0]), T([True, True, False, False]), T([5, 15, 5, 15]), 10, 0.5)
    assert shaped.tolist() == [1.5, 1.0, 0.0, 0.0]


def test_laser_direction_short_correct_beats_long_correct_and_wrong_answers_stay_tied():
    """After GRPO normalisation of the LASER rewards above: A(short correct) > A(long correct), while the
    two wrong answers get equal advantages (no incentive to be short AND wrong)."""
    signals = GroupSignals(groups=T([0, 0, 0, 0]), correct=T([True, True, False, False]), lengths=T([5, 15, 5, 15]))
    shaped, metrics = apply_shapers(["laser"], T([1.0, 1, 0, 0]), signals, {"length_alpha": 0.5, "target_tokens": 10})
    advantages = group_advantages(shaped, 4)
    assert advantages[0] > advantages[1] > 0 and advantages[2] == advantages[3]
    assert metrics["shaping/length_bonus_frac"] == 0.25 and metrics["shaping/correct_mean_length"] == 10.0


def test_laser_d_buckets_and_targets_by_hand():
    """Buckets by group pass rate: [T, T, T] 1 -> easy (0); [T, F, F] 1/3 -> medium (1); [F, F, F] -> hard (2);
    [T, T, F] 2/3 -> easy.
    Targets, n = 6 samples per prompt (lower_n = floor(2n/3) 4 easy, floor(n/3) 2 medium, 1 hard),
    candidates [3, 5, 9, 10, 12], expected_correct 2:
      easy group lengths [2, 3, 4, 8, 9, 10]: coverage(3) = 2/6 -> floor(1.33) = 1 < 2; coverage(5) = 3/6 ->
        floor(2.0) = 2 -> target 5.
      medium group [6..11]: coverage(9) = 4/6 -> floor(1.33) = 1; coverage(10) = 5/6 -> floor(1.67) = 1 (the
        authors floor, not round); coverage(12) = 1 -> 2 -> target 12.
      hard group all length 1: coverage 1 -> floor(1 x 1) = 1 < 2 at every candidate -> fallback 12."""
    correct = T([True, True, True, True, False, False, False, False, False, True, True, False])
    assert difficulty_buckets(correct, fixed_groups(12, 3)).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0]
    lengths = T([2, 3, 4, 8, 9, 10, 6, 7, 8, 9, 10, 11, 1, 1, 1, 1, 1, 1])
    correct = T([True] * 5 + [False] + [True] * 2 + [False] * 4 + [False] * 6)
    targets = laser_d_targets(lengths, correct, fixed_groups(18, 6), [3, 5, 9, 10, 12], samples_per_prompt=6,
                              expected_correct=2)
    assert targets.tolist() == [5, 12, 12]


def test_laser_d_shaper_uses_the_bucket_target():
    """Two groups of 2: [T, T] (easy, target 4) and [T, F] (medium, target 10), every length 6: the easy
    group's correct answers are too long (no bonus); the medium group's correct answer gets +0.5."""
    signals = GroupSignals(groups=T([0, 0, 1, 1]), correct=T([True, True, True, False]), lengths=T([6, 6, 6, 6]))
    shaped, metrics = SHAPERS["laser_d"](T([1.0, 1, 1, 0]), signals, length_alpha=0.5, bucket_targets=(4, 10, 16))
    assert shaped.tolist() == [1.0, 1.0, 1.5, 0.0] and metrics["shaping/laser_target_medium"] == 10


def test_concise_gate_applies_only_to_fully_correct_groups():
    """L_max 16, alpha 0.5. Group [T, T], lengths [4, 8]: +0.5 (1 - 4/16) = 0.375 and +0.5 (1 - 8/16) = 0.25.
    Group [T, F]: not every sample correct -> untouched. rewards [1, 1, 1, 0] -> [1.375, 1.25, 1, 0]."""
    shaped = concise_rewards(T([1.0, 1, 1, 0]), T([True, True, True, False]), T([4, 8, 4, 8]), T([0, 0, 1, 1]), 16, 0.5)
    assert close(shaped, [1.375, 1.25, 1.0, 0.0])


# --------------------------------------------------------------------------------------------------
# 6. pass@k-oriented: unlikeliness, A-GRAE, Pass@k Training
# --------------------------------------------------------------------------------------------------


def test_unlikeliness_penalises_the_likely_correct_samples():
    """Group 0: rewards [1, 1, 1, 0], mean log-probs [-1, -3, -2, -0.5], beta 0.25, G 4. Ascending ranks
    (0 = least likely): [2, 0, 1, 3] -> r' = [1 (1 - 0.25 x 2/4), 1 (1 - 0), 1 (1 - 0.25 x 1/4), 0]
    = [0.875, 1, 0.9375, 0]. Group 1: [1, 0] with log-probs [-5, -1]: ranks [0, 1] -> [1, 0]."""
    shaped = unlikeliness_rewards(T([1.0, 1, 1, 0, 1, 0]), T([-1.0, -3, -2, -0.5, -5, -1]), T([0, 0, 0, 0, 1, 1]), 0.25)
    assert close(shaped, [0.875, 1.0, 0.9375, 0.0, 1.0, 0.0])


def test_unlikeliness_direction_the_rare_correct_sample_gets_the_largest_advantage():
    signals = GroupSignals(groups=T([0, 0, 0, 0]), mean_logp=T([-1.0, -3, -2, -0.5]))
    shaped, _ = SHAPERS["unlikeliness"](T([1.0, 1, 1, 0]), signals, unlikeliness_beta=0.25)
    advantages = group_advantages(shaped, 4)
    assert advantages[1] > advantages[2] > advantages[0] > 0 > advantages[3]
    # GRPO: all equal
    assert (group_advantages(T([1.0, 1, 1, 0]), 4)[:3] == group_advantages(T([1.0, 1, 1, 0]), 4)[0]).all()


def test_agrae_matches_the_authors_formula_by_hand():
    """Groups of 2: [1, 0] (p 0.5), [0, 0] (p 0), [0, 0] (p 0); p_bar = 0.5 / 3 = 1/6 (not 1/2, where the two
    terms would be symmetric). GRPO advantages of [1, 0]: mean 0.5, unbiased std 0.707107 -> +-0.707107.
    A' = (1 - 1/6) 0.5 A / (1 - sqrt 0.5) + (1/6) 0.5 A / sqrt 0.5
       = 0.833333 x 0.353553 / 0.292893 + 0.166667 x 0.353553 / 0.707107 = 1.005922 + 0.083333 = 1.089256.
    Positive: x min(1, p_bar / alpha) = 1/6 (alpha 1) -> 0.181543; alpha 0.5: x 1/3 -> 0.363085;
    negative: -1.089256 undamped. Zero advantages stay 0."""
    rewards, groups = T([1.0, 0, 0, 0, 0, 0]), fixed_groups(6, 2)
    advantages = group_advantages(rewards, 2)
    assert close(agrae_advantages(advantages, rewards, groups, alpha=1.0), [0.181543, -1.089256, 0, 0, 0, 0])
    assert close(agrae_advantages(advantages, rewards, groups, alpha=0.5), [0.363085, -1.089256, 0, 0, 0, 0])



def test_agrae_pass_rate_is_the_verifiers_not_the_total_reward():
    """With a format bonus the total reward is not a pass rate: group [1.1, 1.0] is all correct (p_g 1) but its
    rewards differ, so GRPO gives it +-0.707107. p_g from `correct`: [1, 1] -> p 1, [0, 0] -> p 0; p_bar 0.5.
    The hard term (1 / (1 - sqrt 1)) is left out, the easy one stays: A' = 0.5 x 0.5 x A / 1 = 0.25 A ->
    +0.176777 x min(1, 0.5) = 0.088388 and -0.176777. Clamping the total reward instead made the hard term
    A / eps (~1e5): the A-GRAE ablation's first run saw mean |advantage change| 55."""
    rewards, groups = T([1.1, 1.0, 0.1, 0.1]), fixed_groups(4, 2)
    correct = torch.tensor([True, True, False, False])
    advantages = group_advantages(rewards, 2)
    assert close(agrae_advantages(advantages, rewards, groups, alpha=1.0, correct=correct), [0.088388, -0.176777, 0, 0])

def test_pass_at_k_advantages_by_hand():
    """n = 4, k = 2. c = 1: R = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5, sigma = 0.5, A_pos = 0.5 / 0.5 = 1,
    A_neg = (0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5 = -1/3.
    c = 2: R = 1 - C(2,2)/C(4,2) = 5/6, sigma = sqrt(5/36) = 0.372678, A_pos = (1/6) / 0.372678 = 0.447214,
    A_neg = (1/6 - C(1,1)/C(3,1)) / 0.372678 = (1/6 - 1/3) / 0.372678 = -0.447214.
    c = 4 or c = 0: 0 (sigma = 0, numerator 0)."""
    correct = T([True, False, False, False, True, True, False, False, True, True, True, True, False, False, False,
                 False])
    advantages = pass_at_k_advantages(correct, fixed_groups(16, 4), k=2)
    expected = [1, -1 / 3, -1 / 3, -1 / 3, 0.447214, 0.447214, -0.447214, -0.447214] + [0] * 8
    assert close(advantages, expected)
    with pytest.raises(ValueError, match="at least k samples"):
        pass_at_k_advantages(T([True, False]), T([0, 0]), k=3)


def test_pass_at_k_direction_wrong_samples_are_pushed_down_less_than_under_grpo():
    """One correct of four: GRPO gives the wrong samples -0.5 (mean 0.25, std 0.5); pass@2 training only
    -1/3, keeping probability mass on alternatives (exploration), and the correct one +1 instead of +1.5."""
    correct = T([True, False, False, False])
    grpo = group_advantages(correct.double(), 4)
    passk, _ = TRANSFORMS["pass_at_k"](grpo, correct.double(), GroupSignals(groups=T([0, 0, 0, 0]), correct=correct),
                                       pass_k=2)
    assert close(grpo, [1.5, -0.5, -0.5, -0.5]) and close(passk, [1.0, -1 / 3, -1 / 3, -1 / 3])
    assert (passk[1:].abs() < grpo[1:].abs()).all()


def test_efficiency_advantage_is_computed_among_correct_samples_only():
    """Group [T, T, T, F], lengths [4, 8, 12, 2], e = -length among the correct: [-4, -8, -12], mean -8,
    unbiased std 4 -> [1, 0, -1]; the wrong (and shortest) sample gets 0. w = 0.5 on zero accuracy
    advantages -> [0.5, 0, -0.5, 0]. A group with one correct sample: no efficiency term."""
    advantages, term = efficiency_advantages(torch.zeros(6), T([True, True, True, False, True, False]),
                                             -T([4.0, 8, 12, 2, 3, 9]), T([0, 0, 0, 0, 1, 1]), weight=0.5)
    assert close(term, [1, 0, -1, 0, 0, 0]) and close(advantages, [0.5, 0, -0.5, 0, 0, 0])


# --------------------------------------------------------------------------------------------------
# 4. Noisy verifiers
# --------------------------------------------------------------------------------------------------


def test_noise_injection_flips_by_the_per_sample_uniforms():
    """rho_1 = 0.2 (FN), rho_0 = 0.1 (FP). correct [T, T, F, F], u [0.1, 0.5, 0.05, 0.9]:
    T & 0.1 < 0.2 -> rejected; T & 0.5 -> kept; F & 0.05 < 0.1 -> accepted; F & 0.9 -> kept.
    Over a grid of 1000 uniforms (i + 0.5) / 1000, exactly 200 of 1000 correct answers flip and 100 wrong."""
    observed = inject_verifier_noise(T([True, True, False, False]), 0.2, 0.1, T([0.1, 0.5, 0.05, 0.9]))
    assert observed.tolist() == [False, True, True, False]
    grid = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000
    assert (~inject_verifier_noise(torch.ones(1000, dtype=torch.bool), 0.2, 0.1, grid)).sum() == 200
    assert inject_verifier_noise(torch.zeros(1000, dtype=torch.bool), 0.2, 0.1, grid).sum() == 100


def test_backward_correction_is_unbiased():
    """rho_0 0.1, rho_1 0.2: r_hat(1) = 0.9 / 0.7 = 1.285714, r_hat(0) = -0.1 / 0.7 = -0.142857.
    E[r_hat | r*=1] = 0.8 x 1.285714 + 0.2 x -0.142857 = 1; E[r_hat | r*=0] = 0.1 x 1.285714 + 0.9 x -0.142857 = 0."""
    one, zero = backward_correction(T([1.0, 0.0]), fp_rate=0.1, fn_rate=0.2).tolist()
    assert close([one, zero], [1.285714, -0.142857])
    assert close(0.8 * one + 0.2 * zero, 1.0, 1e-12) and close(0.1 * one + 0.9 * zero, 0.0, 1e-12)
    with pytest.raises(ValueError, match="fp_rate \\+ fn_rate < 1"):
        backward_correction(T([1.0]), 0.5, 0.5)


def test_backward_correction_is_cancelled_by_group_standardisation_and_rescales_dr_grpo():
    """The pin the issue asks for: constant-rate backward correction is affine with slope 1/0.7, so GRPO's
    group-std advantages are unchanged (up to eps) and Dr. GRPO's (scale none) are divided by 0.7."""
    observed = T([1.0, 0, 0, 1, 1, 0])
    corrected = backward_correction(observed, 0.1, 0.2)
    assert close(group_advantages(corrected, 3), group_advantages(observed, 3), 1e-5)
    assert close(group_advantages(corrected, 3, "none"), group_advantages(observed, 3, "none") / 0.7, 1e-9)


def test_backward_shaper_acts_on_the_verifier_share_of_a_mixed_reward():
    """Total = accuracy + 0.1 x format: [1.1, 0.1] with observed verdicts [1, 0] (weight 1):
    1.1 + (1.285714 - 1) = 1.385714; 0.1 + (-0.142857 - 0) = -0.042857."""
    signals = GroupSignals(groups=T([0, 0]), correct=T([True, False]), accuracy_weight=1.0)
    shaped, _ = SHAPERS["noise_backward"](T([1.1, 0.1]), signals, assumed_fp_rate=0.1, assumed_fn_rate=0.2)
    assert close(shaped, [1.385714, -0.042857])


def test_forward_correction_weights_align_in_expectation_with_the_clean_signal():
    """w_1 = rho_1 = 0.2, w_0 = rho_1 - 1 = -0.8. With rho_0 0.1: E[w | r*=1] = 0.8 x 0.2 + 0.2 x -0.8 = 0;
    E[w | r*=0] = 0.1 x 0.2 + 0.9 x -0.8 = -0.7 = -(1 - rho_0 - rho_1): the expected weight is
    (1 - rho_0 - rho_1)(r* - 1), an increasing affine function of the clean reward."""
    w1, w0 = forward_correction_weights(T([1.0, 0.0]), fn_rate=0.2).tolist()
    assert close([w1, w0], [0.2, -0.8], 1e-12)
    assert close(0.8 * w1 + 0.2 * w0, 0.0, 1e-12) and close(0.1 * w1 + 0.9 * w0, -0.7, 1e-12)
    signals = GroupSignals(groups=T([0, 0]), correct=T([True, False]))
    advantages, _ = apply_transforms(["noise_forward"], torch.zeros(2), T([1.0, 0.0]), signals,
                                     {"assumed_fn_rate": 0.2})
    assert close(advantages, [0.2, -0.8], 1e-6)


# --------------------------------------------------------------------------------------------------
# 10. Learned reward models: PAR and win rates
# --------------------------------------------------------------------------------------------------


def test_par_is_a_sigmoid_of_the_centred_reward_and_bounded():
    """r = [2, 0], r_ref = 1: sigmoid(1) = 0.731059, sigmoid(-1) = 0.268941. Two references [1, 3] for r = 2:
    (sigmoid(1) + sigmoid(-1)) / 2 = 0.5. An outlier r = 100 stays below 1."""
    assert close(par_rewards(T([2.0, 0.0]), T([1.0, 1.0])), [0.731059, 0.268941])
    assert close(par_rewards(T([2.0]), T([[1.0, 3.0]])), [0.5])
    assert par_rewards(T([100.0]), T([0.0])).item() <= 1.0


def test_par_direction_an_outlier_reward_no_longer_dominates_the_group():
    """Raw rewards [0, 2, 10], reference 1. GRPO: mean 4, so the middle sample (2) gets a negative advantage.
    PAR: [sigmoid(-1), sigmoid(1), sigmoid(9)] = [0.268941, 0.731059, 0.999877], mean 0.666626 < 0.731059:
    the sigmoid saturates the outlier and the middle sample's advantage turns positive."""
    raw = T([0.0, 2.0, 10.0])
    shaped, _ = SHAPERS["par"](raw, GroupSignals(groups=T([0, 0, 0]), reference_rewards=torch.ones(3)))
    assert close(shaped, [0.268941, 0.731059, 0.999877])
    assert group_advantages(raw, 3)[1] < 0 < group_advantages(shaped, 3)[1]


def test_win_rate_within_the_group():
    """Scores [3, 1, 1, 0] in one group: 3 beats all -> 1; each 1 beats 0 and ties the other 1 -> (1 + 0.5) / 3
    = 0.5; 0 -> 0. A group of one -> 0.5. Another group is compared with nobody outside it."""
    rates = win_rate_rewards(T([3.0, 1, 1, 0, 7, 5]), T([0, 0, 0, 0, 1, 2]))
    assert close(rates, [1.0, 0.5, 0.5, 0.0, 0.5, 0.5])


# --------------------------------------------------------------------------------------------------
# 9. Agent credit
# --------------------------------------------------------------------------------------------------


def test_credit_registry_has_the_new_rules():
    assert {"loo", "gra", "hgpo"} <= set(CREDIT)


def test_leave_one_out_over_episodes():
    """Task 0 has episodes with returns [1, 0, 0], task 1 [1, 1]. A_i = R_i - mean of the others:
    [1 - 0, 0 - 0.5, 0 - 0.5, 1 - 1, 1 - 1] = [1, -0.5, -0.5, 0, 0]; episode 0 has two steps (rewards 0, 1)."""
    step_episode = T([0, 0, 1, 2, 3, 4])
    advantages, _ = loo_advantages(T([0, 0, 0, 1, 1]), step_episode, T([0.0, 1, 0, 0, 1, 1]))
    assert close(advantages, [1, 1, -0.5, -0.5, 0, 0])


def test_gated_reward_accumulation_by_hand_and_its_direction():
    """Three episodes of one task, tau = 1. Outcomes [0, 1, 0]; immediate rewards e0 [0.3, 0.3] (a farmer
    that never reaches the goal), e1 [0.3, 0], e2 [0]. Gated returns: [0, 1 + 0.3, 0] = [0, 1.3, 0].
    GRPO over them: mean 0.433333, unbiased std sqrt((0.187778 + 0.751111 + 0.187778) / 2) = 0.750555 ->
    [-0.577350, 1.154701, -0.577350]. Without the gate the farmer's return is 0.6 and its advantage is
    almost 0 (returns [0.6, 1.3, 0]: (0.6 - 0.633333) / 0.650641 = -0.051232): the gate pushes it down."""
    step_episode, step_rewards, outcome = T([0, 0, 1, 1, 2]), T([0.3, 0.3, 0.3, 0.0, 0.0]), T([0.0, 1.0, 0.0])
    assert close(gated_returns(step_rewards, step_episode, outcome, 1.0), [0.0, 1.3, 0.0])
    gated, metrics = gra_advantages(T([0, 0, 0]), step_episode, step_rewards, episode_outcome=outcome,
                                    gate_threshold=1.0)
    assert (close(gated, [-0.577350, -0.577350, 1.154701, 1.154701, -0.577350])
            and close(metrics["env/gated_frac"], 2 / 3))
    ungated = group_standardize(T([0.6, 1.3, 0.0], dtype=torch.float64), T([0, 0, 0]))
    assert close(ungated[0], -0.051232) and gated[0] < ungated[0] - 0.5
    with pytest.raises(ValueError, match="gate_threshold"):
        gra_advantages(T([0]), T([0]), T([1.0]))


def _hgpo_episodes():
    # three episodes of one task: e0 anchors [A=0, C=2], e1 [B=1, C=2], e2 [A=0, C=2]
    return dict(episode_group=T([0, 0, 0]), step_episode=T([0, 0, 1, 1, 2, 2]), step_rewards=T([0.0, 1, 0, 1, 0, 0]),
                step_anchor=T([0, 2, 1, 2, 0, 2]))


def test_hgpo_depth_zero_is_gigpo():
    episodes = _hgpo_episodes()
    hgpo, _ = hgpo_advantages(**episodes, settings=HGPOSettings(hgpo_depth=0, gamma=0.9, scale="group"))
    gigpo, _ = gigpo_advantages(**episodes, gamma=0.9, scale="group")
    assert close(hgpo, gigpo, 1e-6)


def test_hgpo_history_levels_by_hand():
    """gamma 1, scale none (centring only), w = 1, depth 2, alpha 1 (level weights 1, 2, 3).
    Step returns: e0 [1, 1], e1 [1, 1], e2 [0, 0]; episode returns [1, 1, 0] -> A^E = [1/3, 1/3, -2/3].
    Level 0 (same anchor): {e0t0, e2t0} returns [1, 0] -> [+0.5, -0.5]; {e1t0} alone; {e0t1, e1t1, e2t1}
      returns [1, 1, 0] -> [1/3, 1/3, -2/3].
    Levels 1 and 2 (also the previous steps): t0 steps all start the episode -> {e0t0, e2t0} again;
      t1: e0 and e2 came from A, e1 from B -> {e0t1, e2t1} -> [+0.5, -0.5]; e1t1 alone.
    e0t0: 0.5 at every level -> 1/3 + 0.5 = 0.833333;  e2t0: -2/3 - 0.5 = -1.166667;  e1t0: no group -> 1/3.
    e0t1: (1 x 1/3 + 2 x 0.5 + 3 x 0.5) / 6 = 0.472222 -> 0.805556;  e1t1: level 0 only -> 1/3 + 1/3 = 0.666667;
    e2t1: (-2/3 - 1 - 1.5) / 6 = -0.527778 -> -1.194444.  GiGPO would give e0t1 0.666667, e2t1 -1.333333.
    Deepest usable level over the 5 steps with one: (2 + 2 + 2 + 0 + 2) / 5 = 1.6."""
    advantages, metrics = hgpo_advantages(**_hgpo_episodes(),
                                          settings=HGPOSettings(hgpo_depth=2, hgpo_alpha=1.0, gamma=1.0, scale="none"))
    assert close(advantages, [0.833333, 0.805556, 1 / 3, 0.666667, -1.166667, -1.194444])
    assert close(metrics["env/hgpo_depth_used"], 1.6)


def test_entropy_band_penalty_by_hand_and_its_gradient():
    """H_bar = [1, 2], band (0.8, 1.2) x H_bar. Turn 0 tokens H = [1.5, 0.5, 1.0]: 1.5 - 1.2 = 0.3,
    0.8 - 0.5 = 0.3, inside -> 0. Turn 1 (band 1.6..2.4): H 2.0 -> 0, 2.5 -> 0.1; a token of no turn -> 0.
    Gradient: +1 above the band (lowers H), -1 below (raises H), 0 inside."""
    entropy = T([[1.5, 0.5, 1.0], [2.0, 2.5, 1.0]], requires_grad=True)
    penalty = entropy_band_penalty(entropy, T([[0, 0, 0], [1, 1, -1]]), T([1.0, 2.0]))
    assert close(penalty.detach(), [[0.3, 0.3, 0.0], [0.0, 0.1, 0.0]])
    penalty.sum().backward()
    assert entropy.grad.tolist() == [[1.0, -1.0, 0.0], [0.0, 1.0, 0.0]]


def test_epo_phase_weight_follows_the_authors_schedule():
    """100 steps: step 0 -> 1; step 50 (end of the first half) -> 1 - 0.2 (1 - e^-2) = 0.827067;
    step 100 -> 0.8 e^-3 = 0.039830."""
    assert close([epo_phase_weight(0, 100), epo_phase_weight(50, 100), epo_phase_weight(100, 100)],
                 [1.0, 1 - 0.2 * (1 - math.exp(-2)), 0.8 * math.exp(-3)])
    assert close(epo_phase_weight(50, 100), 0.827067)
