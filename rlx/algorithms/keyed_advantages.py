"""Outcome estimators over groups keyed by id, for any group sizes and any order (verl's `index`): the keyed forms of
the estimators of advantages.py, used by its registry entries when groups are not G adjacent samples each (hinted
re-samples join their group, replay, variable budgets). On equal adjacent groups each matches its (B, G) twin in
advantages.py to float rounding (tests/test_estimator_contract.py checks it). Torch only; rewards, groups: (N,).
"""

from __future__ import annotations

import torch

from rlx.algorithms.grouping import group_max, group_mean, group_median, group_min, group_size, group_std
from rlx.algorithms.ngrpo import TIE_TOLERANCE


def tied(rewards: torch.Tensor, groups: torch.Tensor, tolerance: float = TIE_TOLERANCE) -> torch.Tensor:
    """(N,) bool: the sample's group ties (max - min <= tolerance): no signal under a group baseline."""
    return group_max(rewards, groups) - group_min(rewards, groups) <= tolerance


def keyed_scale(rewards: torch.Tensor, groups: torch.Tensor, scale: str, eps: float):
    """The denominator of algorithm.scale per sample: "group" the group's unbiased std, "batch" the batch's, "none" 1,
    "mad" the group's median absolute deviation from its median (lower middle values), each + eps but "none"."""
    if scale == "group":
        return group_std(rewards, groups) + eps
    if scale == "batch":
        return (rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)) + eps
    if scale == "none":
        return 1.0
    if scale == "mad":
        return group_median((rewards - group_median(rewards, groups)).abs(), groups) + eps
    raise ValueError(f"groups keyed by id support algorithm.scale=group|batch|none|mad, got '{scale}' (a scale of "
                     f"the SCALES registry takes equal groups (B, G))")


def keyed_group_advantages(rewards, groups, scale="group", eps=1e-6):
    """A_i = (r_i - mean(g)) / s (GRPO), s by `keyed_scale`; a group of one or of tied rewards gets 0.
    Example: rewards [1, 0, 0, 1, 1], groups [7, 7, 7, 3, 3], scale "none": group 7 has mean 1/3 -> [2/3, -1/3, -1/3];
    group 3 ties -> [0, 0]."""
    advantages = (rewards - group_mean(rewards, groups)) / keyed_scale(rewards, groups, scale, eps)
    no_signal = tied(rewards, groups) | (group_size(groups) < 2)
    return torch.where(no_signal, torch.zeros_like(advantages), advantages)


def keyed_rloo_advantages(rewards, groups):
    """A_i = r_i - mean_{j != i in g} r_j = n_g / (n_g - 1) (r_i - mean(g)) (RLOO); a group of one or of tied rewards
    gets 0."""
    count = group_size(groups).to(rewards.dtype)
    advantages = (rewards - group_mean(rewards, groups)) * count / (count - 1).clamp(min=1)
    return torch.where(tied(rewards, groups) | (count < 2), torch.zeros_like(advantages), advantages)


def keyed_reinforce_pp_advantages(rewards, groups, baseline: bool, eps=1e-6):
    """REINFORCE++: x whitened over the batch, x = r (baseline=False) or r - mean(g) (baseline=True, whose tied groups
    get 0), as advantages.reinforce_pp_advantages."""
    x = rewards - group_mean(rewards, groups) if baseline else rewards
    advantages = (x - x.mean()) / ((x.std() if x.numel() > 1 else torch.zeros((), dtype=x.dtype)) + eps)
    return torch.where(tied(rewards, groups, eps), torch.zeros_like(advantages), advantages) if baseline else advantages


def keyed_median_advantages(rewards, groups, scale="none", eps=1e-6):
    """MC-GRPO: A_i = (r_i - median(g)) / s with the lower-middle median; the pivot (the first sample of the group, in
    batch order, holding the median) is left out of the gradient. Returns advantages (N,), keep (N,) bool."""
    median = group_median(rewards, groups)  # (N,)
    position = torch.arange(rewards.numel(), dtype=torch.float64)
    holds = rewards == median
    first = -group_max(torch.where(holds, -position, torch.full_like(position, -torch.inf)), groups)  # (N,)
    keep = position != first
    advantages = (rewards - median) / keyed_scale(rewards, groups, scale, eps)
    return torch.where(tied(rewards, groups, eps), torch.zeros_like(advantages), advantages), keep
