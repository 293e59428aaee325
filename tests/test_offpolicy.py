"""Sampler vs trainer log-probs: the gap statistics and truncated importance sampling, by hand."""

import math

import torch

from rlx.algorithms.offpolicy import logprob_gap, truncated_importance_weights


def test_logprob_gap_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -9.0]])
    sampler = torch.tensor([[-1.2, -2.0, -0.4], [-0.4, -3.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the last token is padding: its gap of 9 is not counted
    total, largest, count = logprob_gap(trainer, sampler, mask)
    # |gaps| = 0.2, 0, 0.1, 0.3, 0.5
    assert count == 5
    assert math.isclose(total, 1.1, rel_tol=1e-6) and math.isclose(largest, 0.5, rel_tol=1e-6)
    assert logprob_gap(trainer, sampler, torch.zeros_like(mask)) == (0.0, 0.0, 0)


def test_truncated_importance_weights_by_hand():
    trainer = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]], requires_grad=True)
    sampler = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.4)]])
    weights, capped = truncated_importance_weights(trainer, sampler, cap=1.5)
    # pi_train / pi_sampler = 2 (capped at 1.5), 1, 0.5
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.0, 0.5]]))
    assert capped.tolist() == [[True, False, False]]
    assert not weights.requires_grad  # a weight on the gradient, not a path for it
