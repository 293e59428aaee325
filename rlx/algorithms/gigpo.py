"""Credit assignment for multi-turn episodes: trajectory-level groups, GiGPO, turn-level (MT-GRPO).

Layout of the inputs (flat, no padding): a batch holds E episodes and S steps (one step = one model
turn followed by one environment answer). Steps are ordered episode by episode, turn by turn.
  episode_group (E,) long   which task group an episode belongs to (episodes of the same task seed
                            share a group; GRPO compares the episodes of a group)
  step_episode  (S,) long   the episode of each step (non-decreasing)
  step_rewards  (S,) float  reward the environment returned after each step
  step_anchor   (S,) long   id of the environment state the step was taken IN (`info["anchor"]` of the
                            observation the model answered, mapped to ints by the rollout layer;
                            -1 = no anchor: the step is in no step group)
Every estimator returns a per-step advantage (S,); the rollout layer gives each step's generated
tokens the advantage of their step. Torch only.

Weighting decision (the issue asks for it): in the episode-level mean and std every EPISODE counts
once, whatever its number of steps or tokens (as GRPO counts every completion once; the GiGPO paper
does the same). In the step-level groups every OCCURRENCE of a state counts once: a state visited
twice in one episode contributes two (return) values, as in the paper's anchor-state grouping. Token
weighting happens only later, in the loss aggregation (token-mean etc.).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.registry import Registry


# algorithm.credit of the agent family: fn(episode_group, step_episode, step_rewards, step_anchor, **knobs) ->
# (step advantages (S,), metrics). The three below, then loo | gra | hgpo (rlx/algorithms/agent_credit.py, which
# rlx/algorithms/__init__.py imports, so every import of rlx.algorithms.* sees all six in this order)
@dataclass(frozen=True)
class CreditNeeds:
    """What a credit rule asks of the run, declared at registration: read by the loop (rlx/loops/credit.py
    CREDIT_INPUTS computes each named input and passes it as a keyword) and by the config's check
    (rlx/config/needs.py)."""

    inputs: tuple[str, ...] = ()  # episode inputs beyond the steps: "episode_outcome" (E,), "step_action" (S,)
    knobs: tuple[str, ...] = ()   # algorithm knobs that must be set (not null)


CREDIT = Registry("credit rule", default_needs=CreditNeeds())

# algorithm.scale of the agent family, the denominator s of the grouped advantage: fn(std (K,), eps) -> s,
# broadcastable to (K,)
SCALES = Registry("advantage scale")
SCALE_REGISTRY = SCALES  # the name older code and the README use


@SCALES.register("group")
def _group_scale(std, eps):
    return std + eps


@SCALES.register("none")
def _no_scale(std, eps):
    return 1.0


def _group_stats(values: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element mean, unbiased std and size of the group each element belongs to. (K,) each."""
    _, index = torch.unique(groups, return_inverse=True)  # (K,) dense group ids
    count = torch.zeros(int(index.max()) + 1 if index.numel() else 0, dtype=values.dtype).index_add_(
        0, index, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, index, values)
    mean = (total / count)[index]  # (K,)
    squares = torch.zeros_like(count).index_add_(0, index, (values - mean) ** 2)
    std = (squares / (count - 1).clamp(min=1)).sqrt()[index]  # (K,) 0 for a group of one
    return mean, std, count[index]


def grouped_advantages(values: torch.Tensor, groups: torch.Tensor, scale: str = "group",
                       eps: float = 1e-6) -> torch.Tensor:
    """A_k = (v_k - mean(group(k))) / (s + eps), groups given by ids rather than a fixed size.

    scale "group": s = unbiased std of the group (GRPO, Shao et al. 2024); "none": s = 1 (Dr. GRPO).
    A group of one element gets 0 (nothing to compare with). values, groups: (K,). Returns (K,)."""
    denominator = SCALES[scale]  # an unknown scale: one line listing the valid ones
    if values.numel() == 0:
        return values.clone()
    mean, std, count = _group_stats(values, groups)
    centered = values - mean
    advantages = centered / denominator(std, eps)
    return torch.where(count > 1, advantages, torch.zeros_like(advantages))


def invalid_action_penalty(step_rewards: torch.Tensor, valid: torch.Tensor, penalty: float) -> torch.Tensor:
    """r'_t = r_t - penalty * [action t was invalid]  (the "invalid-action penalty" of agent RL recipes,
    e.g. GiGPO's ALFWorld/WebShop setup, there 0.1). valid: (S,) bool. Returns (S,)."""
    return step_rewards - penalty * (~valid.bool()).to(step_rewards.dtype)


def episode_returns(step_rewards: torch.Tensor, step_episode: torch.Tensor, num_episodes: int) -> torch.Tensor:
    """R_i = sum_t r_{i,t}: the undiscounted return of each episode (the outcome GRPO ranks). (E,)."""
    return torch.zeros(num_episodes, dtype=step_rewards.dtype).index_add_(0, step_episode, step_rewards)


def discounted_returns(step_rewards: torch.Tensor, step_episode: torch.Tensor, gamma: float) -> torch.Tensor:
    """R_t = r_t + gamma * R_{t+1} within each episode (R after the last step is 0).

    Example: one episode with rewards [0, 0, 1], gamma 0.5 -> [0.25, 0.5, 1]. (S,) -> (S,)."""
    returns = torch.zeros_like(step_rewards)
    following = 0.0
    for t in reversed(range(step_rewards.numel())):
        last_of_episode = t == step_rewards.numel() - 1 or step_episode[t + 1] != step_episode[t]
        following = step_rewards[t] + (0.0 if last_of_episode else gamma * following)
        returns[t] = following
    return returns


@CREDIT.register("trajectory")
def trajectory_advantages(episode_group, step_episode, step_rewards, step_anchor=None, *, scale="group", eps=1e-6,
                          **_) -> tuple[torch.Tensor, dict]:
    """GRPO over whole episodes: A_i = (R_i - mean_{group}(R)) / (std + eps), R_i the episode return;
    every step of episode i gets A_i. Returns step advantages (S,) and metrics."""
    returns = episode_returns(step_rewards, step_episode, episode_group.numel())  # (E,)
    episode_adv = grouped_advantages(returns, episode_group, scale, eps)  # (E,)
    return episode_adv[step_episode], {}


@CREDIT.register("gigpo")
def gigpo_advantages(episode_group, step_episode, step_rewards, step_anchor, *, gamma=0.95, step_weight=1.0,
                     scale="group", eps=1e-6, **_) -> tuple[torch.Tensor, dict]:
    """GiGPO, Group-in-Group Policy Optimization (Feng et al. 2025, arXiv 2505.10978), eq. 7-10:

        A^E(i)   = (R_i - mean_{j in group(i)} R_j) / F          episode level, R_i = sum_t r_{i,t}
        R_{i,t}  = sum_{k >= t} gamma^{k-t} r_{i,k}                discounted step return
        A^S(i,t) = (R_{i,t} - mean_{(j,k) in G_S(i,t)} R_{j,k}) / F  step level
        A(i,t)   = A^E(i) + w * A^S(i,t)
    G_S(i,t), the anchor-state group, holds every step of the same task group taken in the same
    environment state (same anchor), across episodes and repeats within one episode. F is the group's
    std (+ eps) for scale="group" or 1 for "none". A step group of one (a state no other step
    visited) or a step without an anchor gets A^S = 0. gamma: discount (paper 0.95), w: step_weight
    (paper 1). Metrics: env/anchor_group_size, the mean size of the step group over anchored steps."""
    returns = episode_returns(step_rewards, step_episode, episode_group.numel())  # (E,)
    episode_adv = grouped_advantages(returns, episode_group, scale, eps)  # (E,)
    step_returns = discounted_returns(step_rewards, step_episode, gamma)  # (S,)
    anchored = step_anchor >= 0  # (S,)
    step_adv = torch.zeros_like(step_rewards)
    group_size = 0.0
    if anchored.any():
        # one key per (task group, anchor): steps of different tasks never share a step group
        task = episode_group[step_episode][anchored]
        key = task * (int(step_anchor.max()) + 1) + step_anchor[anchored]
        step_adv[anchored] = grouped_advantages(step_returns[anchored], key, scale, eps)
        group_size = _group_stats(step_returns[anchored], key)[2].mean().item()
    return episode_adv[step_episode] + step_weight * step_adv, {"env/anchor_group_size": group_size}


@CREDIT.register("turn")
def turn_advantages(episode_group, step_episode, step_rewards, step_anchor=None, *, turn_weight=1.0, scale="group",
                    eps=1e-6, **_) -> tuple[torch.Tensor, dict]:
    """Turn-level credit in the manner of MT-GRPO (Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning
    in LLM Agents via Turn-Level Credit Assignment", arXiv 2505.11821):

        A(i,t) = A^O(i) + lambda * A^T(i,t)
    A^O: the outcome advantage of the episode (GRPO over episode returns of the task group);
    A^T(i,t): the turn reward r_{i,t} compared with the rewards of turn t (same turn index) in the
    other episodes of the group. The paper has two turns and adds A^T to the first only; here every
    turn index is its own group, so with one intermediate reward it reduces to the paper's form.
    lambda: turn_weight. Returns (S,) and metrics."""
    returns = episode_returns(step_rewards, step_episode, episode_group.numel())  # (E,)
    outcome = grouped_advantages(returns, episode_group, scale, eps)[step_episode]  # (S,)
    first = torch.ones_like(step_episode, dtype=torch.bool)
    first[1:] = step_episode[1:] != step_episode[:-1]
    starts = torch.nonzero(first).squeeze(1)  # (E_with_steps,)
    turn_index = torch.arange(step_episode.numel()) - starts[torch.cumsum(first.long(), 0) - 1]  # (S,)
    task = episode_group[step_episode]
    key = task * (int(turn_index.max()) + 1 if turn_index.numel() else 1) + turn_index
    return outcome + turn_weight * grouped_advantages(step_rewards, key, scale, eps), {}
