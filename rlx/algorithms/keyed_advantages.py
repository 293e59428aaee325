"""Outcome estimators over groups keyed by id (sizes may differ): the batches of the seed ideas' stages, where
hinted re-samples join their group (rlx/rollout/group_stages.py). On equal groups of G adjacent samples each
matches its fixed-size twin in advantages.py (tests/test_seed_wiring.py checks it). Torch only.

    KEYED_ESTIMATORS[name](rewards (N,), groups (N,), scale, eps, **knobs) -> (advantages (N,), keep (N,) bool, metrics)
"""

from __future__ import annotations

import torch

from rlx.algorithms.grouping import group_max, group_mean, group_min, group_size, group_std
from rlx.algorithms.ngrpo import TIE_TOLERANCE, ngrpo_advantages
from rlx.registry import Registry

KEYED_ESTIMATORS = Registry("keyed outcome estimator")


def _tied(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    return group_max(rewards, groups) - group_min(rewards, groups) <= TIE_TOLERANCE


def _kept(advantages: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(advantages, dtype=torch.bool)


@KEYED_ESTIMATORS.register("grpo")
def keyed_grpo(rewards, groups, scale="group", eps=1e-6, **_):
    """A_i = (r_i - mean(g)) / (s + eps), s = the group's unbiased std ("group"), the batch's ("batch") or 1
    ("none"), as advantages.group_advantages, for any group sizes; a group of one or of tied rewards gets 0."""
    centred = rewards - group_mean(rewards, groups)
    if scale == "group":
        denominator = group_std(rewards, groups) + eps
    elif scale == "batch":
        denominator = (rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)) + eps
    elif scale == "none":
        denominator = 1.0
    else:
        raise ValueError(f"groups of different sizes support algorithm.scale=group|batch|none, got '{scale}'")
    advantages = centred / denominator
    advantages = torch.where(_tied(rewards, groups) | (group_size(groups) < 2), torch.zeros_like(advantages), advantages)
    return advantages, _kept(advantages), {}


@KEYED_ESTIMATORS.register("rloo")
def keyed_rloo(rewards, groups, scale="group", eps=1e-6, **_):
    """A_i = r_i - mean_{j != i in g} r_j = n_g / (n_g - 1) (r_i - mean(g)) (RLOO) for any group sizes."""
    count = group_size(groups).to(rewards.dtype)
    advantages = (rewards - group_mean(rewards, groups)) * count / (count - 1).clamp(min=1)
    advantages = torch.where(_tied(rewards, groups) | (count < 2), torch.zeros_like(advantages), advantages)
    return advantages, _kept(advantages), {}


@KEYED_ESTIMATORS.register("ngrpo")
def keyed_ngrpo(rewards, groups, scale="group", eps=1e-6, virtual_reward=1.0, virtual_samples=1, **_):
    """NGRPO's virtual max-reward samples (rlx/algorithms/ngrpo.py), with its mechanism metric."""
    advantages, metrics = ngrpo_advantages(rewards, groups, virtual_reward, virtual_samples, eps)
    return advantages, _kept(advantages), metrics
