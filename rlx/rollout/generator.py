"""The generator protocol: token ids in, sampled token ids and their sampling log-probs out.

Multi-turn rollouts (rollout/env.py) hand the generator the exact token ids of the conversation so
far, so nothing the model sampled is ever re-tokenized. `HFGenerator` implements it on a transformers
model through rlx.rollout.hf.generate (seeded per row, KV-cached decoding); a vLLM engine fits the
same protocol by passing prompt_token_ids and reading its logprobs.

Single-turn sampling (rollout/batch.py: the policy-gradient and PPO loops) is the one-turn case:
`sample_rollout` tokenizes the rendered prompts once, asks the generator for G adjacent samples of
each (samples_per_prompt, the prompt encoded once for its group) and builds the padded Rollout from
the returned ids. Through HFGenerator it draws exactly what rlx.rollout.hf.generate draws on the
same prompts and seeds (tests/test_sampling.py checks it token for token).
"""

from __future__ import annotations

from typing import Protocol

import torch

from rlx.models.forward import position_ids_from_mask
from rlx.rollout.hf import Rollout, eos_ids, generate
from rlx.rollout.types import Generation


class Generator(Protocol):
    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                     greedy: bool = False, samples_per_prompt: int = 1, min_new_tokens: int = 0) -> Generation:
        """len(prompts) * samples_per_prompt rows, the samples of a prompt adjacent; seeds one per row."""
        ...


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
    (before top-k / top-p filtering). logprobs=True: recomputed by one forward pass over prompt + sample;
    "sampler": the decoder's own, taken while sampling (rollout/hf.py generate(logprobs=True); no extra
    pass; the single-turn loops compare them with their forward: rollout/logprob_gap_*); False: none
    (Generation.logprobs is None)."""

    def __init__(self, model, tokenizer, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 batch_size: int = 256, logprobs: bool | str = True, sampler: str = "v2", onednn: bool = False):
        if logprobs not in (True, False, "sampler"):
            raise ValueError(f"logprobs must be True, False or 'sampler', got {logprobs!r}")
        self.model, self.tokenizer, self.sampler, self.onednn = model, tokenizer, sampler, onednn
        self.temperature, self.top_p, self.top_k, self.batch_size = temperature, top_p, top_k, batch_size
        self.with_logprobs = logprobs

    @torch.no_grad()
    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                     greedy: bool = False, samples_per_prompt: int = 1, min_new_tokens: int = 0) -> Generation:
        shim = _IdsTokenizer(self.tokenizer, prompts)
        out = generate(self.model, shim, [str(i) for i in range(len(prompts))], samples_per_prompt=samples_per_prompt,
                       max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       greedy=greedy, batch_size=self.batch_size, seeds=seeds, min_new_tokens=min_new_tokens,
                       sampler=self.sampler, onednn=self.onednn, logprobs=self.with_logprobs == "sampler")
        lengths = out.completion_mask.sum(dim=1).tolist()
        ids = [out.completion_ids[i, :n].tolist() for i, n in enumerate(lengths)]
        logprobs = None
        if out.logprobs is not None:
            logprobs = [out.logprobs[i, :n].tolist() for i, n in enumerate(lengths)]
        elif self.with_logprobs:
            full = self._logprobs(out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
            logprobs = [full[i, :n].tolist() for i, n in enumerate(lengths)]
        stops = set(eos_ids(self.model, self.tokenizer))
        return Generation(ids, logprobs, [bool(r) and r[-1] in stops for r in ids])

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


def policy_generator(model, tokenizer, roll, *, logprobs: bool | str = True) -> HFGenerator:
    """The policy as its own generator (rollout=hf), with rollout's sampling settings: temperature, top-p/top-k,
    batch size, the draw version (rollout.sampler; a config from before sampler versions drew with v1) and the
    oneDNN decode step (rollout.onednn_decode)."""
    from rlx.rollout.sampling import LEGACY_SAMPLER

    return HFGenerator(model, tokenizer, temperature=roll.temperature, top_p=roll.top_p, top_k=roll.top_k,
                       batch_size=roll.batch_size, logprobs=logprobs, sampler=roll.get("sampler", LEGACY_SAMPLER),
                       onednn=roll.get("onednn_decode", False))


def sample_rollout(generator: Generator, tokenizer, prompts: list[str], *, samples_per_prompt: int, max_new_tokens: int,
                   seeds: list[int], greedy: bool = False, min_new_tokens: int = 0) -> Rollout:
    """Single-turn sampling through the generator protocol: rendered prompts are tokenized once (no special
    tokens added: the chat template has them), G = samples_per_prompt adjacent completions of each are drawn
    as token ids, and the padded Rollout is built from those ids: prompts left-padded (N, P), completions
    right-padded (N, C) to the longest one, mask 1 up to and including the stop token, truncated where no
    stop token ended the row, texts decoded without special tokens, the sampler's log-probs (N, C) when the
    generator returns them (vLLM; 0 on padding), else None."""
    group = samples_per_prompt
    pad = tokenizer.pad_token_id
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]  # B lists of ids
    out = generator.generate_ids(prompt_ids, samples_per_prompt=group, max_new_tokens=max_new_tokens, seeds=seeds,
                                 greedy=greedy, min_new_tokens=min_new_tokens)
    rows = len(prompts) * group
    width_p = max((len(p) for p in prompt_ids), default=0)
    width_c = max((len(c) for c in out.ids), default=0)
    p_ids = torch.full((rows, width_p), pad, dtype=torch.long)  # (N, P)
    p_mask = torch.zeros((rows, width_p), dtype=torch.long)  # (N, P)
    c_ids = torch.full((rows, width_c), pad, dtype=torch.long)  # (N, C)
    c_mask = torch.zeros((rows, width_c), dtype=torch.long)  # (N, C)
    logprobs = torch.zeros((rows, width_c)) if out.logprobs is not None else None  # (N, C)
    for row in range(rows):
        ids, sampled = prompt_ids[row // group], out.ids[row]
        if ids:
            p_ids[row, width_p - len(ids):] = torch.tensor(ids, dtype=torch.long)
            p_mask[row, width_p - len(ids):] = 1
        if sampled:
            c_ids[row, : len(sampled)] = torch.tensor(sampled, dtype=torch.long)
            c_mask[row, : len(sampled)] = 1
            if logprobs is not None:
                logprobs[row, : len(sampled)] = torch.tensor(out.logprobs[row], dtype=torch.float32)
    truncated = torch.tensor([not s for s in out.stopped], dtype=torch.bool)  # (N,)
    texts = tokenizer.batch_decode(c_ids, skip_special_tokens=True)
    return Rollout(p_ids, p_mask, c_ids, c_mask, truncated, texts, logprobs)
