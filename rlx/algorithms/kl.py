"""Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

With log-ratio d = log pi(x) - log pi_ref(x) for x ~ pi:
  k1 = d                      unbiased, high variance, can be negative
  k2 = d^2 / 2                biased, low variance, >= 0
  k3 = exp(-d) - 1 + d        unbiased, low variance, >= 0 (used by GRPO)
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """logp, ref_logp: (N, T). Returns the per-token estimate (N, T)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return torch.exp(-log_ratio) - 1.0 + log_ratio
    raise ValueError(f"unknown KL estimator '{estimator}'; valid choices: {', '.join(KL_ESTIMATORS)}")
