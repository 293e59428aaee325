"""A group whose rewards tie carries no signal: its advantage is exactly zero, also when a KL penalty in the
reward adds float noise (issue 17: -0.0075 with a LoRA KL penalty)."""

import pytest
import torch

from rlx.algorithms.advantages import outcome_advantages
from rlx.algorithms.grouping import fixed_groups
from rlx.algorithms.kl import sequence_kl_in_reward


def _kl_shaped_rewards():
    """Group 0: task rewards tie at 0.35; group 1: 1 vs 0. The reference log-probs equal the policy's up to
    float32 rounding (~1e-7 per token, what a LoRA policy and its adapter-off reference give after
    different summation orders), so the k1 KL penalty is noise of ~1e-8 per sequence."""
    torch.manual_seed(0)
    logp = -torch.rand(8, 5) * 3  # (N, T)
    ref_logp = logp + torch.randn(8, 5) * 2e-7
    mask = torch.ones(8, 5)
    rewards = torch.tensor([0.35, 0.35, 0.35, 0.35, 1.0, 0.0, 0.0, 1.0])
    shaped, kl = sequence_kl_in_reward(rewards, logp, ref_logp, mask, coef=0.05)
    assert 0 < (shaped[:4] - 0.35).abs().max() < 1e-6  # the noise is there
    return shaped


@pytest.mark.parametrize("estimator,scale", [
    ("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("rloo", "group"), ("reinforce_pp_baseline", "group"),
    ("median", "group"), ("median", "none"),
])
def test_a_tied_group_gets_exactly_zero_advantage_under_a_kl_penalty(estimator, scale):
    advantages, keep, _ = outcome_advantages(_kl_shaped_rewards(), fixed_groups(8, 4), estimator, scale=scale, eps=1e-6)
    assert torch.equal(advantages[:4], torch.zeros(4))  # exactly, not 1e-2
    assert advantages[4:].abs().sum() > 0.5  # the informative group keeps its signal


def test_exact_ties_and_real_small_differences():
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.2, 0.2, 0.3])  # 0.1 * 3 / 3 != 0.1 in float32
    advantages, _, _ = outcome_advantages(rewards, fixed_groups(6, 3), "grpo", scale="none", eps=1e-6)
    assert torch.equal(advantages[:3], torch.zeros(3))
    assert advantages[3] == pytest.approx(-1 / 30, abs=1e-6) and advantages[5] == pytest.approx(2 / 30, abs=1e-6)
