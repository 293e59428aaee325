"""Advantage estimators for outcome rewards (one scalar reward per completion).

Rewards arrive as a flat (B*G,) tensor ordered group by group: the G completions of prompt 0, then
the G completions of prompt 1, and so on.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(group(i))) / (s + eps).   GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 outcome form).

    scale picks s:
      "group"  s = std of the completion's own group (unbiased, as in the paper's reference code)
      "batch"  s = std of all rewards in the batch (Lite PPO, Liu et al. 2025 "Tricks or Traps")
      "none"   s = 1 (Dr. GRPO, Liu et al. 2025, which removes the std division to avoid its bias)
    A group of size 1 has advantage 0 (no baseline to compare with); a group whose rewards all tie has
    advantage 0 under every scale. rewards: (B*G,). Returns (B*G,)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)  # (B, G)
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # (B, G)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
        advantages = centered / (std + eps)
    elif scale == "batch":
        std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
        advantages = centered / (std + eps)
    elif scale == "none":
        advantages = centered
    else:
        raise ValueError(f"unknown advantage scale '{scale}'; valid choices: group, batch, none")
    return advantages.reshape(-1)


def zero_std_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of groups whose rewards all tie (they carry no learning signal under group baselines)."""
    grouped = rewards.view(-1, group_size)  # (B, G)
    return (grouped.max(dim=1).values == grouped.min(dim=1).values).float().mean().item()
