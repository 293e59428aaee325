"""Forward passes over (prompt, completion) batches: per-token log-probs of the completion.

The output projection is applied in chunks of completion tokens (algorithms/logprobs.py), so the
(N, C, V) logits tensor a plain `model(...).logits` builds never exists: with a 150k vocabulary it is
the largest tensor of a training step. Padding positions after each completion's end are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from rlx.algorithms.logprobs import chunked_linear_logprobs, token_entropy, token_logprobs
from rlx.runtime.parallel import is_sharded

LOGIT_CHUNK_ELEMENTS = 2**24  # logits materialised at once (chunk_tokens x V floats, 64 MB in float32; each chunk
# reads the whole head again: at V = 151,936, 2**22 elements (27 tokens) made the head 1.45x slower)


@dataclass(frozen=True)
class LogprobSettings:
    """How completion_logprobs computes its outputs: whether the entropy carries gradients, and the
    chunking, trimming and packing knobs.

    entropy_grad: the entropy carries gradients (an entropy bonus); chunked: the output head runs chunk by
    chunk when it is a plain linear map (never the full (N, C, V) logits); trim: columns that are padding in
    every row are not computed (trim_padding); pack: the rows' real tokens run as one packed sequence
    without padding (_packed_hidden)."""

    entropy_grad: bool = False
    chunked: bool = True
    trim: bool = True
    pack: bool = False


def position_ids_from_mask(attention: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only, so left padding does not shift them. (N, T) -> (N, T)."""
    return (attention.cumsum(dim=1) - 1).clamp(min=0)


def _output_head(model):
    """The output projection when logits are a plain linear map of the last hidden state, else None."""
    inner = getattr(model, "module", model)  # DistributedDataParallel keeps the model in .module
    if is_sharded(inner):  # ZeRO-3 / FSDP2: the head's weight is a shard; only its module forward gathers it
        return None
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None  # logits are post-processed (Gemma 2 soft-capping, Cohere scaling): use the plain path
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    return head if isinstance(head, torch.nn.Linear) else None


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of identical consecutive prompts (the G samples of a prompt are adjacent in a rollout).

    Returns the first row of each run (R,) and the run index of every row (N,)."""
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(dim=1) & (prompt_mask[1:] == prompt_mask[:-1]).all(dim=1)  # (N-1,)
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=same.device), ~same])  # (N,)
    return starts.nonzero().squeeze(1), starts.long().cumsum(0) - 1


def _can_share_prompts(model) -> bool:
    """Two forward calls per backward is safe for a plain module, not through a DDP wrapper or with
    activation checkpointing (which turns the KV cache off)."""
    if hasattr(model, "module"):
        return False
    model = getattr(model, "policy", model)  # a LoRA reference (models/lora.AdapterDisabled) runs its policy
    return (not getattr(model, "is_activation_checkpointing", False)
            and not getattr(model, "_rlx_no_prompt_sharing", False))


def _shared_prompt_hidden(model, prompt_ids, prompt_mask, completion_ids, attention, position_ids, first, group_of_row):
    """Final hidden states (N, C, H) predicting each completion token, encoding each distinct prompt once.

    The prompt runs with its KV cache on, the cache rows are copied to every completion of the prompt
    (an index, so gradients flow back into the shared prompt pass), and the completions run on top of it:
    the same numbers as one pass over (prompt, completion), with the prompt tokens computed R instead
    of N times."""
    from transformers import DynamicCache

    device = attention.device
    prompt_len = prompt_ids.shape[1]
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids[first], attention_mask=prompt_mask[first],
                position_ids=position_ids[first, :prompt_len],
                past_key_values=cache, use_cache=True, output_hidden_states=True, logits_to_keep=1)
    first_hidden = out.hidden_states[-1][:, -1][group_of_row]  # (N, H): predicts completion token 0
    cache = out.past_key_values
    cache.batch_select_indices(group_of_row)  # (R, ...) -> (N, ...)
    out = model(input_ids=completion_ids, attention_mask=attention, position_ids=position_ids[:, prompt_len:],
                past_key_values=cache, use_cache=True, output_hidden_states=True, logits_to_keep=1)
    return torch.cat([first_hidden.unsqueeze(1), out.hidden_states[-1][:, :-1]], dim=1)  # (N, C, H)


def trim_padding(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                 completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the columns that are padding in every row: leading prompt columns (prompts are left-padded) and
    trailing completion columns (completions are right-padded). A micro-batch cut from a larger batch keeps
    the batch's widths; its own are often much shorter (natural-length completions, mixed prompt lengths).
    Position ids follow the attention mask and padded positions attend to nothing, so the log-probs of the
    real tokens are unchanged. Returns the four tensors trimmed: (N, P'), (N, P'), (N, C'), (N, C')."""
    used_prompt = prompt_mask.bool().any(dim=0)  # (P,)
    start = int(used_prompt.int().argmax()) if bool(used_prompt.any()) else prompt_mask.shape[1] - 1
    start = min(start, prompt_mask.shape[1] - 1)  # keep at least one prompt column (it predicts the first token)
    used_completion = completion_mask.bool().any(dim=0)  # (C,)
    width = int(used_completion.nonzero().max()) + 1 if bool(used_completion.any()) else 1
    return prompt_ids[:, start:], prompt_mask[:, start:], completion_ids[:, :width], completion_mask[:, :width]


def _packed_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask, device) -> torch.Tensor:
    """Final hidden states (M, H) predicting each of the M real completion tokens (row-major order), from ONE
    sequence holding every row's real tokens back to back (padding-free packing).

    Row i's prompt and completion tokens (p_i + c_i of them) follow row i-1's, with position ids restarting
    at 0 for each row. transformers (masking_utils.find_packed_sequence_indices) reads the restarts as
    sequence boundaries when no attention mask is passed: flash-attention kernels get the sequence
    lengths, sdpa and eager a block-diagonal causal mask, so no token attends across rows. Cost: one
    sequence of sum_i (p_i + c_i) tokens instead of N x (max p + max c), and attention within rows only;
    each row encodes its own prompt (no shared-prompt pass)."""
    input_ids, position_ids, predictor = pack_rows(prompt_ids, prompt_mask, completion_ids, completion_mask, device)
    out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False,
                output_hidden_states=True, logits_to_keep=1)
    return out.hidden_states[-1][0][predictor]  # (M, H)


def pack_rows(prompt_ids, prompt_mask, completion_ids, completion_mask, device):
    """The packed sequence of _packed_hidden: input ids (1, L) and position ids (1, L) of every row's real
    tokens back to back (positions restarting at 0 per row), and predictor (M,): the index in it of the token
    before each real completion token, row-major (the hidden state there predicts that token)."""
    tokens = torch.cat([prompt_ids, completion_ids], dim=1).to(device)  # (N, P+C)
    real = torch.cat([prompt_mask, completion_mask], dim=1).to(device).bool()  # (N, P+C)
    positions = position_ids_from_mask(real.long())  # (N, P+C): 0.. within each row's real tokens
    flat_index = real.flatten().long().cumsum(0).view(real.shape) - 1  # (N, P+C): index in the packed sequence
    keep = completion_mask.to(device).bool()  # (N, C)
    predictor = flat_index[:, prompt_ids.shape[1] :][keep] - 1  # (M,)
    return tokens[real].unsqueeze(0), positions[real].unsqueeze(0), predictor


def _pad_columns(values: torch.Tensor | None, width: int) -> torch.Tensor | None:
    """(N, c) -> (N, width) with zeros on the right (positions that carry no loss)."""
    if values is None or values.shape[1] == width:
        return values
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def _full_logits_logprobs(model, inputs: tuple, prompt_len: int, targets: torch.Tensor,
                          temperature: float | torch.Tensor, with_entropy: bool, entropy_grad: bool):
    """completion_logprobs through the model's full logits (N, C, V) (no plain linear head to chunk, or a
    per-token temperature with a biased head); inputs: (input ids, attention mask, position ids) (N, P+C)."""
    input_ids, attention, position_ids = inputs
    device = input_ids.device
    per_token = isinstance(temperature, torch.Tensor)
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False).logits
    scale = temperature.to(device).unsqueeze(-1) if per_token else temperature  # (N, C, 1) or a number
    logits = logits[:, prompt_len - 1 : -1].float() / scale  # (N, C, V): tempered logits of each completion token
    logp = token_logprobs(logits, targets)  # (N, C)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = token_entropy(logits)  # (N, C)
    return logp, entropy


def _completion_hidden(model, rows: tuple, inputs: tuple, pack: bool, device) -> torch.Tensor:
    """The final-norm hidden states predicting each completion token: (M, H) over the real tokens when packed or
    shared, else (N, C, H). rows: (prompt ids, prompt mask, completion ids, completion mask); inputs: (input ids,
    attention mask, position ids) of the padded rows, on `device`."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = rows
    input_ids, attention, position_ids = inputs
    first, group_of_row = prompt_groups(prompt_ids, prompt_mask)
    if pack and not hasattr(model, "module"):
        return _packed_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask, device)  # (M, H)
    if len(first) < len(group_of_row) and _can_share_prompts(model):
        return _shared_prompt_hidden(model, prompt_ids, prompt_mask, completion_ids.to(device), attention,
                                     position_ids, first.to(device), group_of_row.to(device))
    # logits_to_keep=1: the model projects only the last position; the rest is done here in chunks
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False,
                output_hidden_states=True, logits_to_keep=1)
    return out.hidden_states[-1][:, prompt_ids.shape[1] - 1 : -1]  # (N, C, H)


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    with_entropy: bool = False,
    temperature: float | torch.Tensor = 1.0,
    settings: LogprobSettings = LogprobSettings(),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi_T(completion_t | prompt, completion_<t) for every completion position, where
    pi_T = softmax(logits / T) is the distribution the sampler drew from at temperature T (the log-probs
    of the loss, the importance ratio, the KL and the entropy all refer to it, as in the PPO/GRPO
    implementations of TRL and verl; T = 1 for SFT and preference losses). temperature may be an (N, C) tensor:
    a temperature per completion token (rollout.temperature_schedule, EAD).

    prompt_*: (N, P) left-padded; completion_*: (N, C). Position ids follow the attention mask, as in
    generation, so the numbers match the sampler's. Returns logp (N, C) and entropy (N, C) or None;
    positions where completion_mask is 0 hold 0 when chunked (they carry no loss). settings (LogprobSettings):
    the entropy carries gradients only with settings.entropy_grad=True (an entropy bonus); both paths compute it
    chunk by chunk when settings.chunked and the output head is a plain linear map (never the full (N, C, V)
    logits). settings.trim: columns that are padding in every row are not computed (trim_padding); the outputs
    keep the input's width C. settings.pack: the rows' real tokens run as one packed sequence without padding
    (_packed_hidden; every prompt needs >= 1 token), when the head is a plain linear map and the model is not
    wrapped (DDP) or sharded; otherwise the padded path."""
    per_token = isinstance(temperature, torch.Tensor)  # (N, C): a temperature per completion token (EAD)
    if (temperature <= 0).any() if per_token else temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    full_width = completion_ids.shape[1]
    if settings.trim:
        prompt_ids, prompt_mask, completion_ids, completion_mask = trim_padding(
            prompt_ids, prompt_mask, completion_ids, completion_mask)
        if per_token:
            temperature = temperature[:, : completion_ids.shape[1]]
        logp, entropy = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                            with_entropy, temperature, replace(settings, trim=False))
        return _pad_columns(logp, full_width), _pad_columns(entropy, full_width)
    device = next(model.parameters()).device
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1).to(device)  # (N, P+C)
    attention = torch.cat([prompt_mask, completion_mask], dim=1).to(device)  # (N, P+C)
    position_ids = position_ids_from_mask(attention)  # (N, P+C)
    prompt_len = prompt_ids.shape[1]
    targets = completion_ids.to(device)  # (N, C)
    head = _output_head(model) if settings.chunked else None
    if per_token and head is not None and head.bias is not None:
        head = None  # z / tau_t = (h / tau_t) W^T only without a bias: take the plain path
    if head is None:
        return _full_logits_logprobs(model, (input_ids, attention, position_ids), prompt_len, targets, temperature,
                                     with_entropy, settings.entropy_grad)
    keep = completion_mask.to(device).bool()  # (N, C)
    hidden = _completion_hidden(model, (prompt_ids, prompt_mask, completion_ids, completion_mask),
                                (input_ids, attention, position_ids), settings.pack, device)
    if hidden.dim() == 3:
        hidden = hidden[keep]  # (M, H)
    if per_token:  # softmax(h W^T / tau_t) = softmax((h / tau_t) W^T): the head then runs at temperature 1
        hidden = hidden / temperature.to(device)[keep].unsqueeze(-1).to(hidden.dtype)
        temperature = 1.0
    chunk_tokens = max(1, LOGIT_CHUNK_ELEMENTS // head.weight.shape[0])
    flat_logp, flat_entropy = chunked_linear_logprobs(
        hidden, head.weight, targets[keep], bias=head.bias, chunk_tokens=chunk_tokens, with_entropy=with_entropy,
        temperature=temperature,
    )  # (M,) over the M real completion tokens
    if flat_entropy is not None and not (settings.entropy_grad and torch.is_grad_enabled()):
        flat_entropy = flat_entropy.detach()
    logp = torch.zeros(keep.shape, dtype=flat_logp.dtype, device=device).masked_scatter(keep, flat_logp)  # (N, C)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(keep.shape, dtype=flat_logp.dtype, device=device).masked_scatter(keep, flat_entropy)
    return logp, entropy
