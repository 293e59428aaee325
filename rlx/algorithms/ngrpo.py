"""NGRPO: all-wrong groups carry a learning signal, and dynamic sampling chooses which groups to drop.

"NGRPO: Negative-enhanced Group Relative Policy Optimization" (seed listing 001). The
formula follows the authors' code (nangongrui-ngr/NGRPO, verl/trainer/ppo/core_algos.py
compute_ngrpo_outcome_advantage; train_scripts/train_qwen2.5-math-7b_ngrpo.sh: max_reward 1.0,
add_max_reward_num 1, clip_ratio_low 0.16, clip_ratio_high 0.24, filter_groups.strategy all_correct).
The asymmetric clip needs no code: rlx's clipped_surrogate already bounds the ratio at 1 - clip_low
where A < 0 and at 1 + clip_high where A > 0 (conf/algorithm/ngrpo.yaml sets 0.16 / 0.24).
"""

from __future__ import annotations

import torch

from rlx.algorithms.grouping import group_all, group_max, group_min, group_size, group_sum
from rlx.registry import Registry

TIE_TOLERANCE = 1e-6  # as rlx.algorithms.advantages: a spread this small is float noise, not signal


def ngrpo_advantages(rewards: torch.Tensor, groups: torch.Tensor, virtual_reward: float = 1.0,
                     virtual_samples: int = 1, eps: float = 1e-6) -> tuple[torch.Tensor, dict]:
    """A_i = (r_i - mu') / (sigma' + eps), where mu' and sigma' (unbiased) are the mean and std of the
    group's G real rewards together with k virtual rewards r_max (k = virtual_samples, r_max =
    virtual_reward). The virtual samples only move the statistics; they are never trained.

    An all-wrong group [0, 0, 0] (k = 1, r_max = 1) has mu' = 1/4, sigma' = 1/2: every sample gets
    A = -0.5, a push away from what it sampled, where GRPO gives exactly 0. An all-correct group ties
    with the virtual sample (sigma' = 0) and gets 0; the tie test runs on the AUGMENTED group, so
    all-wrong groups are not erased by it. A group of one sample follows the authors' rule mu = 0,
    sigma = 1 (A = r). Only scale "group" exists in the paper, so no scale argument.
    Raises ValueError when a reward exceeds r_max (r_max must be the largest TOTAL reward, format
    components included). rewards, groups: (N,). Returns advantages (N,) and metrics:
      train/ngrpo_dead_groups_revived  fraction of groups whose real rewards all tie below r_max (no
                                       signal under GRPO) that now carry non-zero advantages."""
    if virtual_samples < 1:
        raise ValueError(f"algorithm.virtual_samples={virtual_samples} must be at least 1")
    top = rewards.max().item() if rewards.numel() else virtual_reward
    if top > virtual_reward + TIE_TOLERANCE:
        raise ValueError(f"algorithm.virtual_reward={virtual_reward} is below a sampled reward {top:.6g}: set it to "
                         "the largest total reward a completion can get (format components included)")
    values = rewards.double()
    count = group_size(groups)  # (N,) real samples per group
    k = float(virtual_samples)
    mean = (group_sum(values, groups) + k * virtual_reward) / (count + k)  # (N,) mu'
    squares = group_sum((values - mean) ** 2, groups) + k * (virtual_reward - mean) ** 2
    std = (squares / (count + k - 1)).sqrt()  # (N,) sigma', unbiased over G + k values
    advantages = (values - mean) / (std + eps)
    spread = torch.maximum(group_max(values, groups), torch.full_like(values, virtual_reward)) - torch.minimum(
        group_min(values, groups), torch.full_like(values, virtual_reward))
    advantages = advantages.masked_fill(spread <= TIE_TOLERANCE, 0.0)  # ties with the virtual sample: no signal
    advantages = torch.where(count > 1, advantages, values / (1.0 + eps))  # the authors' singleton rule
    dead = (group_max(values, groups) - group_min(values, groups)
            <= TIE_TOLERANCE) & (values < virtual_reward - TIE_TOLERANCE)
    revived = dead & (advantages.abs() > 0)
    dead_groups = (dead.double() / count).sum().item()  # each group counted once
    metrics = {"train/ngrpo_dead_groups_revived": (revived.double() / count).sum().item() / dead_groups if dead_groups
               else 0.0}
    return advantages.to(rewards.dtype), metrics


# which groups dynamic sampling drops (and replaces by new prompts):
# fn(rewards (N,), correct (N,) bool, groups (N,)) -> (N,) bool, True on every sample of a dropped group
DROP_STRATEGIES = Registry("dynamic-sampling drop strategy")


@DROP_STRATEGIES.register("tied")
def drop_tied(rewards: torch.Tensor, correct: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """DAPO (Yu et al. 2025): every group whose rewards tie (all correct and all wrong alike); rlx's default."""
    return group_max(rewards, groups) - group_min(rewards, groups) <= TIE_TOLERANCE


@DROP_STRATEGIES.register("all_correct")
def drop_all_correct(rewards: torch.Tensor, correct: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """NGRPO's choice (filter_groups.strategy=all_correct): only groups solved by every sample; all-wrong
    groups stay, since the virtual max-reward sample gives them a signal."""
    return group_all(correct, groups)


@DROP_STRATEGIES.register("all_incorrect")
def drop_all_incorrect(rewards: torch.Tensor, correct: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Only groups no sample solved (the authors' third strategy)."""
    return group_all(~correct.bool(), groups)
