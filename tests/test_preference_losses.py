"""Hand-derived checks for rlx.algorithms.preference.

Notation: sp(z) = log(1 + e^z), so -log sigmoid(z) = sp(-z), and sp(z) - sp(-z) = z.
Reference values used below (4 decimals are enough to derive by hand, 6 are asserted):
  sp(-0.1) = log(1 + e^-0.1) = log(1.904837) = 0.644397
  sp(-0.3) = log(1 + e^-0.3) = log(1.740818) = 0.554355
  sp(-1)   = log(1 + e^-1)   = log(1.367879) = 0.313262
  sp(-2)   = log(1 + e^-2)   = log(1.135335) = 0.126928
  log 2 = 0.693147,  log 1.25 = 0.223144
"""

import math

import pytest
import torch

from rlx.algorithms.preference import (
    PREFERENCE_LOSSES,
    REFERENCE_FREE,
    bradley_terry_loss,
    log_odds,
    preference_loss,
    sft_nll,
)

LOG2 = math.log(2.0)


def t(*values, requires_grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


def ref_based(loss_type, pi_c, pi_r, ref_c, ref_r, **kwargs):
    """Run a reference-based loss on one-pair-per-element float64 tensors."""
    return preference_loss(t(*pi_c), t(*pi_r), t(*ref_c), t(*ref_r), loss_type=loss_type, **kwargs)


# ---------------------------------------------------------------------------------------------
# DPO
# ---------------------------------------------------------------------------------------------


def test_dpo_hand_values():
    # pair 0: policy == reference -> h = 0 -> -log sigmoid(0) = log 2
    # pair 1: chosen log-ratio (-9) - (-10) = 1, rejected (-20) - (-20) = 0 -> h = 1,
    #         beta h = 0.1 -> sp(-0.1) = 0.644397
    loss, metrics = ref_based(
        "dpo", pi_c=(-5.0, -9.0), pi_r=(-7.0, -20.0), ref_c=(-5.0, -10.0), ref_r=(-7.0, -20.0),
        beta=0.1,
    )
    assert loss.shape == (2,)
    torch.testing.assert_close(loss, t(LOG2, 0.644397), atol=1e-6, rtol=0)
    # rewards: beta * log-ratio -> chosen (0, 0.1), rejected (0, 0)
    assert metrics["pref/chosen_reward"].item() == pytest.approx(0.05)
    assert metrics["pref/rejected_reward"].item() == pytest.approx(0.0)
    assert metrics["pref/margin"].item() == pytest.approx(0.05)
    # pair 0 is a tie (0 > 0 is false), pair 1 is correct -> 1/2
    assert metrics["pref/accuracy"].item() == 0.5
    # mean summed policy log-probs: (-5 - 9)/2 = -7, (-7 - 20)/2 = -13.5
    assert metrics["pref/chosen_logp"].item() == -7.0
    assert metrics["pref/rejected_logp"].item() == -13.5


def test_metrics_are_detached_scalars():
    pi_c, pi_r = t(-1.0, -2.0, requires_grad=True), t(-3.0, -1.0, requires_grad=True)
    ref = t(-2.0, -2.0)
    _, metrics = preference_loss(pi_c, pi_r, ref, ref, loss_type="dpo", beta=0.5)
    assert set(metrics) == {
        "pref/accuracy", "pref/margin", "pref/chosen_reward", "pref/rejected_reward",
        "pref/chosen_logp", "pref/rejected_logp",
    }
    for value in metrics.values():
        assert value.dim() == 0 and not value.requires_grad
    # log-ratios: chosen (1, 0), rejected (-1, 1); rewards x0.5 -> chosen (0.5, 0), rejected
    # (-0.5, 0.5): pair 0 correct, pair 1 wrong -> accuracy 0.5; margin mean(1, -0.5) = 0.25
    assert metrics["pref/accuracy"].item() == 0.5
    assert metrics["pref/margin"].item() == pytest.approx(0.25)


def test_dpo_small_beta_limit():
    # L = sp(-beta h). As beta -> 0: L -> log 2 and dL/dpi_c = -beta sigmoid(-beta h) -> -beta/2,
    # dL/dpi_r = +beta/2, whatever h is. h = (0 - (-3)) - (-4 - (-1)) = 3 + 3 = 6 here.
    beta = 1e-4
    pi_c, pi_r = t(0.0, requires_grad=True), t(-4.0, requires_grad=True)
    loss, _ = preference_loss(pi_c, pi_r, t(-3.0), t(-1.0), loss_type="dpo", beta=beta)
    assert loss.item() == pytest.approx(LOG2, abs=1e-3)
    loss.sum().backward()
    # sigmoid(-6e-4) = 0.49985, so the exact gradient is beta * 0.49985: within 0.1% of beta/2
    assert pi_c.grad.item() == pytest.approx(-beta / 2, rel=1e-3)
    assert pi_r.grad.item() == pytest.approx(beta / 2, rel=1e-3)


def test_reference_logps_carry_no_gradient_but_policy_does():
    pi_c, pi_r = t(-1.0, requires_grad=True), t(-2.0, requires_grad=True)
    ref_c, ref_r = t(-1.5), t(-1.5)
    for loss_type in ("dpo", "cdpo", "robust", "ipo", "hinge"):
        pi_c.grad = pi_r.grad = None
        kwargs = {"label_smoothing": 0.1} if loss_type in ("cdpo", "robust") else {}
        loss, _ = preference_loss(pi_c, pi_r, ref_c, ref_r, loss_type=loss_type, beta=0.1, **kwargs)
        loss.mean().backward()
        assert pi_c.grad is not None and torch.isfinite(pi_c.grad).all()
        # every loss here depends on h only, and dh/dpi_c = 1, dh/dpi_r = -1
        torch.testing.assert_close(pi_c.grad, -pi_r.grad)
        assert pi_c.grad.item() < 0  # descent raises the chosen log-prob


# ---------------------------------------------------------------------------------------------
# cDPO and robust DPO
# ---------------------------------------------------------------------------------------------


def test_cdpo_hand_value_and_limits():
    # h = 1, beta = 0.1, eps = 0.1:
    # 0.9 sp(-0.1) + 0.1 sp(0.1) = 0.9 * 0.644397 + 0.1 * 0.744397 = 0.579957 + 0.074440
    #                           = 0.654397  (= sp(-0.1) + eps * beta * h = 0.644397 + 0.01)
    args = {"pi_c": (-9.0,), "pi_r": (-20.0,), "ref_c": (-10.0,), "ref_r": (-20.0,), "beta": 0.1}
    loss, _ = ref_based("cdpo", label_smoothing=0.1, **args)
    assert loss.item() == pytest.approx(0.654397, abs=1e-6)
    # eps = 0 is plain DPO
    cdpo0, _ = ref_based("cdpo", label_smoothing=0.0, **args)
    dpo, _ = ref_based("dpo", **args)
    torch.testing.assert_close(cdpo0, dpo)


def test_cdpo_half_smoothing_is_symmetric_in_h():
    # eps = 0.5 -> 0.5 (sp(-x) + sp(x)), even in x: swapping chosen and rejected changes nothing
    forward, _ = ref_based("cdpo", pi_c=(-1.0,), pi_r=(-4.0,), ref_c=(-2.0,), ref_r=(-2.0,),
                           beta=0.3, label_smoothing=0.5)
    swapped, _ = ref_based("cdpo", pi_c=(-4.0,), pi_r=(-1.0,), ref_c=(-2.0,), ref_r=(-2.0,),
                           beta=0.3, label_smoothing=0.5)
    torch.testing.assert_close(forward, swapped)


def test_cdpo_rejects_out_of_range_smoothing():
    with pytest.raises(ValueError, match="label_smoothing"):
        ref_based("cdpo", pi_c=(0.0,), pi_r=(0.0,), ref_c=(0.0,), ref_r=(0.0,),
                  beta=0.1, label_smoothing=0.7)


def test_robust_dpo_hand_value():
    # h = 1, beta = 0.1, eps = 0.1:
    # [0.9 sp(-0.1) - 0.1 sp(0.1)] / 0.8 = (0.579957 - 0.074440) / 0.8 = 0.631897
    # (= sp(-0.1) - eps beta h / (1 - 2 eps) = 0.644397 - 0.01 / 0.8 = 0.644397 - 0.0125)
    loss, _ = ref_based("robust", pi_c=(-9.0,), pi_r=(-20.0,), ref_c=(-10.0,), ref_r=(-20.0,),
                        beta=0.1, label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.631897, abs=1e-6)


def test_robust_dpo_is_unbiased_for_the_clean_loss():
    # If the label is flipped w.p. eps, E[L_robust] = (1-eps) L_robust(h) + eps L_robust(-h)
    # = [((1-eps)^2 - eps^2) sp(-beta h)] / (1 - 2 eps) = sp(-beta h) = clean DPO loss.
    eps, beta = 0.2, 0.5
    pi_c, pi_r, ref_c, ref_r = (-3.0, -1.0), (-6.0, -0.5), (-4.0, -2.0), (-5.0, -1.5)
    observed, _ = ref_based("robust", pi_c, pi_r, ref_c, ref_r, beta=beta, label_smoothing=eps)
    flipped, _ = ref_based("robust", pi_r, pi_c, ref_r, ref_c, beta=beta, label_smoothing=eps)
    clean, _ = ref_based("dpo", pi_c, pi_r, ref_c, ref_r, beta=beta)
    torch.testing.assert_close((1 - eps) * observed + eps * flipped, clean)


@pytest.mark.parametrize("eps", [0.5, 0.7, -0.1])
def test_robust_dpo_rejects_eps_at_or_above_half(eps):
    with pytest.raises(ValueError, match="label_smoothing"):
        ref_based("robust", pi_c=(0.0,), pi_r=(0.0,), ref_c=(0.0,), ref_r=(0.0,),
                  beta=0.1, label_smoothing=eps)


def test_label_smoothing_and_gamma_rejected_where_unused():
    args = {"pi_c": (0.0,), "pi_r": (0.0,), "ref_c": (0.0,), "ref_r": (0.0,), "beta": 0.1}
    with pytest.raises(ValueError, match="label_smoothing"):
        ref_based("dpo", label_smoothing=0.1, **args)
    with pytest.raises(ValueError, match="gamma"):
        ref_based("ipo", gamma=0.5, **args)


# ---------------------------------------------------------------------------------------------
# IPO and hinge
# ---------------------------------------------------------------------------------------------


def test_ipo_hand_values_and_minimum():
    # beta = 0.5 -> target h* = 1/(2 beta) = 1.
    # pair 0: h = (-1 - (-4)) - (-5 - (-5)) = 3 -> (3 - 1)^2 = 4
    # pair 1: h = (-2 - (-3)) - (-1 - (-1)) = 1 -> 0 (the minimum)
    loss, _ = ref_based("ipo", pi_c=(-1.0, -2.0), pi_r=(-5.0, -1.0), ref_c=(-4.0, -3.0),
                        ref_r=(-5.0, -1.0), beta=0.5)
    torch.testing.assert_close(loss, t(4.0, 0.0))


def test_ipo_gradient_vanishes_at_target():
    # dL/dh = 2 (h - 1/(2 beta)); with beta = 0.25 the target is h = 2.
    beta = 0.25
    pi_c = t(2.0, requires_grad=True)
    loss, _ = preference_loss(pi_c, t(0.0), t(0.0), t(0.0), loss_type="ipo", beta=beta)
    loss.sum().backward()
    assert pi_c.grad.item() == pytest.approx(0.0, abs=1e-12)
    # either side of the target is strictly worse: (2 +- 0.1 - 2)^2 = 0.01
    for h in (1.9, 2.1):
        off, _ = preference_loss(t(h), t(0.0), t(0.0), t(0.0), loss_type="ipo", beta=beta)
        assert off.item() == pytest.approx(0.01)


def test_ipo_length_normalize_uses_per_token_ratios():
    # log-ratios 6 over 3 tokens and 0 over 2 tokens -> h = 2; beta = 0.25 -> target 2 -> loss 0.
    # Without normalization h = 6 -> (6 - 2)^2 = 16.
    kwargs = {"loss_type": "ipo", "beta": 0.25,
              "chosen_lengths": t(3.0), "rejected_lengths": t(2.0)}
    normalized, _ = preference_loss(t(6.0), t(0.0), t(0.0), t(0.0), length_normalize=True, **kwargs)
    summed, _ = preference_loss(t(6.0), t(0.0), t(0.0), t(0.0), **kwargs)
    assert normalized.item() == pytest.approx(0.0)
    assert summed.item() == pytest.approx(16.0)


def test_hinge_zero_beyond_margin():
    # beta = 0.5: relu(1 - 0.5 h). h = 1 -> 0.5; h = 2 -> 0 (exactly at margin); h = 4 -> 0;
    # h = -2 -> 2.
    pi_c = t(1.0, 2.0, 4.0, -2.0, requires_grad=True)
    zeros = t(0.0, 0.0, 0.0, 0.0)
    loss, _ = preference_loss(pi_c, zeros, zeros, zeros, loss_type="hinge", beta=0.5)
    torch.testing.assert_close(loss, t(0.5, 0.0, 0.0, 2.0), check_dtype=False)
    loss.sum().backward()
    # gradient -beta inside the margin, 0 beyond it (h = 4)
    assert pi_c.grad[0].item() == -0.5 and pi_c.grad[2].item() == 0.0


# ---------------------------------------------------------------------------------------------
# Length-normalized DPO
# ---------------------------------------------------------------------------------------------


def test_length_normalized_dpo_hand_value():
    # chosen log-ratio (-10) - (-12) = 2 over 4 tokens -> 0.5
    # rejected log-ratio (-20) - (-19) = -1 over 2 tokens -> -0.5
    # h = 1, beta 0.1 -> sp(-0.1) = 0.644397.  Unnormalized: h = 3 -> sp(-0.3) = 0.554355.
    kwargs = {"loss_type": "dpo", "beta": 0.1,
              "chosen_lengths": torch.tensor([4]), "rejected_lengths": torch.tensor([2])}
    ln, metrics = preference_loss(t(-10.0), t(-20.0), t(-12.0), t(-19.0),
                                  length_normalize=True, **kwargs)
    plain, _ = preference_loss(t(-10.0), t(-20.0), t(-12.0), t(-19.0), **kwargs)
    assert ln.item() == pytest.approx(0.644397, abs=1e-6)
    assert plain.item() == pytest.approx(0.554355, abs=1e-6)
    # rewards are beta * per-token log-ratio: 0.05 and -0.05
    assert metrics["pref/chosen_reward"].item() == pytest.approx(0.05)
    assert metrics["pref/rejected_reward"].item() == pytest.approx(-0.05)


def test_length_normalized_dpo_requires_lengths():
    with pytest.raises(ValueError, match="chosen_lengths"):
        preference_loss(t(-1.0), t(-2.0), t(-1.0), t(-2.0), loss_type="dpo", beta=0.1,
                        length_normalize=True)
    with pytest.raises(ValueError, match="rejected_lengths"):
        preference_loss(t(-1.0), t(-2.0), t(-1.0), t(-2.0), loss_type="dpo", beta=0.1,
                        length_normalize=True, chosen_lengths=t(3.0))
    with pytest.raises(ValueError, match="> 0"):
        preference_loss(t(-1.0), t(-2.0), t(-1.0), t(-2.0), loss_type="dpo", beta=0.1,
                        length_normalize=True, chosen_lengths=t(0.0), rejected_lengths=t(1.0))


# ---------------------------------------------------------------------------------------------
# SimPO
# ---------------------------------------------------------------------------------------------


def simpo(logp_c, logp_r, len_c, len_r, beta=2.0, gamma=1.0):
    return preference_loss(t(logp_c), t(logp_r), None, None, loss_type="simpo", beta=beta,
                           gamma=gamma, chosen_lengths=t(len_c), rejected_lengths=t(len_r))


def test_simpo_hand_value():
    # r_c = 2 * (-4 / 4) = -2, r_r = 2 * (-12 / 6) = -4, gamma = 1:
    # -log sigmoid(-2 + 4 - 1) = sp(-1) = 0.313262
    loss, metrics = simpo(-4.0, -12.0, 4.0, 6.0)
    assert loss.item() == pytest.approx(0.313262, abs=1e-6)
    assert metrics["pref/chosen_reward"].item() == pytest.approx(-2.0)
    assert metrics["pref/rejected_reward"].item() == pytest.approx(-4.0)
    assert metrics["pref/margin"].item() == pytest.approx(2.0)  # gamma not subtracted
    assert metrics["pref/accuracy"].item() == 1.0


def test_simpo_length_normalization():
    base, _ = simpo(-4.0, -12.0, 4.0, 6.0)
    # doubling both summed log-prob and length keeps logp/|y| and so the loss
    doubled, _ = simpo(-8.0, -24.0, 8.0, 12.0)
    torch.testing.assert_close(doubled, base)
    # doubling only the chosen length: r_c = 2 * (-4/8) = -1,
    # logit -1 - (-4) - 1 = 2 -> sp(-2) = 0.126928
    longer, _ = simpo(-4.0, -12.0, 8.0, 6.0)
    assert longer.item() == pytest.approx(0.126928, abs=1e-6)


def test_simpo_gamma_is_absolute_margin():
    # gamma enters as r_c - r_r - gamma: with r_c - r_r = 2 and gamma = 2 the logit is 0 -> log 2
    loss, _ = simpo(-4.0, -12.0, 4.0, 6.0, gamma=2.0)
    assert loss.item() == pytest.approx(LOG2)


def test_reference_free_losses_need_lengths_and_refuse_reference():
    for loss_type in sorted(REFERENCE_FREE):
        with pytest.raises(ValueError, match="chosen_lengths"):
            preference_loss(t(-1.0), t(-2.0), None, None, loss_type=loss_type, beta=0.1)
        with pytest.raises(ValueError, match="reference-free"):
            preference_loss(t(-1.0), t(-2.0), t(-1.0), t(-2.0), loss_type=loss_type, beta=0.1,
                            chosen_lengths=t(1.0), rejected_lengths=t(1.0))


# ---------------------------------------------------------------------------------------------
# ORPO
# ---------------------------------------------------------------------------------------------


def test_orpo_hand_value():
    # chosen: 3 tokens, summed log-prob 3 log 0.5 -> P = 0.5, odds 1, log odds 0
    # rejected: 2 tokens, summed log-prob 2 log 0.2 -> P = 0.2, odds 0.25, log odds -log 4
    # L_OR = sp(-log 4) = log(1 + 1/4) = log 1.25 = 0.223144; lambda = beta = 0.1 -> 0.0223144
    loss, metrics = preference_loss(
        t(3 * math.log(0.5)), t(2 * math.log(0.2)), None, None, loss_type="orpo", beta=0.1,
        chosen_lengths=t(3.0), rejected_lengths=t(2.0),
    )
    assert loss.item() == pytest.approx(0.1 * 0.223144, abs=1e-7)
    # rewards are the log odds themselves: 0 and -log 4 = -1.386294
    assert metrics["pref/chosen_reward"].item() == pytest.approx(0.0, abs=1e-12)
    assert metrics["pref/rejected_reward"].item() == pytest.approx(-math.log(4.0))
    assert metrics["pref/margin"].item() == pytest.approx(math.log(4.0))


def test_log_odds_stable_near_zero_logp():
    # avg log p = -1e-8: 1 - p = 1e-8 (to 1e-16), so log odds = -1e-8 - log(1e-8) = 18.420681.
    # In float32, exp(-1e-8) rounds to exactly 1, so the naive log(1 - exp(x)) is log 0 = -inf.
    x = torch.tensor([-1e-8, math.log(0.5), -30.0], dtype=torch.float32, requires_grad=True)
    naive = x.detach() - torch.log(1 - torch.exp(x.detach()))
    assert torch.isinf(naive[0])
    odds = log_odds(x)
    assert odds[0].item() == pytest.approx(18.420681, rel=1e-5)
    # p = 0.5 -> log odds 0;  x = -30 -> log odds ~ -30 - log(1 - e^-30) ~ -30
    assert odds[1].item() == pytest.approx(0.0, abs=1e-6)
    assert odds[2].item() == pytest.approx(-30.0, abs=1e-5)
    odds.sum().backward()
    # d/dx [x - log(1 - e^x)] = 1 / (1 - e^x): 1e8 at x = -1e-8 (large but finite), 2 at p = 0.5
    assert torch.isfinite(x.grad).all()
    assert x.grad[1].item() == pytest.approx(2.0, rel=1e-5)


def test_log_odds_certain_completion_is_finite():
    # log p = 0 exactly (P = 1) would be infinite odds; it is clamped to a large finite value
    odds = log_odds(torch.tensor([0.0, 0.0]))
    assert torch.isfinite(odds).all() and (odds > 80).all()
    loss, _ = preference_loss(torch.tensor([0.0]), torch.tensor([0.0]), None, None,
                              loss_type="orpo", beta=1.0, chosen_lengths=torch.tensor([5]),
                              rejected_lengths=torch.tensor([5]))
    assert loss.item() == pytest.approx(LOG2)  # equal odds -> sp(0) = log 2, not nan


def test_orpo_full_objective_with_sft_term():
    # L_ORPO = L_SFT + lambda L_OR. SFT: -3 log 0.5 / 3 = log 2 per token.
    chosen, rejected = t(3 * math.log(0.5), requires_grad=True), t(2 * math.log(0.2))
    lengths_c, lengths_r = t(3.0), t(2.0)
    odds_ratio, _ = preference_loss(chosen, rejected, None, None, loss_type="orpo", beta=0.1,
                                    chosen_lengths=lengths_c, rejected_lengths=lengths_r)
    total = sft_nll(chosen, lengths_c) + odds_ratio
    assert total.item() == pytest.approx(LOG2 + 0.0223144, abs=1e-6)
    total.sum().backward()
    assert chosen.grad.item() < 0


# ---------------------------------------------------------------------------------------------
# SFT term, reward model, dispatch errors
# ---------------------------------------------------------------------------------------------


def test_sft_nll_is_per_token():
    # -(-6)/3 = 2, -(-1)/4 = 0.25
    torch.testing.assert_close(sft_nll(t(-6.0, -1.0), torch.tensor([3, 4])), t(2.0, 0.25))


def test_bradley_terry_margin_and_centering():
    # s_c = 2, s_r = 1, margin 1 -> sp(-(2 - 1 - 1)) = log 2
    # centering 0.01 * (2 + 1)^2 = 0.09 -> 0.783147
    chosen, rejected = t(2.0, 0.5, requires_grad=True), t(1.0, 1.5)
    loss, metrics = bradley_terry_loss(chosen, rejected, margin=t(1.0, 0.0), center_coef=0.01)
    # pair 1: s_c - s_r = -1, no margin -> sp(1) = 1 + sp(-1) = 1.313262; centering 0.01 * 4
    torch.testing.assert_close(loss, t(0.783147, 1.353262), atol=1e-6, rtol=0)
    assert metrics["rm/accuracy"].item() == 0.5
    assert metrics["rm/margin"].item() == pytest.approx(0.0)  # mean(1, -1), margin not included
    assert metrics["rm/chosen_score"].item() == pytest.approx(1.25)
    assert metrics["rm/rejected_score"].item() == pytest.approx(1.25)
    loss.sum().backward()
    # pair 0: d/ds_c = -sigmoid(0) + 2 * 0.01 * 3 = -0.5 + 0.06 = -0.44
    assert chosen.grad[0].item() == pytest.approx(-0.44)


def test_bradley_terry_defaults():
    # no margin, no centering: s_c - s_r = 0.1 -> sp(-0.1) = 0.644397
    loss, _ = bradley_terry_loss(t(0.3), t(0.2))
    assert loss.item() == pytest.approx(0.644397, abs=1e-6)
    # the plain BT loss ignores a shift of both scores; centering does not
    shifted, _ = bradley_terry_loss(t(10.3), t(10.2))
    torch.testing.assert_close(shifted, loss)
    centered, _ = bradley_terry_loss(t(10.3), t(10.2), center_coef=0.01)
    assert centered.item() > loss.item()


def test_unknown_loss_type_names_choices():
    with pytest.raises(ValueError, match="valid choices") as info:
        preference_loss(t(-1.0), t(-2.0), t(-1.0), t(-2.0), loss_type="kto", beta=0.1)
    for name in PREFERENCE_LOSSES:
        assert name in str(info.value)


@pytest.mark.parametrize("loss_type", sorted(set(PREFERENCE_LOSSES) - REFERENCE_FREE))
def test_missing_reference_raises(loss_type):
    with pytest.raises(ValueError, match="reference"):
        preference_loss(t(-1.0), t(-2.0), None, None, loss_type=loss_type, beta=0.1)


def test_nonpositive_beta_rejected():
    with pytest.raises(ValueError, match="beta"):
        preference_loss(t(-1.0), t(-2.0), t(-1.0), t(-2.0), loss_type="ipo", beta=0.0)


@pytest.mark.parametrize("loss_type", PREFERENCE_LOSSES)
def test_every_loss_backpropagates(loss_type):
    torch.manual_seed(0)
    pi_c = (-torch.rand(4, dtype=torch.float64) * 10).requires_grad_()
    pi_r = (-torch.rand(4, dtype=torch.float64) * 10).requires_grad_()
    reference_free = loss_type in REFERENCE_FREE
    ref_c = None if reference_free else -torch.rand(4, dtype=torch.float64) * 10
    ref_r = None if reference_free else -torch.rand(4, dtype=torch.float64) * 10
    loss, metrics = preference_loss(
        pi_c, pi_r, ref_c, ref_r, loss_type=loss_type, beta=0.1,
        label_smoothing=0.1 if loss_type in ("cdpo", "robust") else 0.0,
        chosen_lengths=torch.tensor([3, 5, 7, 9]), rejected_lengths=torch.tensor([2, 4, 6, 8]),
    )
    assert loss.shape == (4,)
    loss.mean().backward()
    assert torch.isfinite(pi_c.grad).all() and torch.isfinite(pi_r.grad).all()
    assert pi_c.grad.abs().sum() > 0
    assert all(torch.isfinite(value) for value in metrics.values())
