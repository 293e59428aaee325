"""EPO-style entropy smoothing for multi-turn agents: keep each turn's token entropy inside a band
around its historical average (Xu et al. 2025, "EPO: Entropy-regularized Policy Optimization for LLM
Agents Reinforcement Learning", arXiv 2509.22576; the authors' code WujiangXu/EPO,
verl/workers/actor/dp_actor.py generate_entropy_penalty and _calculate_epoch_based_entropy_weight).

What the authors' code does: H_bar_k = the average over past training steps of the mean token entropy
at turn k; a token whose entropy lies outside (min_ratio * H_bar_k, max_ratio * H_bar_k) (0.8 / 1.2 by
default, 0.5 / 1.5 in their server script) is marked with a constant out_range_penalty, the marks are
aggregated like the loss and subtracted from the entropy bonus, only in the second half of training,
scaled by a phase weight. A constant mark carries no gradient, so rlx departs: its penalty is the
DISTANCE of the entropy to the band, which is differentiable and zero inside the band (below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def entropy_band_penalty(entropy: torch.Tensor, turn_index: torch.Tensor, history: torch.Tensor,
                         low: float = 0.8, high: float = 1.2) -> torch.Tensor:
    """Per-token penalty p_t = relu(low * H_bar_k - H_t) + relu(H_t - high * H_bar_k), k = the turn of
    token t, H_bar = history (K,) of historical mean entropies per turn index (turns beyond it use the
    last entry). Zero inside the band; its gradient pulls H_t back toward the band. Example: H_bar = 1,
    band (0.8, 1.2): H = 1.5 -> 0.3, H = 0.5 -> 0.3, H = 1.0 -> 0. entropy, turn_index: (n, T); tokens
    of no turn (turn_index < 0) get 0. Returns (n, T)."""
    if history.numel() == 0:
        return torch.zeros_like(entropy)
    reference = history.to(entropy.dtype)[turn_index.clamp(0, history.numel() - 1)]  # (n, T)
    penalty = torch.relu(low * reference - entropy) + torch.relu(entropy - high * reference)
    return torch.where(turn_index >= 0, penalty, torch.zeros_like(penalty))


@dataclass(frozen=True)
class BandTerm:
    """One step's entropy band, passed to the loss as an argument (it moves every step): the weight of the penalty
    (coef x the phase weight), the history H_bar (K,) and the band's edges as multiples of it."""

    weight: float
    history: torch.Tensor
    low: float
    high: float

    def penalty(self, entropy: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
        """entropy_band_penalty of each token (n, T) against this step's history."""
        return entropy_band_penalty(entropy, turn_index, self.history.to(entropy.device), self.low, self.high)


def epo_phase_weight(step: int, total_steps: int) -> float:
    """The authors' phase weight of the smoothing term over training (progress p in each half):
    first half 1 - 0.2 (1 - exp(-2 p)) (slowly from 1 to ~0.83), second half 0.8 exp(-3 p) (0.8 to ~0.04).
    Their code applies the smoothing only in the second half; the loop decides when to call this."""
    half = total_steps // 2
    step = max(0, min(step, total_steps))
    if half == 0:
        return 1.0
    if step <= half:
        return 1.0 - 0.2 * (1.0 - math.exp(-2.0 * step / half))
    rest = total_steps - half
    return 0.8 * math.exp(-3.0 * (step - half) / rest) if rest else 0.8


class EntropyHistory:
    """H_bar_k: the mean over past steps of each step's mean token entropy at turn k (the authors keep the
    list of per-step values and average it). Checkpointed exactly (state_dict / load_state_dict)."""

    def __init__(self):
        self.sums: list[float] = []
        self.counts: list[int] = []

    def update(self, entropy: torch.Tensor, turn_index: torch.Tensor) -> None:
        """Add one step: the mean entropy of the tokens of each turn index present in this batch."""
        valid = turn_index >= 0
        if not valid.any():
            return
        turns = int(turn_index[valid].max()) + 1
        while len(self.sums) < turns:
            self.sums.append(0.0)
            self.counts.append(0)
        for k in range(turns):
            chosen = entropy[turn_index == k]
            if chosen.numel():
                self.sums[k] += chosen.double().mean().item()
                self.counts[k] += 1

    def means(self) -> torch.Tensor:
        """(K,) H_bar per turn index (turns never seen: the previous turn's value)."""
        out, last = [], 0.0
        for total, count in zip(self.sums, self.counts):
            last = total / count if count else last
            out.append(last)
        return torch.tensor(out, dtype=torch.float64)

    def state_dict(self) -> dict:
        return {"sums": list(self.sums), "counts": list(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.sums, self.counts = [float(v) for v in state["sums"]], [int(v) for v in state["counts"]]
