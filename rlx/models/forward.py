"""Forward passes over (prompt, completion) batches: per-token log-probs of the completion."""

from __future__ import annotations

import torch

from rlx.algorithms.logprobs import token_entropy, token_logprobs


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(completion_t | prompt, completion_<t) for every completion position.

    prompt_*: (N, P) left-padded; completion_*: (N, C). Position ids follow the attention mask, as in
    generation, so the numbers match the sampler's. Returns logp (N, C) and entropy (N, C) or None;
    the entropy carries gradients only with entropy_grad=True (for an entropy bonus)."""
    device = next(model.parameters()).device
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1).to(device)  # (N, P+C)
    attention = torch.cat([prompt_mask, completion_mask], dim=1).to(device)  # (N, P+C)
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)  # (N, P+C)
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False).logits
    prompt_len = prompt_ids.shape[1]
    logits = logits[:, prompt_len - 1 : -1].float()  # (N, C, V): the logits that predict each completion token
    logp = token_logprobs(logits, completion_ids.to(device))  # (N, C)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = token_entropy(logits)  # (N, C)
    return logp, entropy
