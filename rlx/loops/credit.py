"""Credit: from a producer's Batch to the advantage of every trained token, one rule per record of rows.

`credit_rule(batch, family)` picks the rule by the batch's own record (`Batch.source`), for the policy-gradient
loop:
- PromptRows (single-turn rows): an outcome estimator (`algorithm.advantage`: grpo, rloo, median, reinforce_pp,
  ngrpo, ...; rlx/algorithms/advantages.py) over the rewards keyed by group id (hinted re-samples join their
  group), optionally with the sequence KL subtracted from the reward first (kl_in=reward) and weighted by sign
  (W-REINFORCE); one advantage per row.
- EpisodeRows (episodes, the harness): a credit rule (`algorithm.credit`: trajectory, gigpo, turn, loo, gra, hgpo;
  rlx/algorithms/gigpo.py) over the steps of every episode of the global batch; each sampled token gets its step's
  advantage.
Both compute over the GLOBAL batch (every process's rows), so N processes take the step one process would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlx.algorithms.advantages import outcome_advantages, sign_weighted
from rlx.algorithms.gigpo import CREDIT, invalid_action_penalty
from rlx.algorithms.kl import sequence_kl_in_reward
from rlx.algorithms.shaping import GroupSignals
from rlx.algorithms.transforms import apply_transforms
from rlx.engines.records import Episode
from rlx.errors import UserError
from rlx.rollout.stages import mean_logprobs
from rlx.rollout.types import Batch, EpisodeRows, PromptRows
from rlx.runtime.parallel import gather, gather_padded


@dataclass
class Credit:
    """advantages: (n,) per row or (n, C) per token, this process's rows; keep (n,) bool: rows in the loss;
    any_signal: some kept advantage is non-zero over the global batch; seq_kl (N,): the sequence KL taken out
    of the reward (kl_in=reward), for the adaptive coefficient; samples: per-row extras for the samples files."""

    advantages: torch.Tensor
    keep: torch.Tensor
    any_signal: bool
    metrics: dict = field(default_factory=dict)
    seq_kl: torch.Tensor | None = None
    samples: list[dict] = field(default_factory=list)


def advantage_metrics(advantages: torch.Tensor, mask: torch.Tensor | None = None) -> dict:
    """train/advantage_mean|std|max over the samples (or valid tokens when a mask is given)."""
    values = advantages[mask.bool()] if mask is not None else advantages
    if values.numel() == 0:
        return {"train/advantage_mean": 0.0, "train/advantage_std": 0.0, "train/advantage_max": 0.0}
    return {
        "train/advantage_mean": values.mean().item(),
        "train/advantage_std": values.std().item() if values.numel() > 1 else 0.0,
        "train/advantage_max": values.abs().max().item(),
    }


def outcome_credit(batch: Batch, algo, *, acc, completion_mask, old_logp=None, ref_logp=None,
                   kl_coef: float = 0.0) -> Credit:
    """Group-relative advantages of the outcome rewards (N,) -> this process's (n,) and the kept rows."""
    rewards, local = batch.rewards, batch.local
    shaped, seq_kl = rewards, None
    if ref_logp is not None and algo.kl_in == "reward":
        shaped, seq_kl = sequence_kl_in_reward(rewards[local], old_logp, ref_logp, completion_mask, kl_coef)  # (n,)
        shaped, seq_kl = gather(acc, shaped), gather(acc, seq_kl)  # (N,)
    groups = batch.groups  # (N,)
    global_advantages, global_keep, estimator_metrics = outcome_advantages(
        shaped, groups, algo.advantage, scale=algo.scale, eps=algo.eps, virtual_reward=algo.virtual_reward,
        virtual_samples=algo.virtual_samples)
    if algo.transforms:  # the advantage-transform stage (rlx/algorithms/transforms.py), in the configured order
        signals = GroupSignals(groups, batch.correct, batch.rollout.lengths, mean_logprobs(batch.rollout))
        knobs = {**vars(algo.shaping), "eps": algo.eps}
        for name in algo.transforms:
            before = global_advantages
            global_advantages, transform_metrics = apply_transforms([name], before, shaped, signals, knobs)
            global_advantages = global_advantages.to(before.dtype)
            estimator_metrics.update(transform_metrics)  # and the generic mechanism metric: how far it moved them
            estimator_metrics[f"transform/{name}_delta_abs"] = (global_advantages - before).abs().mean().item()
    global_advantages = sign_weighted(global_advantages, algo.positive_weight, algo.negative_weight)  # (N,)
    advantages, keep = global_advantages[local], global_keep[local]  # (n,), (n,)
    kept = global_advantages[global_keep]
    return Credit(advantages, keep, bool(kept.abs().any()), {**advantage_metrics(kept), **estimator_metrics}, seq_kl,
                  [{"advantage": a} for a in advantages.tolist()])


def step_tensors(episodes: list[Episode], group_size: int, invalid_penalty: float):
    """Flatten episodes for algorithms/gigpo.py: episode_group (E,), step_episode (S,), step_rewards (S,)
    with the invalid-action penalty applied, step_anchor (S,) (-1: no anchor; anchors are numbered in
    order of appearance, so equal keys get equal ids)."""
    anchor_ids: dict = {}
    step_episode, rewards, anchors, valid = [], [], [], []
    for i, e in enumerate(episodes):
        for t, reward in enumerate(e.step_rewards):
            step_episode.append(i)
            rewards.append(reward)
            key = e.anchors[t] if t < len(e.anchors) else None
            anchors.append(-1 if key is None else anchor_ids.setdefault(key, len(anchor_ids)))
            valid.append(e.valid[t] if t < len(e.valid) else True)
    episode_group = torch.arange(len(episodes)) // group_size  # (E,)
    rewards = invalid_action_penalty(torch.tensor(rewards, dtype=torch.float32), torch.tensor(valid, dtype=torch.bool),
                                     invalid_penalty)
    return episode_group, torch.tensor(step_episode, dtype=torch.long), rewards, torch.tensor(anchors, dtype=torch.long)


def episode_outcomes(episodes: list[Episode], step_episode: torch.Tensor, step_rewards: torch.Tensor):
    """G-RA's split of each episode's rewards: the outcome o_i (E,) and the immediate rewards (S,). The outcome is
    the environment's info["metrics"]["outcome"] at the episode's end, else its success (Episode.success); the
    environment's step rewards include the outcome at the last step (the usual convention), so it is taken out
    of the last step's reward: immediate = step rewards - o_i at the last step."""
    outcome = torch.tensor([float(e.metrics.get("outcome", e.success)) for e in episodes], dtype=step_rewards.dtype)
    immediate = step_rewards.clone()
    if step_episode.numel():
        last = torch.ones_like(step_episode, dtype=torch.bool)
        last[:-1] = step_episode[1:] != step_episode[:-1]
        immediate[last] -= outcome[step_episode[last]]
    return outcome, immediate


def _outcome_input(episodes: list[Episode], step_episode: torch.Tensor, step_rewards: torch.Tensor):
    """episode_outcome (E,) for G-RA, and the step rewards without it (`episode_outcomes`)."""
    outcome, immediate = episode_outcomes(episodes, step_episode, step_rewards)
    return immediate, outcome


def _action_input(episodes: list[Episode], step_episode: torch.Tensor, step_rewards: torch.Tensor):
    """step_action (S,): each step's action text numbered in order of appearance (HGPO's history keys pair each past
    anchor with the action taken there); the step rewards unchanged."""
    names: dict = {}
    actions = [names.setdefault(e.actions[t].strip() if t < len(e.actions) else "", len(names))
               for e in episodes for t in range(len(e.step_rewards))]
    return step_rewards, torch.tensor(actions, dtype=torch.long)


# CreditNeeds.inputs name -> fn(episodes, step_episode (S,), step_rewards (S,)) -> (step_rewards (S,), the input)
CREDIT_INPUTS = {"episode_outcome": _outcome_input, "step_action": _action_input}


def token_advantages(step_adv: torch.Tensor, step_episode: torch.Tensor, step_index: torch.Tensor,
                     owner: torch.Tensor | None = None) -> torch.Tensor:
    """(N, C) advantage of every sampled token: the advantage of its step (0 on environment tokens).
    owner (N,): the episode of each row (None: row i is episode i; a harness episode can have several rows)."""
    owner = torch.arange(step_index.shape[0]) if owner is None else owner
    num_episodes = int(owner.max()) + 1 if owner.numel() else 0
    counts = torch.bincount(step_episode, minlength=num_episodes)
    offsets = (torch.cumsum(counts, 0) - counts)[owner]  # (N,) first step of each row's episode in the flat list
    flat = offsets.unsqueeze(1) + step_index.clamp(min=0)  # (N, C)
    values = step_adv[flat.clamp(max=max(step_adv.numel() - 1, 0))] if step_adv.numel() else torch.zeros(flat.shape)
    return torch.where(step_index >= 0, values, torch.zeros_like(values))


def episode_credit(batch: Batch, algo, *, acc, **_) -> Credit:
    """Per-step advantages of the global episodes (algorithm.credit) -> this process's per-token (n, C)."""
    episodes, local = batch.source.episodes, batch.local
    knobs = dict(gamma=algo.gamma, step_weight=algo.step_weight, turn_weight=algo.turn_weight, scale=algo.scale,
                 eps=algo.eps, gate_threshold=algo.gate_threshold, hgpo_depth=algo.hgpo_depth,
                 hgpo_alpha=algo.hgpo_alpha)
    episode_group, step_episode, step_rewards, step_anchor = step_tensors(episodes, batch.group_size,
                                                                          algo.invalid_penalty)
    for name in CREDIT.needs(algo.credit).inputs:  # the episode inputs the rule declared it needs
        step_rewards, knobs[name] = CREDIT_INPUTS[name](episodes, step_episode, step_rewards)
    # (S,)
    step_adv, credit_metrics = CREDIT[algo.credit](episode_group, step_episode, step_rewards, step_anchor, **knobs)
    any_signal = bool(step_adv.abs().any())  # over the global batch, so every process decides alike
    mine = (step_episode >= local.start) & (step_episode < local.stop)
    step_adv, step_episode = step_adv[mine], step_episode[mine] - local.start  # this process's steps
    rollout = batch.rollout
    advantages = token_advantages(step_adv, step_episode, rollout.step_index, batch.source.row_episode)  # (n, C)
    keep = rollout.loss_mask.sum(dim=1) > 0  # (n,) an episode that failed before its first turn has no tokens
    sampled = gather_padded(acc, rollout.loss_mask).bool()  # (N, C)
    all_advantages = gather_padded(acc, advantages)  # (N, C)
    metrics = {
        **credit_metrics,
        "env/anchor_group_size": credit_metrics.get("env/anchor_group_size", 0.0),
        "train/advantage_mean": all_advantages[sampled].mean().item() if sampled.any() else 0.0,
        "train/advantage_std": all_advantages[sampled].std().item() if sampled.sum() > 1 else 0.0,
    }
    samples = [{"advantages": step_adv[step_episode == i].tolist()} for i in range(local.stop - local.start)]
    return Credit(advantages, keep, any_signal, metrics, None, samples)


# the record of a batch's rows (Batch.source) -> its credit rule
CREDIT_RULES = {PromptRows: outcome_credit, EpisodeRows: episode_credit}
# algorithm.family -> the record of the rows it trains
FAMILY_ROWS = {"policy_gradient": PromptRows, "ppo": PromptRows, "agent": EpisodeRows}


def require_rows(batch: Batch, family: str) -> None:
    """UserError (one line) when `batch` holds rows of another record than the `family` trains: a producer of the
    user's own (rollout.producer) handing the wrong rows stops at its first batch."""
    wanted, got = FAMILY_ROWS[family], type(batch.source)
    if got is not wanted:
        raise UserError(f"the producer handed {got.__name__} rows, and the {family} family trains {wanted.__name__} "
                        f"rows (rlx/rollout/types.py); pick a producer of those rows (rollout.producer) or another "
                        f"algorithm")


def credit_rule(batch: Batch, family: str):
    """The credit rule of `batch`'s rows (CREDIT_RULES by Batch.source), once `require_rows` holds."""
    require_rows(batch, family)
    return CREDIT_RULES[type(batch.source)]
