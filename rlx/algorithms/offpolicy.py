"""The sampler is not the trainer: log-prob gap and truncated importance sampling (TIS).

A rollout engine (vLLM) samples with its own kernels, so its probability of a sampled token, pi_sampler, differs
from the trainer's pi_train under the same weights (float error, and any mismatch of settings such as the
temperature). Yao et al. (2025), "Your efficient RL framework secretly brings you off-policy RL training",
correct the policy gradient by the truncated ratio min(pi_train / pi_sampler, C) per token (TIS).
"""

from __future__ import annotations

import torch


def logprob_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, int]:
    """|log pi_train - log pi_sampler| over the masked tokens: (sum, max, count), to be pooled across batches.

    trainer_logp, sampler_logp, mask: (N, C). An empty mask gives (0.0, 0.0, 0)."""
    keep = mask.bool()
    gap = (trainer_logp.detach().float() - sampler_logp.float()).abs()[keep]  # (M,)
    if gap.numel() == 0:
        return 0.0, 0.0, 0
    return gap.sum().item(), gap.max().item(), gap.numel()


def truncated_importance_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                                 cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """w = min(exp(log pi_train - log pi_sampler), cap) per token, without gradient (TIS, Yao et al. 2025).

    trainer_logp: the trainer's log-probs under the weights that sampled (the "old" log-probs); sampler_logp:
    the engine's. Both (N, C). Returns the weights (N, C) and a bool (N, C) marking where the cap applied."""
    ratio = torch.exp(trainer_logp.detach().float() - sampler_logp.float())  # (N, C)
    capped = ratio > cap
    return ratio.clamp(max=cap), capped
