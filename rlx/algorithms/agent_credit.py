"""More credit rules for multi-turn episodes (registered in rlx.algorithms.gigpo.CREDIT after GiGPO's): leave-one-out
over episodes, gated reward accumulation (G-RA), and HGPO's history-consistent step groups.

Inputs as in rlx/algorithms/gigpo.py: episode_group (E,), step_episode (S,), step_rewards (S,),
step_anchor (S,) (-1: no anchor). Every rule returns a per-step advantage (S,) and metrics. Torch only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from rlx.algorithms.gigpo import CREDIT, SCALES, CreditNeeds, discounted_returns
from rlx.algorithms.grouping import group_mean, group_size, group_std


def _episode_returns(step_rewards: torch.Tensor, step_episode: torch.Tensor, num_episodes: int) -> torch.Tensor:
    return torch.zeros(num_episodes, dtype=step_rewards.dtype).index_add_(0, step_episode, step_rewards)  # (E,)


def _grouped(values: torch.Tensor, groups: torch.Tensor, scale: str, eps: float) -> torch.Tensor:
    """GRPO within id groups: (v - mean(group)) / s, s = SCALES[scale](std, eps) (the agent scales of gigpo.py:
    "group" std + eps, "none" 1, the same arithmetic as group_standardize); singletons 0."""
    denominator = SCALES[scale](group_std(values, groups), eps)  # an unknown scale: one line listing the valid ones
    centred = (values - group_mean(values, groups)) / denominator
    return torch.where(group_size(groups) > 1, centred, torch.zeros_like(centred))


@CREDIT.register("loo")
def loo_advantages(episode_group, step_episode, step_rewards, step_anchor=None, **_) -> tuple[torch.Tensor, dict]:
    """Leave-one-out baseline over the episodes of a task (RLOO, Ahmadian et al. 2024; the baseline of
    LOOP, Chen et al. 2025, "RL for Long-Horizon Interactive LLM Agents", and the unbiased estimator the
    "Practitioner's Guide to Multi-turn Agentic RL" recommends under sparse rewards):
        A_i = R_i - mean_{j != i, same task} R_j = n / (n - 1) * (R_i - mean_task R)
    R_i = the episode's undiscounted return; no std division (the baseline stays unbiased). Every step
    of episode i gets A_i; an episode alone in its task gets 0. Returns (S,) and metrics."""
    returns = _episode_returns(step_rewards, step_episode, episode_group.numel()).double()  # (E,)
    count = group_size(episode_group)
    centred = returns - group_mean(returns, episode_group)
    episode_adv = torch.where(count > 1, centred * count / (count - 1).clamp(min=1), torch.zeros_like(centred))
    return episode_adv.to(step_rewards.dtype)[step_episode], {}


def gated_returns(step_rewards: torch.Tensor, step_episode: torch.Tensor, episode_outcome: torch.Tensor,
                  threshold: float) -> torch.Tensor:
    """Gated reward accumulation (Sun et al. 2025, "Stabilizing Long-term Multi-turn RL with Gated
    Rewards", G-RA): immediate (step) rewards count only in episodes whose outcome meets the threshold,
        R_i = o_i + 1[o_i >= tau] * sum_t r_imm_{i,t}
    step_rewards: (S,) the immediate rewards ONLY (the outcome kept apart); episode_outcome: (E,).
    Returns R (E,). An agent that farms step rewards without reaching the goal gets only its outcome."""
    immediate = _episode_returns(step_rewards, step_episode, episode_outcome.numel())  # (E,)
    gate = (episode_outcome >= threshold).to(step_rewards.dtype)
    return episode_outcome.to(step_rewards.dtype) + gate * immediate


@CREDIT.register("gra", needs=CreditNeeds(inputs=("episode_outcome",), knobs=("gate_threshold",)))
def gra_advantages(episode_group, step_episode, step_rewards, step_anchor=None, *, episode_outcome=None,
                   gate_threshold: float | None = None, scale: str = "group", eps: float = 1e-6,
                   **_) -> tuple[torch.Tensor, dict]:
    """Trajectory-level GRPO on the gated returns of `gated_returns` (G-RA). Needs the environment's
    outcome reward apart from the step rewards (the hook: info["outcome"] at the episode's end, passed as
    episode_outcome (E,)); gate_threshold: tau. Metric env/gated_frac: episodes whose step rewards were cut."""
    if episode_outcome is None or gate_threshold is None:
        raise ValueError("credit gra needs each episode's outcome reward apart from its step rewards "
                         "(episode_outcome) and algorithm.gate_threshold")
    returns = gated_returns(step_rewards, step_episode, episode_outcome, gate_threshold)  # (E,)
    episode_adv = _grouped(returns.double(), episode_group, scale, eps)
    cut = (episode_outcome < gate_threshold).double().mean().item() if episode_outcome.numel() else 0.0
    return episode_adv.to(step_rewards.dtype)[step_episode], {"env/gated_frac": cut}


def history_keys(episode_group: torch.Tensor, step_episode: torch.Tensor, step_anchor: torch.Tensor, depth: int,
                 step_action: torch.Tensor | None = None) -> torch.Tensor:
    """(depth + 1, S) long ids of HGPO's nested groups: level k groups the anchored steps of one task that
    share the current anchor AND the previous k (anchor, action) pairs of their episode (before the
    episode's first step, a "start" marker: two steps at the same distance from the start with the same
    states agree). Level 0 is GiGPO's anchor-state group; each level refines the one above. Without
    step_action, the previous anchors alone stand for the history. Unanchored steps get -1 everywhere."""
    actions = step_action if step_action is not None else torch.zeros_like(step_anchor)
    keys = torch.full((depth + 1, step_anchor.numel()), -1, dtype=torch.long)
    ids: dict = {}
    start = 0
    for t in range(step_anchor.numel()):
        if t > 0 and step_episode[t] != step_episode[t - 1]:
            start = t
        if step_anchor[t] < 0:
            continue
        history: tuple = (int(episode_group[step_episode[t]]), int(step_anchor[t]))
        for k in range(depth + 1):
            if k > 0:
                back = t - k
                history = history + (("start",) if back < start else (int(step_anchor[back]), int(actions[back])))
            keys[k, t] = ids.setdefault((k, history), len(ids))
    return keys


@dataclass(frozen=True)
class HGPOSettings:
    """The knobs of credit=hgpo, named as the algorithm's keys (conf/algorithm/agent_grpo.yaml holds the run's
    values; these defaults are only for direct calls): hgpo_depth K, hgpo_alpha, gamma, step_weight w, scale, eps."""

    hgpo_depth: int = 2
    hgpo_alpha: float = 1.0
    gamma: float = 0.95
    step_weight: float = 1.0
    scale: str = "group"
    eps: float = 1e-6

    @classmethod
    def from_knobs(cls, knobs: dict) -> HGPOSettings:
        """The settings among the credit knobs the loop passes every rule (the others are other rules')."""
        return cls(**{f.name: knobs[f.name] for f in fields(cls) if f.name in knobs})


@CREDIT.register("hgpo", needs=CreditNeeds(inputs=("step_action",)))
def hgpo_credit(episode_group, step_episode, step_rewards, step_anchor, *, step_action=None,
                **knobs) -> tuple[torch.Tensor, dict]:
    """The registry entry of credit=hgpo: the loop's knobs by keyword -> HGPOSettings -> hgpo_advantages."""
    return hgpo_advantages(episode_group, step_episode, step_rewards, step_anchor, step_action,
                           HGPOSettings.from_knobs(knobs))


def hgpo_advantages(episode_group, step_episode, step_rewards, step_anchor, step_action=None,
                    settings: HGPOSettings = HGPOSettings()) -> tuple[torch.Tensor, dict]:
    """HGPO-style credit (He et al. 2026, "Hierarchy-of-Groups Policy Optimization for Long-Horizon
    Agentic Tasks", arXiv 2602.22817): GiGPO's step-level term computed over nested, history-consistent
    groups G_0 (same anchor, GiGPO) >= G_1 >= ... >= G_K (same anchor and last K steps of history):
        A^S_k(i,t) = the grouped advantage of the discounted step return within G_k(i,t)
        A(i,t)     = A^E(i) + w * sum_k omega_k(i,t) A^S_k(i,t)
        omega_k    = (k + 1)^alpha / sum_{k' usable} (k' + 1)^alpha   over the levels whose group has >= 2 steps
    A^E is the episode-level GRPO advantage, w = step_weight, alpha = hgpo_alpha, K = hgpo_depth (settings:
    HGPOSettings; alpha 0: equal weights).
    The nesting follows the paper; the weight rule is rlx's (the paper's adaptive weights favour the
    deeper, more consistent levels too, its exact rule was not checked). With hgpo_depth = 0 this is
    GiGPO. Metric env/hgpo_depth_used: mean over anchored steps of the deepest usable level."""
    hgpo_depth, hgpo_alpha, gamma = settings.hgpo_depth, settings.hgpo_alpha, settings.gamma
    step_weight, scale, eps = settings.step_weight, settings.scale, settings.eps
    returns = _episode_returns(step_rewards, step_episode, episode_group.numel()).double()
    episode_adv = _grouped(returns, episode_group, scale, eps)[step_episode]  # (S,)
    step_returns = discounted_returns(step_rewards.double(), step_episode, gamma)  # (S,)
    keys = history_keys(episode_group, step_episode, step_anchor, hgpo_depth, step_action)  # (K+1, S)
    anchored = step_anchor >= 0
    weighted = torch.zeros_like(step_returns)
    total = torch.zeros_like(step_returns)
    deepest = torch.full_like(step_returns, -1.0)
    if anchored.any():
        for k in range(hgpo_depth + 1):
            level = keys[k, anchored]
            usable = group_size(level) > 1
            weight = float(k + 1) ** hgpo_alpha
            advantage = _grouped(step_returns[anchored], level, scale, eps)
            weighted[anchored] += torch.where(usable, weight * advantage, torch.zeros_like(advantage))
            total[anchored] += usable.double() * weight
            deepest[anchored] = torch.where(usable, torch.full_like(advantage, float(k)), deepest[anchored])
    step_adv = torch.where(total > 0, weighted / total.clamp(min=1e-12), torch.zeros_like(weighted))
    used = deepest[anchored & (deepest >= 0)]
    metrics = {"env/hgpo_depth_used": used.mean().item() if used.numel() else 0.0}
    return (episode_adv + step_weight * step_adv).to(step_rewards.dtype), metrics
