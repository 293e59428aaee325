"""Advantage transforms: applied after the estimator, in the configured order (`algorithm.transforms`).

    TRANSFORMS[name](advantages (N,), rewards (N,), signals: GroupSignals, **knobs) -> (advantages (N,), metrics)

`rewards` are the (shaped) rewards the estimator saw; `signals` the same GroupSignals the shapers get
(rlx/algorithms/shaping.py). W-REINFORCE's sign weighting (advantages.py sign_weighted) is the oldest
transform of this kind and stays where it is. Torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlx.algorithms.grouping import dense_ids, group_mean, group_size, group_sum
from rlx.algorithms.shaping import GroupSignals
from rlx.registry import Registry


@dataclass(frozen=True)
class TransformNeeds:
    """What an advantage transform asks of the run, read by rlx/config/needs.py."""

    group_at_least: str = ""  # an algorithm.shaping knob the samples per prompt must reach (pass_at_k: pass_k)


TRANSFORMS = Registry("advantage transform", default_needs=TransformNeeds())


def apply_transforms(names, advantages: torch.Tensor, rewards: torch.Tensor, signals: GroupSignals,
                     knobs: dict) -> tuple[torch.Tensor, dict]:
    """Run the named transforms in order. Returns advantages (N,) and their metrics."""
    metrics: dict = {}
    for name in names:
        advantages, transform_metrics = TRANSFORMS[name](advantages, rewards, signals, **knobs)
        metrics.update(transform_metrics)
    return advantages, metrics


def agrae_advantages(advantages: torch.Tensor, rewards: torch.Tensor, groups: torch.Tensor, alpha: float = 1.0,
                     eps: float = 1e-6, correct: torch.Tensor | None = None) -> torch.Tensor:
    """A-GRAE's asymmetric scaling ("Unveiling Implicit Advantage Symmetry"; the authors'
    code Yu7-code/A-GRAE, verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage, grpo_weight 2.0):
        p_g  = pass rate of group g,  p_bar = mean of p_g over the batch's groups (each group once)
        A'   = (1 - p_bar) * 0.5 * A / (1 - sqrt(p_g) + eps) + p_bar * 0.5 * A / (sqrt(p_g) + eps)
        A'  <- A' * min(1, p_bar / alpha)   where A' > 0      (alpha = 1 for math, 0.5 for geo3k / med)
    Early (p_bar small) the easy groups' samples are amplified, later the hard groups'; positive
    advantages stay damped while the batch is mostly failing.

    p_g is the share of the group's samples the verifier judged correct (`correct`, bool (N,)); without a
    verifier, the group's mean reward clamped into [0, 1]. The authors' rewards are binary, so there the two
    agree; with other reward components (rlx's format bonus) the total reward is not a pass rate. A term whose
    denominator would be eps alone (1 - sqrt(p_g) in an all-correct group, sqrt(p_g) in an all-wrong one) is
    left out: with binary rewards those groups have A = 0 and the term is 0 either way, while with other
    components their advantages would be multiplied by 1 / eps. advantages, rewards, groups: (N,)."""
    solved = correct.double() if correct is not None else rewards.double()
    rate = group_mean(solved, groups).clamp(0.0, 1.0)  # (N,) p_g
    index, count = dense_ids(groups)
    per_group = torch.zeros(count, dtype=torch.float64).index_add_(0, index, rate / group_size(groups))  # each p_g once
    overall = per_group.mean()  # p_bar
    root = rate.sqrt()
    values = advantages.double()
    hard = torch.where(root < 1, values / (1 - root + eps), torch.zeros_like(values))
    easy = torch.where(root > 0, values / (root + eps), torch.zeros_like(values))
    scaled = (1 - overall) * 0.5 * hard + overall * 0.5 * easy
    scaled = torch.where(scaled > 0, scaled * torch.clamp(overall / alpha, max=1.0), scaled)
    return scaled.to(advantages.dtype)


@TRANSFORMS.register("agrae")
def agrae_transform(advantages, rewards, signals: GroupSignals, *, agrae_alpha: float = 1.0, eps: float = 1e-6, **_):
    return agrae_advantages(advantages, rewards, signals.groups, agrae_alpha, eps, signals.correct), {}


def _comb(n: int, k: int) -> int:
    return math.comb(n, k) if 0 <= k <= n else 0


def pass_at_k_advantages(correct: torch.Tensor, groups: torch.Tensor, k: int, eps: float = 1e-6) -> torch.Tensor:
    """Pass@k Training's analytical advantages (Chen et al. 2025, "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation of Large Reasoning Models", arXiv 2508.10751; the authors'
    code RUCAIBox/Passk_Training, code/passk_adv.py). NOT from the seed listings. For a group of n
    samples with c correct:
        R_bar = 1 - C(n - c, k) / C(n, k)                          (the group's pass@k)
        sigma = sqrt(R_bar (1 - R_bar))
        A_pos = (1 - R_bar) / (sigma + eps)
        A_neg = (1 - R_bar - C(n - c - 1, k - 1) / C(n - 1, k - 1)) / (sigma + eps)
    It replaces the estimator's advantages (binary verifier rewards only). All-correct and all-wrong
    groups get 0. Needs n >= k in every group. correct, groups: (N,). Returns (N,) float."""
    index, count = dense_ids(groups)
    sizes = torch.zeros(count, dtype=torch.long).index_add_(0, index, torch.ones_like(index))
    hits = torch.zeros(count, dtype=torch.long).index_add_(0, index, correct.long())
    positive, negative = torch.zeros(count, dtype=torch.float64), torch.zeros(count, dtype=torch.float64)
    for g, (n, c) in enumerate(zip(sizes.tolist(), hits.tolist())):
        if n < k:
            raise ValueError(f"transform pass_at_k with algorithm.pass_k={k} needs at least k samples per group, got "
                             f"{n}")
        rate = 1.0 - _comb(n - c, k) / _comb(n, k)
        sigma = math.sqrt(rate * (1.0 - rate))
        positive[g] = (1.0 - rate) / (sigma + eps)
        negative[g] = (1.0 - rate - _comb(n - c - 1, k - 1) / _comb(n - 1, k - 1)) / (sigma + eps)
    return torch.where(correct.bool(), positive[index], negative[index])


@TRANSFORMS.register("pass_at_k", needs=TransformNeeds(group_at_least="pass_k"))
def pass_at_k_transform(advantages, rewards, signals: GroupSignals, *, pass_k: int = 4, eps: float = 1e-6, **_):
    correct = signals.need("correct", "transform pass_at_k")
    return pass_at_k_advantages(correct, signals.groups, pass_k, eps).to(advantages.dtype), {}


def efficiency_advantages(advantages: torch.Tensor, correct: torch.Tensor, efficiency: torch.Tensor,
                          groups: torch.Tensor, weight: float, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """An efficiency advantage computed among the CORRECT samples only, added to the accuracy advantage
    (the conditional advantage of HDPO, "Act Wisely", seed listing 001; the abstract gives the principle,
    this form is rlx's):
        A_i = A^acc_i + w * c_i * (e_i - mean_{j correct in g} e_j) / (std_{j correct in g} e + eps)
    e = efficiency score (e.g. minus the length, minus the tool calls); c_i = 1 if sample i is correct.
    Incorrect samples, and groups with fewer than two correct samples, get no efficiency term, so a
    short wrong answer is never preferred to a long right one. (N,) each. Returns the advantages and
    the efficiency term (N,)."""
    chosen = correct.bool()
    key = torch.where(chosen, groups, torch.full_like(groups, -1))  # correct samples of a group share a key
    values = torch.where(chosen, efficiency.double(), torch.zeros_like(efficiency, dtype=torch.float64))
    count = group_sum(chosen.double(), key)
    mean = group_sum(values, key) / count.clamp(min=1)
    spread = (group_sum(torch.where(chosen, (values - mean) ** 2, torch.zeros_like(values)), key)
              / (count - 1).clamp(min=1)).sqrt()
    term = torch.where(chosen & (count >= 2), (values - mean) / (spread + eps), torch.zeros_like(values))
    return (advantages.double() + weight * term).to(advantages.dtype), term


@TRANSFORMS.register("efficiency")
def efficiency_transform(advantages, rewards, signals: GroupSignals, *, efficiency_weight: float = 0.5,
                         eps: float = 1e-6, **_):
    """Efficiency = minus the completion length (agents: pass minus the turns as `lengths`)."""
    correct, lengths = signals.need("correct", "transform efficiency"), signals.need("lengths", "transform efficiency")
    shaped, term = efficiency_advantages(advantages, correct, -lengths.double(), signals.groups, efficiency_weight, eps)
    return shaped, {"shaping/efficiency_term_abs": term.abs().mean().item()}


def forward_correction_weights(observed: torch.Tensor, fn_rate: float) -> torch.Tensor:
    """Forward correction (Cai et al. 2025, arXiv 2510.00915): each sample's score-function term is
    weighted by w_1 = rho_1 if the verifier accepted it and w_0 = rho_1 - 1 if it rejected it (only the
    false-negative rate rho_1 is needed). With E[grad log pi] = 0 and the channel of
    shaping.inject_verifier_noise, E[w | r*] = (1 - rho_0 - rho_1) (r* - 1): the expected update is the
    clean REINFORCE direction scaled by (1 - rho_0 - rho_1). The weights are a constant shift of the
    observed reward (w = r_obs - (1 - rho_1)), so a group baseline would erase them: rlx uses them AS the
    advantage (baseline-free), for a binary verifier reward alone. The paper's exact combination with
    GRPO's normalisation was not checked. observed: (N,) 0/1. Returns (N,) float."""
    return observed.double() - (1.0 - fn_rate)


@TRANSFORMS.register("noise_forward")
def noise_forward_transform(advantages, rewards, signals: GroupSignals, *, assumed_fn_rate: float = 0.0, **_):
    observed = signals.need("correct", "transform noise_forward")
    return forward_correction_weights(observed, assumed_fn_rate).to(advantages.dtype), {}
