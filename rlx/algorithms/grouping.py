"""Groups keyed by id: per-sample statistics of the group each sample belongs to (torch only).

Single-turn batches hold G adjacent samples per prompt (`fixed_groups`), but replayed samples, hinted
re-samples and variable budgets make group sizes differ; every function here takes `groups`, an (N,)
long tensor of ids (equal id = same group, any order, any sizes), so the seed-idea math (shaping.py,
transforms.py, ngrpo.py) does not assume `view(-1, G)`.
"""

from __future__ import annotations

import torch


def fixed_groups(num_samples: int, group_size: int) -> torch.Tensor:
    """(N,) ids 0,0,..,1,1,..: G adjacent samples per group, as rollout/single_turn.py lays a batch out."""
    if group_size < 1 or num_samples % group_size:
        raise ValueError(f"{num_samples} samples do not split into groups of {group_size}")
    return torch.arange(num_samples) // group_size


def adjacent_group_size(groups: torch.Tensor) -> int | None:
    """G when the ids form runs of G adjacent samples, one run per group (the layout `fixed_groups` makes, any id
    values: dynamic sampling leaves gaps); None otherwise (sizes differ, or a group's samples are not adjacent).
    An empty batch counts as groups of 1."""
    n = groups.numel()
    if n == 0:
        return 1
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = groups[1:] != groups[:-1]
    runs = int(starts.sum())
    if n % runs:
        return None
    size = n // runs
    equal_runs = bool(torch.equal(starts, torch.arange(n) % size == 0))
    return size if equal_runs and torch.unique(groups).numel() == runs else None


def dense_ids(groups: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(index (N,) in 0..K-1, K): the groups renumbered densely in order of their ids."""
    _, index = torch.unique(groups, return_inverse=True)
    return index, int(index.max()) + 1 if index.numel() else 0


def group_sum(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,): the sum of `values` over the group of each sample."""
    index, count = dense_ids(groups)
    totals = torch.zeros(count, dtype=values.dtype).index_add_(0, index, values)
    return totals[index]


def group_size(groups: torch.Tensor) -> torch.Tensor:
    """(N,) float: how many samples share each sample's group."""
    return group_sum(torch.ones(groups.shape, dtype=torch.float64), groups)


def group_mean(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,): the mean of `values` over each sample's group."""
    return group_sum(values, groups) / group_size(groups).to(values.dtype)


def group_std(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,): the unbiased std of each sample's group (0 for a group of one)."""
    centered = values - group_mean(values, groups)
    count = group_size(groups).to(values.dtype)
    return (group_sum(centered**2, groups) / (count - 1).clamp(min=1)).sqrt()


def group_max(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,): the largest value of each sample's group."""
    index, count = dense_ids(groups)
    out = torch.full((count,), -torch.inf, dtype=values.dtype)
    return out.scatter_reduce(0, index, values, reduce="amax")[index]


def group_min(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,): the smallest value of each sample's group."""
    return -group_max(-values, groups)


def group_median(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,): the lower-middle value of each sample's group (rank (n - 1) // 2 of its n values)."""
    middle = (group_size(groups).long() - 1) // 2
    at_middle = group_rank(values, groups) == middle
    return group_max(torch.where(at_middle, values, torch.full_like(values, -torch.inf)), groups)


def group_all(flags: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,) bool: every sample of the group has the flag."""
    return group_sum((~flags.bool()).double(), groups) == 0


def group_standardize(values: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(v - mean(group)) / (std(group) + eps), unbiased std; a group of one gets 0 (GRPO's normalisation)."""
    standardized = (values - group_mean(values, groups)) / (group_std(values, groups) + eps)
    return torch.where(group_size(groups) > 1, standardized, torch.zeros_like(standardized))


def group_rank(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(N,) long: the rank of each value within its group, 0 = smallest; ties by position (stable sort)."""
    index, _ = dense_ids(groups)
    # sort by (group, value) with a stable sort: group first via a lexicographic two-pass sort
    by_value = torch.sort(values, stable=True).indices
    by_group = by_value[torch.sort(index[by_value], stable=True).indices]  # (N,) sorted by group, then value
    first = torch.zeros(index.max().item() + 1 if index.numel() else 0, dtype=torch.long)
    sorted_groups = index[by_group]
    starts = torch.ones_like(sorted_groups, dtype=torch.bool)
    starts[1:] = sorted_groups[1:] != sorted_groups[:-1]
    first[sorted_groups[starts]] = torch.nonzero(starts).flatten()
    rank = torch.empty_like(index)
    rank[by_group] = torch.arange(index.numel()) - first[sorted_groups]
    return rank
