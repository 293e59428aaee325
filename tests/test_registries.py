"""Variants are chosen from registries (dicts of functions with one signature each, issue 15): the valid
names a config may use are exactly the registry's keys, and every shipped preset names a registered entry."""

import pytest

from rlx.algorithms import advantages, gigpo, kl, losses, preference
from rlx.config.overrides import check_overrides
from rlx.config.paths import group_options


def test_valid_names_are_the_registry_keys():
    assert tuple(advantages.OUTCOME_ESTIMATORS) == advantages.ESTIMATORS[:-1]  # gae is the PPO loop's own
    assert tuple(advantages.SCALE_REGISTRY) == advantages.SCALES
    assert tuple(kl.KL_ESTIMATOR_REGISTRY) == kl.KL_ESTIMATORS
    assert tuple(losses.AGGREGATIONS) == losses.LOSS_AGGREGATIONS
    assert preference.PREFERENCE_LOSSES == (*preference.REFERENCE_LOSSES, *preference.REFERENCE_FREE_LOSSES)
    assert tuple(losses.RATIO_LEVEL_REGISTRY) == losses.RATIO_LEVELS
    assert tuple(kl.KL_PLACEMENT_REGISTRY) == kl.KL_PLACEMENTS
    assert tuple(gigpo.SCALE_REGISTRY) == gigpo.SCALES


def test_more_variants_are_found_by_name(monkeypatch):
    """Schedules, ratio levels, KL placements, agent scales and preference-pair sources: a new entry
    is used by name, and an unknown name is refused with the registry's keys."""
    import torch

    from rlx.data import preferences
    from rlx.runtime import optim as common

    monkeypatch.setitem(common.SCHEDULES, "half", lambda progress: 0.5)
    assert common.lr_lambda("half", 0, 10)(3) == 0.5
    with pytest.raises(ValueError, match="valid choices: constant, cosine, linear, half"):
        common.lr_lambda("step", 0, 10)
    logp, old, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2)
    monkeypatch.setitem(losses.RATIO_LEVEL_REGISTRY, "one", lambda logp, old_logp, mask: torch.ones_like(logp))
    assert losses.importance_ratio(logp, old, mask, "one").tolist() == [[1.0, 1.0]]
    monkeypatch.setitem(kl.KL_PLACEMENT_REGISTRY, "twice", lambda loss, k, m, c: loss + 2 * c * k * m)
    out, k = kl.penalized_token_loss(torch.zeros(1, 2), logp, old, torch.zeros(1, 2), mask, 0.5, "k1", "twice", 0.0)
    assert torch.allclose(out, k)  # 2 x 0.5 x KL
    monkeypatch.setitem(gigpo.SCALE_REGISTRY, "double", lambda std, eps: 0.5)
    grouped = gigpo.grouped_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "double")
    assert grouped.tolist() == [1.0, -1.0]  # (r - 0.5) / 0.5
    monkeypatch.setitem(preferences.PAIR_SOURCES, "inline", lambda cfg, columns, stats: (["train"], ["held"]))
    from omegaconf import OmegaConf

    assert preferences.load_pairs(OmegaConf.create({"source": "inline", "columns": {}, "eval_size": 5}), 0)[:2] == (["train"], ["held"])


@pytest.mark.parametrize("option", group_options("algorithm"))
def test_every_preset_names_registered_variants(option):
    algo = check_overrides([f"algorithm={option}"]).algorithm
    if algo.family == "preference":
        assert algo.loss_type in preference.PREFERENCE_LOSSES
    if algo.family in ("policy_gradient", "ppo"):
        assert algo.advantage in advantages.ESTIMATORS and algo.scale in advantages.SCALES
        assert algo.loss_agg in losses.AGGREGATIONS and algo.kl_estimator in kl.KL_ESTIMATOR_REGISTRY


def test_a_registered_variant_is_used_by_name(monkeypatch):
    """A new entry is all it takes: the dispatcher finds it by name (no if/elif to extend)."""
    import torch

    monkeypatch.setitem(kl.KL_ESTIMATOR_REGISTRY, "abs", lambda x: x.abs())
    out = kl.kl_penalty(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.5, 0.0]]), "abs")
    assert out.tolist() == [[0.5, 1.0]]
    monkeypatch.setitem(preference.REFERENCE_LOSSES, "double_dpo",
                        lambda h, beta, label_smoothing: 2 * preference.dpo_loss(h, beta))
    args = [torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5])]
    double, _ = preference.preference_loss(*args, loss_type="double_dpo", beta=0.1)
    single, _ = preference.preference_loss(*args, loss_type="dpo", beta=0.1)
    assert torch.allclose(double, 2 * single)


def test_every_family_names_a_loop_that_exists():
    from rlx.build import FAMILIES, LOOPS

    assert FAMILIES == tuple(LOOPS)
    for family, loop in LOOPS.items():
        assert callable(loop) and loop.__module__.startswith("rlx.loops."), family
