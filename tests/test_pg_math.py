"""GRPO math against hand-derived numbers."""

import math

import pytest
import torch

from rlx.algorithms.advantages import group_advantages, zero_std_group_fraction
from rlx.algorithms.kl import kl_penalty
from rlx.algorithms.logprobs import token_entropy, token_logprobs
from rlx.algorithms.losses import aggregate, clipped_surrogate


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
