"""Advantage estimators.

One contract for the outcome estimators (the OUTCOME_ESTIMATORS registry, below): one scalar reward per completion
and a group id per completion, `fn(rewards (N,), group_ids (N,), **knobs)`, groups of any sizes in any order
(verl's `index`); each entry declares what it needs (EstimatorNeeds). The pure functions first take the (B*G,)
layout of a single-turn batch, G adjacent completions per prompt (`group_size`); their keyed forms for any
grouping are in keyed_advantages.py. `gae` works on per-token rewards and values (PPO with a critic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.algorithms.grouping import adjacent_group_size
from rlx.algorithms.keyed_advantages import (
    keyed_group_advantages,
    keyed_median_advantages,
    keyed_reinforce_pp_advantages,
    keyed_rloo_advantages,
)
from rlx.algorithms.ngrpo import ngrpo_advantages
from rlx.registry import Registry, RegistryView


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.view(-1, group_size)  # (B, G)


def _batch_std(values: torch.Tensor) -> torch.Tensor:
    return values.std() if values.numel() > 1 else torch.zeros((), dtype=values.dtype)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean(group(i))) / (s + eps).   GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 outcome form).

    scale picks s:
      "group"  s = std of the completion's own group (unbiased, as in the paper's reference code)
      "batch"  s = std of all rewards in the batch (Lite PPO, Liu et al. 2025 "Tricks or Traps")
      "none"   s = 1 (Dr. GRPO, Liu et al. 2025, which removes the std division to avoid its bias)
    A group of size 1 has advantage 0 (no baseline to compare with); a group whose rewards all tie (within
    eps: float noise such as a near-zero KL penalty is no signal) has advantage exactly 0 under every
    scale. rewards: (B*G,). Returns (B*G,)."""
    grouped = _grouped(rewards, group_size)  # (B, G)
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # (B, G)
    return _zero_tied(_scaled(centered, grouped, rewards, scale, eps), grouped, eps).reshape(-1)


TIE_TOLERANCE = 1e-6


def _zero_tied(advantages: torch.Tensor, grouped: torch.Tensor, tolerance: float = TIE_TOLERANCE) -> torch.Tensor:
    """Exactly 0 for every group whose rewards tie within `tolerance` (max - min <= tolerance).

    Without this, float noise in a tied group (a KL penalty in the reward of ~1e-8 under LoRA, where the
    policy and its adapter-off reference agree up to rounding, or a mean that is one ulp off) is divided
    by a std of the same size and becomes an advantage of order 0.01. advantages, grouped: (B, G)."""
    spread = grouped.max(dim=1, keepdim=True).values - grouped.min(dim=1, keepdim=True).values  # (B, 1)
    return advantages.masked_fill(spread <= tolerance, 0.0)


def _median_absolute_deviation(grouped: torch.Tensor) -> torch.Tensor:
    """(B, 1): the lower-middle absolute deviation from the lower-middle value of each group."""
    middle = (grouped.shape[1] - 1) // 2
    median = grouped.sort(dim=1, stable=True)[0][:, middle : middle + 1]
    deviation = (grouped - median).abs().sort(dim=1, stable=True)[0]  # (B, G)
    return deviation[:, middle : middle + 1]


def _group_std(grouped: torch.Tensor) -> torch.Tensor:
    return grouped.std(dim=1, keepdim=True) if grouped.shape[1] > 1 else torch.zeros_like(grouped[:, :1])


# algorithm.scale, the advantage's denominator: fn(grouped (B, G), rewards (B*G,), eps) -> broadcastable to (B, G)
SCALES = Registry("advantage scale")
SCALE_REGISTRY = SCALES  # the name older code and the README use


@SCALES.register("group")
def _group_scale(grouped, rewards, eps):
    return _group_std(grouped) + eps


@SCALES.register("batch")
def _batch_scale(grouped, rewards, eps):
    return _batch_std(rewards) + eps


@SCALES.register("none")
def _no_scale(grouped, rewards, eps):
    return 1.0


@SCALES.register("mad")
def _mad_scale(grouped, rewards, eps):  # MC-GRPO authors' code
    return _median_absolute_deviation(grouped) + eps


def _scaled(centered, grouped, rewards, scale: str, eps: float) -> torch.Tensor:
    denominator = SCALES[scale](grouped, rewards, eps)  # an unknown scale: one line listing the valid ones
    return centered / denominator  # "none": / 1.0, exact


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean(group)).   RLOO (Ahmadian et al. 2024,
    after Kool et al. 2019): the leave-one-out mean is a baseline independent of the sample itself.

    Example: group [1, 0, 0]: A_0 = 1 - 0 = 1, A_1 = 0 - 0.5 = -0.5, A_2 = -0.5.
    A group of size 1 has no other sample: advantage 0. rewards: (B*G,). Returns (B*G,)."""
    grouped = _grouped(rewards, group_size)  # (B, G)
    if group_size == 1:
        return torch.zeros_like(rewards)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (B, G)
    return _zero_tied(grouped - others_mean, grouped).reshape(-1)


def reinforce_pp_advantages(rewards: torch.Tensor, group_size: int, baseline: bool, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ (Hu et al. 2025): returns whitened over the whole batch, A = (x - mean(x)) / (std(x) + eps).

    baseline=False: x = r (plain REINFORCE++ outcome form).
    baseline=True:  x = r - mean(group(r))  (REINFORCE++-baseline: the group mean is subtracted first,
                    then the batch whitening rescales; its mean is then 0 already).
    Example (baseline=False): [1, 0, 0, 1] -> mean 0.5, unbiased std 0.57735 -> [0.866, -0.866, -0.866, 0.866].
    A batch of one sample, or one whose values all tie, gives 0. rewards: (B*G,). Returns (B*G,)."""
    grouped = _grouped(rewards, group_size)  # (B, G)
    x = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1) if baseline else rewards  # (B*G,)
    advantages = (x - x.mean()) / (_batch_std(x) + eps)
    if not baseline:  # no group baseline: a tied group still differs from the rest of the batch
        return advantages
    return _zero_tied(advantages.view(-1, group_size), grouped, eps).reshape(-1)


def median_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "none", eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """MC-GRPO median baseline (Kim 2026, arXiv 2601.22582): A_i = (r_i - median(group(i))) / (s + eps), with s as in
    `group_advantages`, or scale "mad": s = MAD = median_j |r_j - median(group)| (lower middle), the
    authors' code with eps = 1e-3 (mc_grpo.yaml's default). Example: [0.2, 0.9, 0.5] -> median 0.5,
    deviations [0.3, 0.4, 0] -> MAD 0.3 -> A = [-0.3, 0.4, 0] / 0.301. A binary group [1, 0, 0] has MAD 0,
    so A = [1, 0, 0] / 1e-3: the eps sets the step size of such groups (gradient clipping bounds it).

    Sampling G+1 completions per prompt (odd group size) makes the median one actual sample, the
    "pivot"; its advantage is exactly 0 and it is excluded from the gradient, so G samples train.
    The median resists outliers better than the mean for small groups. With an even group size the
    lower middle value is the pivot. Ties: the pivot is the first sample (in group order) holding the
    median value. Example: group [1, 0, 0] -> median 0, pivot = index 1, A = [1, 0, 0], keep [T, F, T].
    rewards: (B*G,). Returns advantages (B*G,) and keep (B*G,) bool (False on each group's pivot)."""
    grouped = _grouped(rewards, group_size)  # (B, G)
    sorted_values, _ = grouped.sort(dim=1, stable=True)  # (B, G)
    median = sorted_values[:, (group_size - 1) // 2 : (group_size - 1) // 2 + 1]  # (B, 1) lower middle
    pivot = (grouped == median).int().argmax(dim=1)  # (B,) first sample equal to the median
    keep = torch.ones_like(grouped, dtype=torch.bool)
    keep[torch.arange(grouped.shape[0]), pivot] = False
    advantages = _zero_tied(_scaled(grouped - median, grouped, rewards, scale, eps), grouped, eps)
    return advantages.reshape(-1), keep.reshape(-1)


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an outcome estimator asks of the run, declared at registration and read by generic code: the config's
    check (rlx/config/needs.py check_entry_needs) and the producer's group size (rlx/build.py). The defaults
    ask for nothing: an estimator over group ids combines with hints, replay and variable group sizes."""

    # completions sampled per prompt beyond rollout.samples_per_prompt, left out of the loss
    extra_samples: int = 0
    group_baseline: bool = False    # compares the samples of a prompt: >= 2 per prompt; a tied group has no signal
    odd_group: bool = False         # the group (samples_per_prompt + extra_samples) must be odd (one middle sample)
    scales: tuple[str, ...] = ()    # the algorithm.scale values it defines; () any of SCALES
    equal_groups: bool = False      # only equal groups of adjacent samples (it reshapes to (B, G)): no hints
    standardises: bool | tuple[str, ...] = False  # divides by a std (True), or under these algorithm.scale values:
                                                  # an affine map of the reward (noise_backward) then cancels

    def standardised(self, scale: str | None) -> bool:
        """Whether the advantages are divided by a std at algorithm.scale=`scale`."""
        return self.standardises is True or (bool(self.standardises) and scale in self.standardises)


# algorithm.advantage of the policy-gradient family, one scalar reward per completion, groups keyed by id:
#   fn(rewards (N,), group_ids (N,), *, scale, eps, **knobs)
#       -> advantages (N,) | (advantages, keep (N,) bool) | (advantages, keep, metrics)
# group_ids: equal id = same prompt's group, any order and sizes (verl's `index`). knobs: scale, eps and every
# estimator's own setting (ngrpo: virtual_reward, virtual_samples); an entry takes what it uses and `**_` the rest.
OUTCOME_ESTIMATORS = Registry("outcome advantage estimator", default_needs=EstimatorNeeds())
# algorithm.advantage of the PPO family (per-token rewards and a critic's values): gae, registered below
CRITIC_ESTIMATORS = Registry("critic advantage estimator", default_needs=EstimatorNeeds())
# every valid algorithm.advantage
ESTIMATORS = RegistryView("advantage estimator", OUTCOME_ESTIMATORS, CRITIC_ESTIMATORS)


def outcome_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, estimator: str,
                       **knobs) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """`OUTCOME_ESTIMATORS[estimator](rewards, group_ids, **knobs)`, its result made whole: advantages (N,), keep (N,)
    bool (the samples in the policy-gradient loss: all but median pivots; all for an estimator that returns its
    advantages alone) and its metrics (a new dict). An unknown name: one line listing the valid ones."""
    result = OUTCOME_ESTIMATORS[estimator](rewards, group_ids, **knobs)
    if isinstance(result, torch.Tensor):
        result = (result,)
    advantages = result[0]
    keep = result[1] if len(result) > 1 else torch.ones_like(advantages, dtype=torch.bool)
    return advantages, keep, dict(result[2]) if len(result) > 2 else {}


def group_count(samples_per_prompt: int, estimator: str | None) -> int:
    """Completions sampled per prompt: rollout.samples_per_prompt plus the estimator's declared extra samples."""
    return samples_per_prompt + (ESTIMATORS.needs(estimator).extra_samples if estimator in ESTIMATORS else 0)


# Each built-in computes the (B, G) form when the groups are G adjacent samples each (the single-turn layout: the
# numbers rlx always gave, bit for bit) and its keyed form (keyed_advantages.py) for any other grouping.
@OUTCOME_ESTIMATORS.register("grpo", needs=EstimatorNeeds(group_baseline=True, standardises=("group", "batch")))
def grpo_estimator(rewards, group_ids, *, scale="group", eps=1e-6, **_):
    """GRPO: `group_advantages`, or `keyed_group_advantages` for other groupings."""
    size = adjacent_group_size(group_ids)
    return (group_advantages(rewards, size, scale, eps) if size
            else keyed_group_advantages(rewards, group_ids, scale, eps))


@OUTCOME_ESTIMATORS.register("rloo", needs=EstimatorNeeds(group_baseline=True))
def rloo_estimator(rewards, group_ids, **_):
    """RLOO: `rloo_advantages`, or `keyed_rloo_advantages`."""
    size = adjacent_group_size(group_ids)
    return rloo_advantages(rewards, size) if size else keyed_rloo_advantages(rewards, group_ids)


@OUTCOME_ESTIMATORS.register("reinforce_pp", needs=EstimatorNeeds(standardises=True))
def reinforce_pp_estimator(rewards, group_ids, *, eps=1e-6, **_):
    """REINFORCE++ without a group baseline: `reinforce_pp_advantages(..., baseline=False)`."""
    size = adjacent_group_size(group_ids)
    return (reinforce_pp_advantages(rewards, size, False, eps) if size
            else keyed_reinforce_pp_advantages(rewards, group_ids, False, eps))


@OUTCOME_ESTIMATORS.register("reinforce_pp_baseline", needs=EstimatorNeeds(group_baseline=True, standardises=True))
def reinforce_pp_baseline_estimator(rewards, group_ids, *, eps=1e-6, **_):
    """REINFORCE++-baseline: `reinforce_pp_advantages(..., baseline=True)`."""
    size = adjacent_group_size(group_ids)
    return (reinforce_pp_advantages(rewards, size, True, eps) if size
            else keyed_reinforce_pp_advantages(rewards, group_ids, True, eps))


# MC-GRPO samples G+1 completions (an odd group) so that the median is one of them, the pivot left out of the loss
@OUTCOME_ESTIMATORS.register("median", needs=EstimatorNeeds(extra_samples=1, group_baseline=True, odd_group=True))
def median_estimator(rewards, group_ids, *, scale="none", eps=1e-6, **_):
    """MC-GRPO: `median_advantages`, or `keyed_median_advantages`. Returns advantages, keep (False on pivots)."""
    size = adjacent_group_size(group_ids)
    return (median_advantages(rewards, size, scale, eps) if size
            else keyed_median_advantages(rewards, group_ids, scale, eps))


# NGRPO (2025): k virtual max-reward samples in the group statistics (ngrpo.py); the paper defines the group std only
@OUTCOME_ESTIMATORS.register("ngrpo", needs=EstimatorNeeds(group_baseline=True, scales=("group",)))
def ngrpo_estimator(rewards, group_ids, *, scale="group", eps=1e-6, virtual_reward=1.0, virtual_samples=1, **_):
    """NGRPO: `ngrpo_advantages` over the keyed groups, with its mechanism metric."""
    if scale != "group":
        raise ValueError("algorithm.advantage=ngrpo normalises by the std of the augmented group: set "
                         f"algorithm.scale=group (got {scale})")
    advantages, metrics = ngrpo_advantages(rewards, group_ids, virtual_reward, virtual_samples, eps)
    return advantages, torch.ones_like(advantages, dtype=torch.bool), metrics


def sign_weighted(advantages: torch.Tensor, positive_weight: float, negative_weight: float) -> torch.Tensor:
    """A' = w+ * A where A > 0, w- * A where A < 0, 0 where A = 0.

    W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning") down-weights positive samples (w+ = 0.1, w- = 1); w+ = 0 is pure negative sample
    reinforcement (NSR), w- = 0 positive-only (PSR). Any shape; returns the same shape."""
    return torch.where(advantages > 0, positive_weight * advantages, negative_weight * advantages)


@CRITIC_ESTIMATORS.register("gae")  # the PPO loop's own (needs a critic)
def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over completion tokens.

        delta_t = r_t + gamma * V_{t+1} - V_t        (V after the last valid token is 0: episode ends)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                          (the value target)
    Example, one sequence of 2 tokens, r = [0, 1], V = [0.5, 0.2], gamma = 1, lam = 0.5:
        delta = [0 + 0.2 - 0.5, 1 + 0 - 0.2] = [-0.3, 0.8];  A_1 = 0.8;  A_0 = -0.3 + 0.5 * 0.8 = 0.1.
    token_rewards, values, mask: (N, T); right-padded (mask 1 on a prefix). Padded positions get 0.
    A fully masked row (empty completion) gets all zeros. Returns advantages (N, T), returns (N, T)."""
    mask = mask.to(values.dtype)
    values = values * mask
    token_rewards = token_rewards * mask
    advantages = torch.zeros_like(values)  # (N, T)
    next_value = torch.zeros_like(values[:, 0])  # (N,)
    next_advantage = torch.zeros_like(values[:, 0])  # (N,)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        current = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = current
        next_value, next_advantage = values[:, t], current
    return advantages, (advantages + values) * mask


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the valid (mask = 1) entries (unbiased std). shift_mean=False adds the mean
    back afterwards, so only the scale is normalised. Example: valid [1, 2, 3] -> mean 2, std 1 ->
    [-1, 0, 1] (or [1, 2, 3] with shift_mean=False). Padded entries return 0. values, mask: same shape."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1)
    var = (((values - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1)
    out = (values - mean) / (var.sqrt() + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def tied_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) bool: groups whose rewards all tie (zero advantage under any group baseline; DAPO's dynamic
    sampling drops them)."""
    grouped = _grouped(rewards, group_size)  # (B, G)
    return grouped.max(dim=1).values == grouped.min(dim=1).values


def zero_std_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of groups whose rewards all tie (they carry no learning signal under group baselines)."""
    return tied_groups(rewards, group_size).float().mean().item()
