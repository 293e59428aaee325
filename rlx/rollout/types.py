"""Rollout records shared by every sampler: token ids with a LOSS mask separate from the attention mask.

A multi-turn episode is one token sequence: the first prompt, then model turns and environment
answers alternating. Only the tokens the model sampled are trained (loss_mask 1); environment and
tool tokens are attended to (attention 1) but carry loss mask 0. Single-turn sampling is the case of
one turn and no environment tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Generation:
    """What a Generator returns for a batch of token-id prompts (one entry per prompt row)."""

    ids: list[list[int]]            # sampled token ids, exactly as drawn, up to and including the stop token
    logprobs: list[list[float]] | None  # log-prob of each sampled id under the sampling distribution (None: not asked)
    stopped: list[bool]             # True when a stop token ended the row (False: the budget ran out)


@dataclass
class Episode:
    """One episode as it was played, token by token (lists, no padding)."""

    prompt_ids: list[int]                                        # the first prompt (system + first observation)
    ids: list[int] = field(default_factory=list)                 # everything after the prompt
    loss_mask: list[int] = field(default_factory=list)           # 1 on sampled tokens, 0 on environment tokens
    logprobs: list[float] = field(default_factory=list)          # sampler log-prob (0.0 on environment tokens)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each model turn in `ids`
    step_rewards: list[float] = field(default_factory=list)      # reward after each turn
    anchors: list = field(default_factory=list)                  # state key the turn was taken in (None: none)
    valid: list[bool] = field(default_factory=list)              # info["is_action_valid"] of each turn
    actions: list[str] = field(default_factory=list)             # decoded text of each turn (what the env saw)
    observations: list[str] = field(default_factory=list)        # first observation, then each answer shown
    metrics: dict = field(default_factory=dict)                  # last info["metrics"] of the episode
    terminated: bool = False                                     # the environment ended the episode
    truncated: bool = False                                      # cut: env truncation, max_turns, budgets, errors
    turn_truncated: int = 0                                      # turns that hit the per-turn token budget
    error: str | None = None                                     # what went wrong, when the env failed
    versions: list[int] = field(default_factory=list)            # policy version that sampled each turn (gateway)
    forks: list = field(default_factory=list)                    # other rows of a harness session (rlx/gateway/episodes.py)

    @property
    def success(self) -> float:
        return float(self.metrics.get("success", float(sum(self.step_rewards) > 0)))


@dataclass
class RolloutBatch:
    """Padded tensors of N sequences, ready for a forward pass (rlx.models.forward.completion_logprobs).

    prompt_ids / prompt_mask (N, P) left-padded; completion_ids (N, C) right-padded holds every token
    after the prompt (model AND environment tokens); completion_mask (N, C) is its attention mask,
    loss_mask (N, C) marks the sampled tokens only; sampler_logprobs (N, C); step_index (N, C) the
    turn each sampled token belongs to (-1 elsewhere), to spread per-step advantages over tokens;
    truncated (N,) bool."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    step_index: torch.Tensor
    truncated: torch.Tensor

    @classmethod
    def from_episodes(cls, episodes: list[Episode], pad_id: int) -> RolloutBatch:
        n = len(episodes)
        p = max(1, max(len(e.prompt_ids) for e in episodes))
        c = max(1, max(len(e.ids) for e in episodes))
        prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((n, p), dtype=torch.long)
        completion_ids = torch.full((n, c), pad_id, dtype=torch.long)
        completion_mask = torch.zeros((n, c), dtype=torch.long)
        loss_mask = torch.zeros((n, c), dtype=torch.long)
        logprobs = torch.zeros((n, c))
        step_index = torch.full((n, c), -1, dtype=torch.long)
        for row, e in enumerate(episodes):
            if e.prompt_ids:
                prompt_ids[row, p - len(e.prompt_ids):] = torch.tensor(e.prompt_ids)
                prompt_mask[row, p - len(e.prompt_ids):] = 1
            k = len(e.ids)
            if k:
                completion_ids[row, :k] = torch.tensor(e.ids)
                completion_mask[row, :k] = 1
                loss_mask[row, :k] = torch.tensor(e.loss_mask)
                logprobs[row, :k] = torch.tensor(e.logprobs)
            for turn, (start, end) in enumerate(e.turn_spans):
                step_index[row, start:end] = turn
            step_index[row] = torch.where(loss_mask[row].bool(), step_index[row], -1)
        truncated = torch.tensor([e.truncated for e in episodes], dtype=torch.bool)
        return cls(prompt_ids, prompt_mask, completion_ids, completion_mask, loss_mask, logprobs, step_index, truncated)
