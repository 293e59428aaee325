"""Policy-gradient math (advantages, losses, KL, overlong shaping) against hand-derived numbers."""

import math

import pytest
import torch

from rlx.algorithms.advantages import (
    gae_advantages,
    group_advantages,
    median_advantages,
    outcome_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    sign_weighted,
    tied_groups,
    whiten,
    zero_std_group_fraction,
)
from rlx.algorithms.grouping import fixed_groups
from rlx.algorithms.kl import adaptive_kl_coef, kl_penalty, sequence_kl_in_reward, token_rewards
from rlx.algorithms.logprobs import token_entropy, token_logprobs
from rlx.algorithms.losses import (
    aggregate,
    clipped_surrogate,
    explained_variance,
    importance_ratio,
    top_entropy_mask,
    value_loss,
)
from rlx.rewards.overlong import overlong_penalty


def test_group_advantages_group_std():
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.8660
    # group [1, 1, 1, 0]: mean 0.75, std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 -> 0.5, -1.5
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    adv = group_advantages(rewards, 4, scale="group", eps=0.0)
    expected = torch.tensor([0.8660, -0.8660, -0.8660, 0.8660, 0.5, 0.5, 0.5, -1.5])
    assert torch.allclose(adv, expected, atol=1e-4)


def test_group_advantages_none_and_batch():
    rewards = torch.tensor([2.0, 0.0, 3.0, 3.0])
    # none: centred only -> [1, -1, 0, 0]
    assert torch.allclose(group_advantages(rewards, 2, scale="none"), torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # batch: std of [2, 0, 3, 3] (mean 2, var (0 + 4 + 1 + 1)/3 = 2) = 1.41421 -> [0.7071, -0.7071, 0, 0]
    adv = group_advantages(rewards, 2, scale="batch", eps=0.0)
    assert torch.allclose(adv, torch.tensor([0.7071, -0.7071, 0.0, 0.0]), atol=1e-4)


def test_group_advantages_edge_cases():
    # all-equal rewards: zero advantage, no division by zero
    assert torch.equal(group_advantages(torch.ones(6), 3), torch.zeros(6))
    # groups of size 1: zero advantage
    assert torch.equal(group_advantages(torch.tensor([1.0, 0.0]), 1), torch.zeros(2))
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.ones(6), 4)
    with pytest.raises(ValueError, match="valid choices"):
        group_advantages(torch.ones(4), 2, scale="bogus")
    assert zero_std_group_fraction(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2) == 0.5


def test_clipped_surrogate_hand_values():
    # token ratios exp(log 1.5) = 1.5 and exp(log 0.5) = 0.5, clip 0.2/0.3
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    # A = +1: min(1.5, clip(1.5)=1.3) = 1.3 ; min(0.5, clip(0.5)=0.8) = 0.5 -> loss [-1.3, -0.5]
    loss, m = clipped_surrogate(logp, old, torch.tensor([1.0]), mask, 0.2, 0.3)
    assert torch.allclose(loss, torch.tensor([[-1.3, -0.5]]))
    assert m["train/clip_frac_high"].item() == pytest.approx(0.5)
    assert m["train/clip_frac_low"].item() == 0.0
    # A = -1: min(-1.5, -1.3) = -1.5 ; min(-0.5, -0.8) = -0.8 -> loss [1.5, 0.8]
    loss, m = clipped_surrogate(logp, old, torch.tensor([-1.0]), mask, 0.2, 0.3)
    assert torch.allclose(loss, torch.tensor([[1.5, 0.8]]))
    assert m["train/clip_frac_low"].item() == pytest.approx(0.5)


def test_clipped_surrogate_gradient_sign():
    # on-policy (ratio 1) the gradient of the loss w.r.t. logp is -A per token: positive advantage raises logp
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = clipped_surrogate(logp, logp.detach(), torch.tensor([2.0, -1.0]), torch.ones(2, 3), 0.2, 0.2)
    loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2.0] * 3, [1.0] * 3]))


def test_aggregation_modes_and_microbatch_exactness():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # token-mean: (1 + 2 + 3 + 4) / 4 = 2.5
    assert aggregate(token_loss, mask, "token-mean", 4, 2).item() == pytest.approx(2.5)
    # seq-mean-token-mean: (6/3 + 4/1) / 2 = 3
    assert aggregate(token_loss, mask, "seq-mean-token-mean", 4, 2).item() == pytest.approx(3.0)
    # seq-mean-token-sum: (6 + 4) / 2 = 5
    assert aggregate(token_loss, mask, "seq-mean-token-sum", 4, 2).item() == pytest.approx(5.0)
    # seq-mean-token-sum-norm with constant 10: 10 / (2 * 10) = 0.5
    assert aggregate(token_loss, mask, "seq-mean-token-sum-norm", 4, 2, max_len=10).item() == pytest.approx(0.5)
    # micro-batches with the global normaliser sum to the full-batch value (not a mean of means: 2 and 4)
    parts = sum(aggregate(token_loss[i : i + 1], mask[i : i + 1], "token-mean", 4, 2) for i in range(2))
    assert parts.item() == pytest.approx(2.5)
    # a fully masked row contributes nothing
    assert aggregate(token_loss, torch.zeros(2, 3), "seq-mean-token-mean", 0, 2).item() == 0.0


def test_kl_estimators():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    d = math.log(2.0)  # log(0.5 / 0.25)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + d)  # exp(-d) = 0.5
    assert kl_penalty(ref, ref, "k3").item() == 0.0
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(logp, ref, "k4")


def test_token_logprobs_and_entropy():
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)]]])  # probs [0.25, 0.25, 0.5]
    assert token_logprobs(logits, torch.tensor([[2]])).item() == pytest.approx(math.log(0.5))
    expected_entropy = -(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5))
    assert token_entropy(logits).item() == pytest.approx(expected_entropy)


# ---------------------------------------------------------------------------------------------
# Estimators beyond GRPO
# ---------------------------------------------------------------------------------------------


def test_rloo_leave_one_out():
    # group [1, 0, 0]: others' means 0, 0.5, 0.5 -> [1, -0.5, -0.5]; group [1, 1, 1] ties -> 0
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 3)
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]))
    # equals G/(G-1) * (r - mean): 3/2 * (1 - 1/3) = 1
    assert torch.equal(rloo_advantages(torch.tensor([1.0, 0.0]), 1), torch.zeros(2))  # size-1 groups


def test_reinforce_pp_with_and_without_baseline():
    rewards = torch.tensor([3.0, 1.0, 1.0, 1.0])
    # no baseline: mean 1.5, deviations [1.5, -.5, -.5, -.5], unbiased var (2.25 + 3 * .25) / 3 = 1
    adv = reinforce_pp_advantages(rewards, 2, baseline=False, eps=0.0)
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # baseline: group-centred [1, -1, 0, 0], mean 0, std sqrt(2/3) = 0.81650 -> [1.2247, -1.2247, 0, 0]
    adv = reinforce_pp_advantages(rewards, 2, baseline=True, eps=0.0)
    assert torch.allclose(adv, torch.tensor([1.2247, -1.2247, 0.0, 0.0]), atol=1e-4)
    # all-equal rewards and a single sample: zero, not nan
    assert torch.equal(reinforce_pp_advantages(torch.ones(4), 2, baseline=False), torch.zeros(4))
    assert torch.equal(reinforce_pp_advantages(torch.tensor([5.0]), 1, baseline=False), torch.zeros(1))


def test_median_advantages_and_pivot():
    # group [1, 0, 0]: sorted [0, 0, 1], median 0; first sample equal to 0 is index 1 (the pivot)
    # group [0.2, 0.9, 0.5]: median 0.5 at index 2 -> A = [-0.3, 0.4, 0]
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.2, 0.9, 0.5])
    adv, keep = median_advantages(rewards, 3, scale="none")
    assert torch.allclose(adv, torch.tensor([1.0, 0.0, 0.0, -0.3, 0.4, 0.0]))
    assert keep.tolist() == [True, False, True, True, True, False]
    # scale=group: group 2 std: mean 0.53333, squared deviations .11111 + .13444 + .00111 = .24667, / 2 -> std .35119
    adv, _ = median_advantages(rewards, 3, scale="group", eps=0.0)
    assert torch.allclose(adv[3:], torch.tensor([-0.3, 0.4, 0.0]) / 0.35119, atol=1e-4)
    # ties: every advantage 0, exactly one pivot per group
    adv, keep = median_advantages(torch.ones(6), 3)
    assert torch.equal(adv, torch.zeros(6)) and keep.tolist() == [False, True, True, False, True, True]
    # dispatch returns the keep mask; other estimators keep every sample
    _, keep, _ = outcome_advantages(rewards, fixed_groups(6, 3), "median")
    assert keep.sum().item() == 4
    assert outcome_advantages(rewards, fixed_groups(6, 3), "rloo")[1].all()
    with pytest.raises(ValueError, match="valid choices"):
        outcome_advantages(rewards, fixed_groups(6, 3), "gae")


def test_sign_weighting():
    # W-REINFORCE: positive advantages x 0.1, negative x 1
    adv = sign_weighted(torch.tensor([2.0, -1.0, 0.0]), 0.1, 1.0)
    assert torch.allclose(adv, torch.tensor([0.2, -1.0, 0.0]))
    assert torch.equal(sign_weighted(torch.tensor([2.0, -1.0]), 1.0, 0.0), torch.tensor([2.0, 0.0]))  # PSR


def test_gae_hand_values_padding_and_empty_rows():
    # row 0: r = [0, 1], V = [0.5, 0.2], gamma 1, lam 0.5
    #   delta_1 = 1 + 0 - 0.2 = 0.8 -> A_1 = 0.8; delta_0 = 0 + 0.2 - 0.5 = -0.3 -> A_0 = -0.3 + 0.5 * 0.8 = 0.1
    #   returns = A + V = [0.6, 1.0]
    # row 1: one valid token, r = 2, V = 0.5 -> A = 1.5, return 2; the padded position (V = 9) is ignored
    # row 2: empty completion (fully masked) -> zeros
    rewards = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]])
    values = torch.tensor([[0.5, 0.2], [0.5, 9.0], [3.0, 3.0]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.1, 0.8], [1.5, 0.0], [0.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.6, 1.0], [2.0, 0.0], [0.0, 0.0]]))
    # gamma 0.5, lam 1, V = 0: A_t is the discounted sum of future rewards: [0.5 * 1, 1]
    adv, _ = gae_advantages(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), torch.ones(1, 2), gamma=0.5, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 1.0]]))


def test_whiten_over_valid_entries():
    # valid [1, 2, 3]: mean 2, unbiased std 1 -> [-1, 0, 1]; the padded entry stays 0
    out = whiten(torch.tensor([[1.0, 2.0], [3.0, 100.0]]), torch.tensor([[1, 1], [1, 0]]), eps=0.0)
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    out = whiten(torch.tensor([1.0, 2.0, 3.0]), torch.ones(3), shift_mean=False, eps=0.0)
    assert torch.allclose(out, torch.tensor([1.0, 2.0, 3.0]))  # scaled by 1/std = 1, mean kept


def test_tied_groups():
    assert tied_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 2).tolist() == [True, False, True]


# ---------------------------------------------------------------------------------------------
# Ratio and clipping variants, entropy selection, value loss
# ---------------------------------------------------------------------------------------------


def test_dual_clip_bounds_negative_advantages():
    # A = -1, ratio 5: PPO loss = -min(-5, -1.2) = 5; dual clip c = 3 -> min(5, 3) = 3
    logp = torch.log(torch.tensor([[5.0, 1.0]]))
    loss, m = clipped_surrogate(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), 0.2, 0.2,
                                dual_clip=3.0)
    assert torch.allclose(loss, torch.tensor([[3.0, 1.0]]))
    assert m["train/dual_clip_frac"].item() == pytest.approx(0.5)
    # positive advantages are untouched by the dual clip: A = +1, ratio 5 -> -min(5, 1.2) = -1.2
    loss, _ = clipped_surrogate(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.2, dual_clip=3.0)
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.0]]))


def test_sequence_ratio_gspo():
    # log-ratios [log 2, 0]: sequence ratio exp((log 2 + 0) / 2) = sqrt(2) on both tokens;
    # with the second token masked: exp(log 2 / 1) = 2 on every position
    logp = torch.tensor([[math.log(2.0), 0.0]])
    ratio = importance_ratio(logp, torch.zeros(1, 2), torch.ones(1, 2), "sequence")
    assert torch.allclose(ratio, torch.full((1, 2), math.sqrt(2.0)))
    ratio = importance_ratio(logp, torch.zeros(1, 2), torch.tensor([[1, 0]]), "sequence")
    assert torch.allclose(ratio, torch.full((1, 2), 2.0))
    # a fully masked row has ratio 1
    assert importance_ratio(logp, torch.zeros(1, 2), torch.zeros(1, 2), "sequence").eq(1.0).all()
    # gradient at ratio 1 with A = 1, seq-mean-token-mean over 2 tokens: loss = -s, ds/dlogp_t = 1/2 -> -0.5 each
    live = torch.zeros(1, 2, requires_grad=True)
    token_loss, _ = clipped_surrogate(live, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.2,
                                      ratio_level="sequence")
    aggregate(token_loss, torch.ones(1, 2), "seq-mean-token-mean", 2, 1).backward()
    assert torch.allclose(live.grad, torch.tensor([[-0.5, -0.5]]))
    # sequence clipping: ratio 2 with A = 1 and clip_high 4e-4 -> the whole sequence is clipped
    _, m = clipped_surrogate(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[1, 0]]), 3e-4, 4e-4,
                             ratio_level="sequence")
    assert m["train/clip_frac_high"].item() == 1.0
    with pytest.raises(ValueError, match="token, sequence"):
        importance_ratio(logp, logp, torch.ones(1, 2), "word")


def test_approx_kl_and_empty_completions():
    # ratio 2: k3 = (2 - 1) - log 2 = 0.30685
    logp = torch.tensor([[math.log(2.0)]])
    _, m = clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.2)
    assert m["train/approx_kl"].item() == pytest.approx(1.0 - math.log(2.0), abs=1e-6)
    # empty completions (all masked): zero loss, zero metrics, no nan
    loss, m = clipped_surrogate(torch.randn(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.zeros(2, 3), 0.2,
                                0.2)
    assert torch.equal(loss, torch.zeros(2, 3))
    assert all(math.isfinite(v.item()) and v.item() == 0 for k, v in m.items() if k != "train/ratio_mean")


def test_top_entropy_mask():
    entropy = torch.tensor([[0.1, 0.9], [0.5, 0.3]])
    # rho 0.5 of 4 tokens -> the two highest: 0.9 and 0.5
    assert top_entropy_mask(entropy, torch.ones(2, 2), 0.5).tolist() == [[False, True], [True, False]]
    # the masked 0.9 is not a candidate: of [0.1, 0.5, 0.3] keep round(1.5) = 2 -> 0.5 and 0.3
    assert top_entropy_mask(entropy, torch.tensor([[1, 0], [1, 1]]), 0.5).tolist() == [[False, False], [True, True]]
    assert top_entropy_mask(entropy, torch.tensor([[1, 0], [1, 1]]), 1.0).tolist() == [[True, False], [True, True]]
    assert not top_entropy_mask(entropy, torch.zeros(2, 2), 0.2).any()  # nothing valid


def test_value_loss_clipping_and_explained_variance():
    # V 2, V_old 1, R 0, c 0.5: unclipped 4, clipped (1.5 - 0)^2 = 2.25 -> max 4 -> 0.5 * 4 = 2
    # V 1.2, V_old 1, R 2, c 0.1: unclipped 0.64, clipped (1.1 - 2)^2 = 0.81 -> 0.405 (clip term wins)
    values, old, ret = torch.tensor([[2.0, 1.2]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 2.0]])
    loss, m = value_loss(values[:, :1], old[:, :1], ret[:, :1], torch.ones(1, 1), 0.5)
    assert loss.item() == pytest.approx(2.0)
    loss, m = value_loss(values[:, 1:], old[:, 1:], ret[:, 1:], torch.ones(1, 1), 0.1)
    assert loss.item() == pytest.approx(0.405) and m["train/value_clip_frac"].item() == 1.0
    loss, _ = value_loss(values, old, ret, torch.tensor([[0, 1]]), None)  # no clip: 0.5 * 0.64, first masked
    assert torch.allclose(loss, torch.tensor([[0.0, 0.32]]))
    # R [1, 2, 3], V [1, 2, 2]: residual [0, 0, 1] has variance 1/3; Var(R) = 1 -> 0.6667
    assert explained_variance(torch.tensor([1.0, 2.0, 2.0]), torch.tensor([1.0, 2.0, 3.0]),
                              torch.ones(3)) == pytest.approx(2 / 3)
    assert explained_variance(torch.zeros(3), torch.ones(3), torch.ones(3)) == 0.0  # constant returns


def test_aggregation_exact_across_microbatches_every_mode():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        whole = aggregate(token_loss, mask, mode, 6, 3, max_len=3)
        parts = aggregate(token_loss[:2], mask[:2], mode, 6, 3,
                          max_len=3) + aggregate(token_loss[2:], mask[2:], mode, 6, 3, max_len=3)
        assert parts.item() == pytest.approx(whole.item()), mode
    # token-mean (1+2+3+4+5+6)/6 = 3.5; seq-mean-token-mean (2 + 4 + 5.5)/3 = 3.8333
    assert aggregate(token_loss, mask, "token-mean", 6, 3).item() == pytest.approx(3.5)
    assert aggregate(token_loss, mask, "seq-mean-token-mean", 6, 3).item() == pytest.approx(11.5 / 3)


# ---------------------------------------------------------------------------------------------
# KL placement and control, overlong punishment
# ---------------------------------------------------------------------------------------------


def test_kl_in_reward_and_token_rewards():
    # r = 1, k1 = [0.2, 0.3], coef 0.5 -> 1 - 0.5 * 0.5 = 0.75; the masked third token is ignored
    logp, ref = torch.tensor([[0.2, 0.3, 7.0]]), torch.zeros(1, 3)
    shaped, kl = sequence_kl_in_reward(torch.tensor([1.0]), logp, ref, torch.tensor([[1, 1, 0]]), 0.5)
    assert shaped.item() == pytest.approx(0.75) and kl.item() == pytest.approx(0.5)
    # token rewards: outcome on the last valid token, minus coef * k1: [-0.1, 1 - 0.2, 0]; empty row gets nothing
    out = token_rewards(torch.tensor([1.0, 5.0]), torch.tensor([[1, 1, 0], [0, 0, 0]]),
                        torch.tensor([[0.1, 0.2, 0.3], [1.0, 1.0, 1.0]]), torch.zeros(2, 3), kl_coef=1.0)
    assert torch.allclose(out, torch.tensor([[-0.1, 0.8, 0.0], [0.0, 0.0, 0.0]]))


def test_adaptive_kl_controller():
    # KL 12 vs target 6: error 1 clipped to 0.2; n 100, horizon 1000 -> 0.1 * (1 + 0.02) = 0.102
    assert adaptive_kl_coef(0.1, 12.0, 6.0, 1000, 100) == pytest.approx(0.102)
    # KL 3 vs 6: error -0.5 clipped to -0.2 -> 0.1 * 0.98 = 0.098; on target: unchanged
    assert adaptive_kl_coef(0.1, 3.0, 6.0, 1000, 100) == pytest.approx(0.098)
    assert adaptive_kl_coef(0.1, 6.0, 6.0, 1000, 100) == pytest.approx(0.1)


def test_overlong_penalty_buffer_formula():
    # L_max 16, buffer 4: penalty starts after 12 tokens: 12 -> 0, 14 -> (12 - 14) / 4 = -0.5, 16 -> -1, 17 -> -1
    scores = overlong_penalty(["p"] * 4, ["c"] * 4, completion_ids=[[7] * n for n in (12, 14, 16, 17)], max_length=16,
                              buffer=4)
    assert scores == [0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(["p"], ["c"], max_length=16, buffer=4) == [None]  # no token counts: does not apply


def test_penalized_token_loss_adds_kl_in_loss_and_subtracts_entropy():
    from rlx.algorithms.kl import PenaltyTerms, penalized_token_loss

    pg = torch.tensor([[0.1, 0.1]])
    logp, ref = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.2, -1.0]])  # k1 = [0.2, 0]
    entropy, mask = torch.tensor([[1.5, 1.5]]), torch.tensor([[1.0, 0.0]])
    loss, kl = penalized_token_loss(pg, logp, ref, entropy, mask, 0.5, PenaltyTerms("k1", "loss", 0.01))
    # token 0: 0.1 + 0.5 * 0.2 - 0.01 * 1.5 = 0.185; token 1 is masked: 0.1 unchanged
    assert torch.allclose(loss, torch.tensor([[0.185, 0.1]])) and torch.allclose(kl, torch.tensor([[0.2, 0.0]]))
    # KL in the reward: the loss carries no KL term, but the estimate is still returned (for metrics)
    loss, kl = penalized_token_loss(pg, logp, ref, entropy, mask, 0.5, PenaltyTerms("k1", "reward", 0.0))
    assert torch.allclose(loss, pg) and kl is not None
    loss, kl = penalized_token_loss(pg, logp, None, entropy, mask, 0.5, PenaltyTerms("k1", "loss", 0.0))
    assert kl is None and torch.equal(loss, pg)
