"""The policy loss object (rlx/algorithms/policy_loss.py): its knobs bound once from the settings, its terms those of
the pure functions, hand-derived on one token, and the per-step parts (KL coefficient, entropy band) arguments."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from rlx.algorithms.entropy_band import BandTerm, entropy_band_penalty
from rlx.algorithms.kl import PenaltyTerms, penalized_token_loss
from rlx.algorithms.losses import aggregate, clipped_surrogate
from rlx.algorithms.policy_loss import OffPolicyCorrection, PolicyInputs, PolicyLoss


def algo(**changes):
    knobs = dict(clip_low=0.2, clip_high=0.28, dual_clip=None, ratio_level="token", loss_agg="token-mean",
                 kl_estimator="k1", kl_in="loss", entropy_coef=0.0)
    return SimpleNamespace(**{**knobs, **changes})


def rollout(**changes):
    knobs = dict(correction="none", correction_level="token", correction_cap=2.0, correction_low=0.0)
    return SimpleNamespace(**{**knobs, **changes})


def one_token(entropy: float = 1.5, ref_gap: float | None = None, weight: float | None = None) -> PolicyInputs:
    """One sampled token whose ratio is 1 (logp = old), advantage 2, in the loss; ref_logp = logp - ref_gap."""
    logp = torch.tensor([[-1.0]])
    mask = torch.ones(1, 1)
    return PolicyInputs(logp, logp.clone(), torch.tensor([2.0]), mask, mask, torch.tensor([[entropy]]),
                        None if ref_gap is None else logp - ref_gap,
                        None if weight is None else torch.tensor([[weight]]), torch.zeros(1, 1, dtype=torch.long),
                        1.0, 1.0)


def test_from_settings_binds_every_knob_once():
    loss = PolicyLoss.from_settings(algo(dual_clip=3.0, entropy_coef=0.01), rollout(tis_cap=1.5), 16)
    assert (loss.clip_low, loss.clip_high, loss.dual_clip, loss.ratio_level, loss.loss_agg, loss.loss_width) == (
        0.2, 0.28, 3.0, "token", "token-mean", 16)
    assert loss.penalty == PenaltyTerms("k1", "loss", 0.01)
    assert loss.correction == OffPolicyCorrection("tis", "token", 1.5, 0.0)  # the older rollout.tis_cap, read as tis
    assert loss.correction.active and not loss.correction.rejecting
    with pytest.raises(dataclasses.FrozenInstanceError):  # built once: nothing patches it per step
        loss.clip_low = 0.3


def test_one_token_by_hand():
    """Ratio 1, A = 2, token-mean over 1 token: the surrogate is -2.
    + KL in the loss: k1 = 0.2, kl_coef 0.5 -> +0.1;  - entropy bonus: 0.1 x H = 1.5 -> -0.15;
    + the band: history H_bar = 1, band (0.8, 1.2): H = 1.5 is 0.3 above 1.2, weight 0.5 -> +0.15;
    x the correction's weight 0.5 applies to the surrogate only: -2 -> -1."""
    plain = PolicyLoss.from_settings(algo(), rollout(), 1)
    loss, metrics = plain(one_token(), kl_coef=0.0)
    assert loss.item() == pytest.approx(-2.0) and "kl" not in metrics and "band_penalty" not in metrics
    assert plain(one_token(ref_gap=0.2), kl_coef=0.5)[0].item() == pytest.approx(-1.9)
    bonus = PolicyLoss.from_settings(algo(entropy_coef=0.1), rollout(), 1)
    assert bonus(one_token(), kl_coef=0.0)[0].item() == pytest.approx(-2.15)
    band = BandTerm(0.5, torch.tensor([1.0], dtype=torch.float64), 0.8, 1.2)
    loss, metrics = plain(one_token(), 0.0, band)
    assert loss.item() == pytest.approx(-1.85) and metrics["band_penalty"].item() == pytest.approx(0.3)
    assert plain(one_token(weight=0.5), 0.0)[0].item() == pytest.approx(-1.0)


def test_the_object_is_the_pure_functions_composed_bit_for_bit():
    """Random micro-batch, every term on: the object's loss is exactly the composition the loops wrote inline."""
    g = torch.Generator().manual_seed(0)
    n, c = 3, 5
    logp = -torch.rand(n, c, generator=g)
    old, ref = logp - 0.1 * torch.randn(n, c, generator=g), logp + 0.1 * torch.randn(n, c, generator=g)
    adv, entropy = torch.randn(n, generator=g), torch.rand(n, c, generator=g) * 2
    pg_mask = (torch.rand(n, c, generator=g) > 0.3).float()
    loss_mask, weights = torch.ones(n, c), torch.rand(n, c, generator=g) + 0.5
    turns = torch.tensor([[0, 0, 1, 1, 2]] * n)
    band = BandTerm(0.3, torch.tensor([1.0, 0.5, 0.8], dtype=torch.float64), 0.8, 1.2)
    settings = algo(dual_clip=2.5, loss_agg="seq-mean-token-sum-norm", kl_estimator="k3", entropy_coef=0.01)
    loss, _ = PolicyLoss.from_settings(settings, rollout(), 7)(
        PolicyInputs(logp, old, adv, pg_mask, loss_mask, entropy, ref, weights, turns, 12.0, 3.0), 0.05, band)
    expected, _ = clipped_surrogate(logp, old, adv, pg_mask, 0.2, 0.28, 2.5, "token")
    expected = expected * weights + 0.3 * entropy_band_penalty(entropy, turns, band.history, 0.8, 1.2)
    expected, _ = penalized_token_loss(expected, logp, ref, entropy, loss_mask, 0.05, PenaltyTerms("k3", "loss", 0.01))
    assert torch.equal(loss, aggregate(expected, loss_mask, "seq-mean-token-sum-norm", 12.0, 3.0, 7))


def test_the_update_settings_are_built_once_and_frozen():
    """The policy-gradient loop's update knobs are a frozen dataclass: the entropy band is an argument of optimise."""
    from rlx.loops.policy_gradient import UpdateSettings, optimise

    assert dataclasses.is_dataclass(UpdateSettings) and UpdateSettings.__dataclass_params__.frozen
    assert "entropy_band" not in {f.name for f in dataclasses.fields(UpdateSettings)}
    assert "band" in optimise.__code__.co_varnames[: optimise.__code__.co_argcount]
