"""Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

With log-ratio d = log pi(x) - log pi_ref(x) for x ~ pi:
  k1 = d                      unbiased, high variance, can be negative
  k2 = d^2 / 2                biased, low variance, >= 0
  k3 = exp(-d) - 1 + d        unbiased, low variance, >= 0 (used by GRPO)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.registry import Registry

# algorithm.kl_estimator: per-token KL estimators of the log-ratio x = log pi - log pi_ref (Schulman 2020,
# "Approximating KL divergence"): fn(x (N, T)) -> (N, T)
KL_ESTIMATORS = Registry("KL estimator")
KL_ESTIMATOR_REGISTRY = KL_ESTIMATORS  # the name older code and the README use


@KL_ESTIMATORS.register("k1")
def _k1(x):
    return x


@KL_ESTIMATORS.register("k2")
def _k2(x):
    return 0.5 * x.pow(2)


@KL_ESTIMATORS.register("k3")
def _k3(x):
    return torch.exp(-x) - 1.0 + x


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """logp, ref_logp: (N, T). Returns the per-token estimate (N, T)."""
    return KL_ESTIMATORS[estimator](logp - ref_logp)  # an unknown name: one line listing the valid ones


# algorithm.kl_in, where the KL to the reference acts: fn(token_loss, kl, mask, kl_coef) -> token_loss, each (n, T).
# "reward": the loop shapes the rewards instead (sequence_kl_in_reward / token_rewards), the loss is left as is
KL_PLACEMENTS = Registry("KL placement")
KL_PLACEMENT_REGISTRY = KL_PLACEMENTS  # the name older code and the README use


@KL_PLACEMENTS.register("loss")
def _kl_in_loss(token_loss, kl, mask, kl_coef):
    return token_loss + kl_coef * kl * mask


@KL_PLACEMENTS.register("reward")
def _kl_in_reward(token_loss, kl, mask, kl_coef):
    return token_loss


@dataclass(frozen=True)
class PenaltyTerms:
    """How the KL and entropy terms enter the per-token loss (penalized_token_loss), read once from the algorithm
    settings: the KL estimator (kl_penalty), where the KL goes (algorithm.kl_in: loss | reward) and the entropy
    bonus' coefficient. The KL coefficient is not here: an adaptive controller moves it every step."""

    kl_estimator: str
    kl_in: str
    entropy_coef: float

    @classmethod
    def of(cls, algo) -> PenaltyTerms:
        return cls(algo.kl_estimator, algo.kl_in, algo.entropy_coef)


def penalized_token_loss(
    token_loss: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor | None, entropy: torch.Tensor,
    mask: torch.Tensor, kl_coef: float, terms: PenaltyTerms,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The per-token loss with the KL and entropy terms of the policy-gradient and PPO families (terms: the KL
    estimator, kl_in and entropy_coef):

        loss_t = pg_t + kl_coef * KL_t * m_t   (only when kl_in = "loss")   - entropy_coef * H_t * m_t
    KL_t = kl_penalty(logp, ref_logp, kl_estimator) (Schulman 2020); the entropy bonus as in PPO (Schulman
    et al. 2017). Example: pg = 0.1, KL = 0.2, H = 1.5, m = 1, kl_coef 0.5, entropy_coef 0.01 ->
    0.1 + 0.1 - 0.015 = 0.185. token_loss, logp, ref_logp, entropy, mask: (n, T). Returns the loss (n, T)
    and KL_t (n, T), or None without a reference."""
    kl = None
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, terms.kl_estimator)  # (n, T)
        token_loss = KL_PLACEMENT_REGISTRY[terms.kl_in](token_loss, kl, mask, kl_coef)
    if terms.entropy_coef > 0:
        token_loss = token_loss - terms.entropy_coef * entropy * mask
    return token_loss, kl


def sequence_kl_in_reward(
    rewards: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL in the reward (Ziegler et al. 2019; Ouyang et al. 2022) for outcome-reward estimators:

        r'_i = r_i - coef * sum_t m_t * k1_t,     k1_t = logp_t - ref_logp_t
    Example: r = 1, k1 = [0.2, 0.3], coef 0.5 -> r' = 1 - 0.5 * 0.5 = 0.75.
    rewards: (N,); logp, ref_logp, mask: (N, T). Returns shaped rewards (N,) and the per-sequence KL (N,)."""
    kl = ((logp - ref_logp) * mask.to(logp.dtype)).sum(dim=1)  # (N,)
    return rewards - coef * kl, kl


def token_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token reward for PPO: the outcome reward on the last valid completion token, minus
    kl_coef * k1_t on every valid token when log-probs are given (KL in the reward, Ouyang et al. 2022).

    Example: r = 1, mask [1, 1, 0], k1 = [0.1, 0.2, x], coef 1 -> [-0.1, 1 - 0.2, 0] = [-0.1, 0.8, 0].
    An empty completion (mask all 0) gets no reward anywhere. rewards: (N,); others (N, T). Returns (N, T)."""
    mask = mask.to(rewards.dtype)
    lengths = mask.sum(dim=1).long()  # (N,)
    out = torch.zeros_like(mask)  # (N, T)
    has_tokens = lengths > 0
    rows = torch.arange(mask.shape[0])[has_tokens]
    out[rows, lengths[has_tokens] - 1] = rewards[has_tokens]
    if logp is not None and ref_logp is not None and kl_coef:
        out = out - kl_coef * (logp - ref_logp) * mask
    return out


def adaptive_kl_coef(coef: float, observed_kl: float, target: float, horizon: int, batch_size: int) -> float:
    """Adaptive KL controller (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences"):

        error = clip(observed_kl / target - 1, -0.2, 0.2)
        coef <- coef * (1 + error * batch_size / horizon)
    The coefficient grows when the policy drifts past the target KL and shrinks below it.
    Example: coef 0.1, KL 12, target 6 -> error clipped to 0.2; n = 100, horizon 1000 -> 0.1 * 1.02 = 0.102."""
    error = min(max(observed_kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * batch_size / horizon)
