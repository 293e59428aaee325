"""The generator protocol: token ids in, sampled token ids and their sampling log-probs out.

Multi-turn rollouts (rollout/env.py) hand the generator the exact token ids of the conversation so
far, so nothing the model sampled is ever re-tokenized. `HFGenerator` implements it on a transformers
model through rlx.rollout.hf.generate (seeded per row, KV-cached decoding); a vLLM engine fits the
same protocol by passing prompt_token_ids and reading its logprobs.
"""

from __future__ import annotations

from typing import Protocol

import torch

from rlx.models.forward import position_ids_from_mask
from rlx.rollout.hf import eos_ids, generate
from rlx.rollout.types import Generation


class Generator(Protocol):
    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                     greedy: bool = False) -> Generation: ...


class _IdsTokenizer:
    """Stands in for the tokenizer inside rlx.rollout.hf.generate: its "prompts" are keys of token-id
    lists given here, which it left-pads instead of encoding text (so ids go in unchanged)."""

    def __init__(self, tokenizer, prompts: list[list[int]]):
        self._tokenizer, self._prompts = tokenizer, prompts
        self.pad_token_id, self.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id

    def __call__(self, keys, **_):
        rows = [self._prompts[int(k)] for k in keys]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def batch_decode(self, ids, **kwargs):
        return self._tokenizer.batch_decode(ids, **kwargs)


class HFGenerator:
    """Generator on a transformers model. Log-probs are those of the temperature-scaled distribution
    (before top-k / top-p filtering), recomputed by one forward pass over prompt + sample."""

    def __init__(self, model, tokenizer, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 batch_size: int = 256, sampler: str = "v2"):
        self.model, self.tokenizer, self.sampler = model, tokenizer, sampler
        self.temperature, self.top_p, self.top_k, self.batch_size = temperature, top_p, top_k, batch_size

    @torch.no_grad()
    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                     greedy: bool = False) -> Generation:
        shim = _IdsTokenizer(self.tokenizer, prompts)
        out = generate(self.model, shim, [str(i) for i in range(len(prompts))], samples_per_prompt=1,
                       max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       greedy=greedy, batch_size=self.batch_size, seeds=seeds, sampler=self.sampler)
        lengths = out.completion_mask.sum(dim=1).tolist()
        ids = [out.completion_ids[i, :n].tolist() for i, n in enumerate(lengths)]
        logprobs = self._logprobs(out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
        stops = set(eos_ids(self.model, self.tokenizer))
        return Generation(ids, [logprobs[i, :n].tolist() for i, n in enumerate(lengths)],
                          [bool(r) and r[-1] in stops for r in ids])

    def _logprobs(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        """(N, C) log softmax(logits / temperature) of the sampled ids (0 after each row's end)."""
        if completion_ids.shape[1] == 0:
            return torch.zeros(completion_ids.shape)
        device = next(self.model.parameters()).device
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1).to(device)
        attention = torch.cat([prompt_mask, completion_mask], dim=1).to(device)
        was_training = self.model.training
        self.model.eval()
        logits = self.model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids_from_mask(attention),
                            use_cache=False).logits[:, prompt_ids.shape[1] - 1 : -1].float()  # (N, C, V)
        if was_training:
            self.model.train()
        temperature = 1.0 if self.temperature <= 0 else self.temperature
        logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, completion_ids.to(device).unsqueeze(-1))
        return (logp.squeeze(-1) * completion_mask.to(device)).cpu()
