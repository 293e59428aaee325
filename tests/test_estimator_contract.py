"""The one outcome-estimator contract: fn(rewards (N,), group_ids (N,), **knobs), groups of any sizes in any order
(verl's `index`), and the needs an entry declares, read by generic code (rlx/config/needs.py, group_count).

The batch of the hand-derived tests, ids not contiguous and sizes 3, 4 and 1:
    index    0  1  2  3  4  5  6  7
    id       7  2  7  2  7  9  2  2
    reward   1  0  0  2  0  5  1  1
group 7 = [1, 0, 0] (rows 0, 2, 4): mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3) = 0.577350
group 2 = [0, 2, 1, 1] (rows 1, 3, 6, 7): mean 1, unbiased std sqrt(2 / 3) = 0.816497
group 9 = [5] (row 5): one sample, no baseline
"""

from __future__ import annotations

import re

import pytest
import torch

from rlx.algorithms.advantages import OUTCOME_ESTIMATORS, EstimatorNeeds, group_count, outcome_advantages
from rlx.algorithms.grouping import adjacent_group_size, fixed_groups
from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.errors import UserError

IDS = torch.tensor([7, 2, 7, 2, 7, 9, 2, 2])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 2.0, 0.0, 5.0, 1.0, 1.0])


def test_grpo_over_group_ids_by_hand():
    """A = (r - mean) / std: group 7: (2/3) / 0.577350 = 1.154701, (-1/3) / 0.577350 = -0.577350; group 2: -1 / 0.816497
    = -1.224745, +1.224745, 0, 0; the single sample of group 9 gets 0."""
    advantages, keep, metrics = outcome_advantages(REWARDS, IDS, "grpo", scale="group", eps=0.0)
    assert advantages.tolist() == pytest.approx([1.154701, -1.224745, -0.577350, 1.224745, -0.577350, 0, 0, 0],
                                                abs=1e-5)
    assert keep.all() and metrics == {}


def test_rloo_over_group_ids_by_hand():
    """A = n / (n - 1) (r - mean): group 7: 3/2 x 2/3 = 1, 3/2 x -1/3 = -0.5; group 2: 4/3 x -1, 4/3 x 1, 0, 0; group 9:
    0."""
    advantages, _, _ = outcome_advantages(REWARDS, IDS, "rloo")
    assert advantages.tolist() == pytest.approx([1, -4 / 3, -0.5, 4 / 3, -0.5, 0, 0, 0], abs=1e-6)


def test_median_over_group_ids_by_hand():
    """Lower-middle median: group 7 sorted [0, 0, 1] -> 0, pivot = the first row holding 0 = row 2; group 2 sorted
    [0, 1, 1, 2] -> 1 (rank (4 - 1) // 2 = 1), pivot row 6; group 9: 5, pivot row 5. Scale none: A = r - median."""
    advantages, keep, _ = outcome_advantages(REWARDS, IDS, "median", scale="none", eps=0.0)
    assert advantages.tolist() == [1, -1, 0, 1, 0, 0, 0, 0]
    assert keep.tolist() == [True, True, False, True, True, False, False, True]


def test_reinforce_pp_baseline_over_group_ids_by_hand():
    """x = r - mean(group) = [2/3, -1, -1/3, 1, -1/3, 0, 0, 0]: batch mean 0, unbiased std sqrt((8/3) / 7) = 0.617213,
    A = x / 0.617213."""
    advantages, _, _ = outcome_advantages(REWARDS, IDS, "reinforce_pp_baseline", eps=0.0)
    x = torch.tensor([2 / 3, -1, -1 / 3, 1, -1 / 3, 0, 0, 0])
    assert advantages.tolist() == pytest.approx((x / 0.617213).tolist(), abs=1e-5)


def test_ngrpo_over_group_ids_by_hand():
    """One virtual reward 1 per group: group [0, 0] + [1] has mean 1/3, unbiased std sqrt((1/9 + 1/9 + 4/9) / 2) =
    0.577350, A = -0.577350 each (GRPO: 0); group [1, 0] + [1]: mean 2/3, std 0.577350, A = 0.577350, -1.154701."""
    advantages, keep, metrics = outcome_advantages(torch.tensor([0.0, 1.0, 0.0, 0.0]), torch.tensor([5, 3, 5, 3]),
                                                   "ngrpo", scale="group", eps=0.0, virtual_reward=1.0,
                                                   virtual_samples=1)
    assert advantages.tolist() == pytest.approx([-0.577350, 0.577350, -0.577350, -1.154701], abs=1e-5)
    assert keep.all() and metrics == {"train/ngrpo_dead_groups_revived": 1.0}


@pytest.mark.parametrize("name,scale", [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("grpo", "mad"),
                                        ("rloo", "group"), ("reinforce_pp", "group"),
                                        ("reinforce_pp_baseline", "group"),
                                        ("median", "none"), ("median", "mad"), ("ngrpo", "group")])
def test_every_built_in_gives_the_same_numbers_for_shuffled_rows(name, scale):
    """Equal groups of 4 adjacent rows (the (B, G) form), then the same rows shuffled (the keyed form): the same
    advantage and keep for every row (distinct rewards in a group, so the median pivot is one row either way)."""
    rewards = torch.tensor([1.0, 0.0, 0.3, 0.9, 0.2, 0.1, 0.4, 0.6, 0.5, 0.25, 0.75, 0.05])
    groups = fixed_groups(12, 4)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert adjacent_group_size(groups) == 4 and adjacent_group_size(groups[order]) is None
    fixed, fixed_keep, _ = outcome_advantages(rewards, groups, name, scale=scale, eps=1e-6)
    keyed, keyed_keep, _ = outcome_advantages(rewards[order], groups[order] * 10 + 3, name, scale=scale, eps=1e-6)
    assert torch.allclose(keyed, fixed[order], atol=1e-5)
    assert torch.equal(keyed_keep, fixed_keep[order])


def test_adjacent_group_size():
    assert adjacent_group_size(torch.tensor([4, 4, 0, 0, 9, 9])) == 2  # gaps in the ids (dynamic sampling) are fine
    assert adjacent_group_size(torch.tensor([0, 0, 1, 1, 1])) is None  # sizes differ
    assert adjacent_group_size(torch.tensor([0, 0, 1, 1, 0, 0])) is None  # group 0 is not adjacent
    assert adjacent_group_size(torch.tensor([], dtype=torch.long)) == 1


@pytest.fixture
def plugin():
    added = []

    def add(name, fn, needs=None):
        OUTCOME_ESTIMATORS.register(name, needs=needs)(fn)
        added.append(name)

    yield add
    for name in added:
        OUTCOME_ESTIMATORS.unregister(name)


def test_declared_needs_are_read_by_generic_code(plugin):
    """A plugin's needs, as a dict: extra samples grow the group the producer samples and the rollout batch; an odd
    group, a scale and equal groups are checked against the settings like a built-in's."""
    plugin("tmp_pivot", lambda rewards, group_ids, **_: rewards * 0,
           needs={"extra_samples": 1, "group_baseline": True, "odd_group": True, "scales": ("none",)})
    assert OUTCOME_ESTIMATORS.needs("tmp_pivot") == EstimatorNeeds(1, True, True, ("none",))
    assert group_count(4, "tmp_pivot") == 5 and group_count(4, "grpo") == 4 and group_count(4, None) == 4
    # 4 + 1: odd
    check_settings(checked_settings(check_overrides(["algorithm.advantage=tmp_pivot", "algorithm.scale=none"])))
    for overrides, needle in [
        (["rollout.samples_per_prompt=3", "algorithm.scale=none"],
         "needs an odd group so that its middle is one sample: "
                                                                   "rollout.samples_per_prompt=3 + 1 extra = 4"),
        (["algorithm.scale=group"], "is defined for algorithm.scale=none: set algorithm.scale=none (got group)"),
        (["algorithm.scale=none", "rollout.samples_per_prompt=1"],
         "compares samples of a prompt: rollout.samples_per_prompt=1 must be at least 2"),
    ]:
        with pytest.raises(UserError, match="^" + re.escape("algorithm.advantage=tmp_pivot " + needle)):
            check_settings(checked_settings(check_overrides(["algorithm.advantage=tmp_pivot", *overrides])))


def test_a_plugin_estimator_combines_with_hints_unless_it_needs_equal_groups(plugin):
    plugin("tmp_keyed", lambda rewards, group_ids, **_: rewards * 0)
    plugin("tmp_reshaping", lambda rewards, group_ids, **_: rewards * 0, needs=EstimatorNeeds(equal_groups=True))
    check_settings(checked_settings(check_overrides(["algorithm.advantage=tmp_keyed", "algorithm.hints.enabled=true"])))
    # median is keyed now
    check_settings(checked_settings(check_overrides(["algorithm.advantage=median", "algorithm.hints.enabled=true"])))
    with pytest.raises(UserError, match="^algorithm.advantage=tmp_reshaping takes equal groups of adjacent samples"):
        check_settings(checked_settings(check_overrides(["algorithm.advantage=tmp_reshaping",
                                                         "algorithm.hints.enabled=true"])))
    with pytest.raises(UserError, match="^algorithm.advantage=tmp_keyed has no group baseline"):
        check_settings(checked_settings(check_overrides(["algorithm=dapo", "algorithm.advantage=tmp_keyed"])))
