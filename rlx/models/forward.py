"""Forward passes over (prompt, completion) batches: per-token log-probs of the completion.

The output projection is applied in chunks of completion tokens (algorithms/logprobs.py), so the
(N, C, V) logits tensor a plain `model(...).logits` builds never exists: with a 150k vocabulary it is
the largest tensor of a training step. Padding positions after each completion's end are skipped.
"""

from __future__ import annotations

import torch

from rlx.algorithms.logprobs import chunked_linear_logprobs, token_entropy, token_logprobs

LOGIT_CHUNK_ELEMENTS = 2**22  # logits materialised at once (chunk_tokens x V floats, 16 MB in float32)


def position_ids_from_mask(attention: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only, so left padding does not shift them. (N, T) -> (N, T)."""
    return (attention.cumsum(dim=1) - 1).clamp(min=0)


def _output_head(model):
    """The output projection when logits are a plain linear map of the last hidden state, else None."""
    inner = getattr(model, "module", model)  # DistributedDataParallel keeps the model in .module
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None  # logits are post-processed (Gemma 2 soft-capping, Cohere scaling): use the plain path
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    return head if isinstance(head, torch.nn.Linear) else None


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    with_entropy: bool = False,
    chunked: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(completion_t | prompt, completion_<t) for every completion position.

    prompt_*: (N, P) left-padded; completion_*: (N, C). Position ids follow the attention mask, as in
    generation, so the numbers match the sampler's. Returns logp (N, C) and entropy (N, C) or None;
    positions where completion_mask is 0 hold 0 when chunked (they carry no loss)."""
    device = next(model.parameters()).device
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1).to(device)  # (N, P+C)
    attention = torch.cat([prompt_mask, completion_mask], dim=1).to(device)  # (N, P+C)
    position_ids = position_ids_from_mask(attention)  # (N, P+C)
    prompt_len = prompt_ids.shape[1]
    targets = completion_ids.to(device)  # (N, C)
    head = _output_head(model) if chunked else None
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False).logits
        logits = logits[:, prompt_len - 1 : -1].float()  # (N, C, V): the logits that predict each completion token
        logp = token_logprobs(logits, targets)  # (N, C)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = token_entropy(logits)  # (N, C)
        return logp, entropy
    # logits_to_keep=1: the model projects only the last position; the rest is done here in chunks
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False,
                output_hidden_states=True, logits_to_keep=1)
    hidden = out.hidden_states[-1][:, prompt_len - 1 : -1]  # (N, C, H) final-norm states predicting each token
    keep = completion_mask.to(device).bool()  # (N, C)
    chunk_tokens = max(1, LOGIT_CHUNK_ELEMENTS // head.weight.shape[0])
    flat_logp, flat_entropy = chunked_linear_logprobs(
        hidden[keep], head.weight, targets[keep], bias=head.bias, chunk_tokens=chunk_tokens, with_entropy=with_entropy
    )  # (M,) over the M real completion tokens
    logp = torch.zeros(keep.shape, dtype=flat_logp.dtype, device=device).masked_scatter(keep, flat_logp)  # (N, C)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(keep.shape, dtype=flat_logp.dtype, device=device).masked_scatter(keep, flat_entropy)
    return logp, entropy
