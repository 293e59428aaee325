"""Generation with a transformers model: prompts in, token ids, masks and texts out."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from rlx.rollout.sampling import SeededSampler


@dataclass
class Rollout:
    prompt_ids: torch.Tensor        # (N, P) left-padded
    prompt_mask: torch.Tensor       # (N, P) 1 on prompt tokens
    completion_ids: torch.Tensor    # (N, C) right-padded
    completion_mask: torch.Tensor   # (N, C) 1 on generated tokens up to and including the first EOS
    truncated: torch.Tensor         # (N,) bool: no EOS within the budget
    texts: list[str]                # decoded completions (special tokens removed)

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)  # (N,)


def eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = ids if ids is not None else tokenizer.eos_token_id
    ids = ids if isinstance(ids, list) else [ids]
    return [i for i in ids if i is not None]


def completion_mask_from_ids(completion_ids: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask (N, C) of tokens up to and including the first stop token, and truncated (N,) flags."""
    is_stop = torch.zeros_like(completion_ids, dtype=torch.bool)
    for stop in stop_ids:
        is_stop |= completion_ids == stop
    seen_before = (is_stop.cumsum(dim=1) - is_stop.long()) > 0  # a stop token strictly earlier
    mask = (~seen_before).long()  # (N, C)
    truncated = ~is_stop.any(dim=1)
    return mask, truncated


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    greedy: bool = False,
    batch_size: int = 256,
    seeds: list[int] | None = None,
) -> Rollout:
    """G completions for each prompt, ordered prompt by prompt (the G samples of a prompt are adjacent).

    Sampling is seeded per completion (rollout/sampling.py): completion i depends only on seeds[i], so
    chunking or sharding the batch does not change what is drawn. Without seeds, they are drawn from
    the global torch generator."""
    device = next(model.parameters()).device
    stop_ids = eos_ids(model, tokenizer)
    was_training = model.training
    model.eval()
    repeated = [p for p in prompts for _ in range(samples_per_prompt)]
    enc = tokenizer(repeated, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]  # (N, P)
    if seeds is None:
        seeds = torch.randint(0, 2**31 - 1, (len(repeated),)).tolist()
    if len(seeds) != len(repeated):
        raise ValueError(f"{len(seeds)} seeds for {len(repeated)} completions")
    seed_tensor = torch.tensor(seeds, dtype=torch.int64)  # (N,)
    chunks = []
    for start in range(0, len(repeated), batch_size):
        ids = prompt_ids[start : start + batch_size].to(device)
        attn = prompt_mask[start : start + batch_size].to(device)
        kwargs = {}
        if not greedy:
            sampler = SeededSampler(seed_tensor[start : start + batch_size], ids.shape[1], temperature, top_k, top_p)
            kwargs["logits_processor"] = LogitsProcessorList([sampler])
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=max_new_tokens,
            eos_token_id=stop_ids,
            pad_token_id=tokenizer.pad_token_id,
            use_cache=True,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            **kwargs,
        )
        chunks.append(out[:, ids.shape[1] :].cpu())
    width = max(c.shape[1] for c in chunks)
    completion_ids = torch.full((len(repeated), width), tokenizer.pad_token_id, dtype=torch.long)  # (N, C)
    row = 0
    for chunk in chunks:
        completion_ids[row : row + chunk.shape[0], : chunk.shape[1]] = chunk
        row += chunk.shape[0]
    completion_mask, truncated = completion_mask_from_ids(completion_ids, stop_ids)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if was_training:
        model.train()
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, texts)
