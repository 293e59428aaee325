"""MC-GRPO's scale as the authors' code has it: (r - median) / (MAD + 1e-3), hand-derived numbers."""

import torch

from rlx.algorithms.advantages import median_advantages
from rlx.config.overrides import check_overrides


def test_mad_scale_hand_derived():
    # group [0.2, 0.9, 0.5]: median 0.5, |deviations| [0.3, 0.4, 0.0] -> sorted [0, 0.3, 0.4], MAD 0.3
    # A = [-0.3, 0.4, 0] / (0.3 + 1e-3)
    # group [1, 0, 0]: median 0, |deviations| [1, 0, 0] -> MAD 0 -> A = [1, 0, 0] / 1e-3
    rewards = torch.tensor([0.2, 0.9, 0.5, 1.0, 0.0, 0.0])
    adv, keep = median_advantages(rewards, 3, scale="mad", eps=1e-3)
    expected = torch.tensor([-0.3 / 0.301, 0.4 / 0.301, 0.0, 1000.0, 0.0, 0.0])
    assert torch.allclose(adv, expected, rtol=1e-5)
    assert keep.tolist() == [True, True, False, True, False, True]
    # five samples [0, 1, 1, 3, 10]: median 1, |dev| [1, 0, 0, 2, 9] -> sorted [0, 0, 1, 2, 9], MAD 1
    adv, _ = median_advantages(torch.tensor([0.0, 1.0, 1.0, 3.0, 10.0]), 5, scale="mad", eps=0.0)
    assert adv.tolist() == [-1.0, 0.0, 0.0, 2.0, 9.0]


def test_mc_grpo_preset_follows_the_authors_code():
    algo = check_overrides(["algorithm=mc_grpo"]).algorithm
    assert algo.advantage == "median" and algo.scale == "mad" and algo.eps == 1e-3
