"""Generation through vLLM on a GPU, colocated with training in the same process.

The engine holds its own copy of the weights: `sync_weights(model)` copies the policy's parameters into
it after every optimizer update (and once at the start), so each rollout samples from the current policy.
Each completion is its own request with its own seed (SamplingParams.seed), which keeps the rlx
contract that completion i depends only on seeds[i]; the G requests of a prompt share its KV cache
through vLLM's prefix caching. The draws are not bitwise those of rollout=hf (another sampler).
Needs `pip install 'rlx[vllm]'` and a CUDA device.
"""

from __future__ import annotations

import os

import torch

from rlx.config import UserError
from rlx.rollout.hf import Rollout, completion_mask_from_ids, eos_ids


class VLLMEngine:
    def __init__(self, model, tokenizer, *, gpu_memory_utilization: float, max_model_len: int | None, dtype: str,
                 enforce_eager: bool, seed: int):
        if not torch.cuda.is_available():
            raise UserError("rollout=vllm needs a CUDA GPU; use rollout=hf on this machine")
        try:
            from vllm import LLM
        except ImportError:
            raise UserError("rollout=vllm needs vLLM: pip install 'rlx[vllm]' (or use rollout=hf)") from None
        # one process, no separate engine core: the weights can then be written in place after each update
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", "29533")):
            os.environ.setdefault(key, value)
        self.tokenizer = tokenizer
        self.stop_ids = eos_ids(model, tokenizer)
        self.llm = LLM(
            model=model.name_or_path, tokenizer=model.name_or_path, dtype=dtype, seed=seed,
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, enable_prefix_caching=True,
            enforce_eager=enforce_eager, distributed_executor_backend="external_launcher",
        )

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Copy the policy's current parameters into the engine and drop KV blocks cached for the old ones."""
        runner_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        runner_model.load_weights((name, param.data) for name, param in model.named_parameters())
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[str], *, samples_per_prompt: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, greedy: bool = False, seeds: list[int] | None = None,
                 min_new_tokens: int = 0, **_unused) -> Rollout:
        """Same contract as rollout.hf.generate: G adjacent completions per prompt."""
        from vllm import SamplingParams

        group = samples_per_prompt
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        unique_ids, unique_mask = enc["input_ids"], enc["attention_mask"]  # (B, P) left-padded
        num_rows = len(prompts) * group
        if seeds is None:
            seeds = torch.randint(0, 2**31 - 1, (num_rows,)).tolist()
        requests, params = [], []
        for row in range(num_rows):
            ids = unique_ids[row // group][unique_mask[row // group].bool()].tolist()
            requests.append({"prompt_token_ids": ids})
            params.append(SamplingParams(
                n=1, max_tokens=max_new_tokens, min_tokens=min_new_tokens, seed=None if greedy else int(seeds[row]),
                temperature=0.0 if greedy else temperature, top_p=top_p, top_k=top_k if top_k > 0 else -1,
                stop_token_ids=self.stop_ids, detokenize=False,
            ))
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        width = max((len(o.outputs[0].token_ids) for o in outputs), default=0)
        completion_ids = torch.full((num_rows, width), tok.pad_token_id, dtype=torch.long)  # (N, C)
        for row, out in enumerate(outputs):
            tokens = list(out.outputs[0].token_ids)
            completion_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        completion_mask, truncated = completion_mask_from_ids(completion_ids, self.stop_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id)
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        prompt_ids = unique_ids.repeat_interleave(group, dim=0)  # (N, P)
        prompt_mask = unique_mask.repeat_interleave(group, dim=0)  # (N, P)
        return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, texts)


def build_engine(rollout_cfg, model, tokenizer, seed: int) -> VLLMEngine | None:
    """The vLLM engine when rollout.backend is vllm, None for hf (generation with the policy itself)."""
    backend = rollout_cfg.backend
    if backend == "hf":
        return None
    if backend != "vllm":
        raise UserError(f"unknown rollout.backend '{backend}'; valid choices: hf, vllm")
    if getattr(model, "name_or_path", None) in (None, ""):
        raise UserError("rollout=vllm loads the model from model.path; a model built from scratch needs rollout=hf")
    engine = VLLMEngine(model, tokenizer, gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
                        max_model_len=rollout_cfg.max_model_len, dtype=rollout_cfg.dtype,
                        enforce_eager=rollout_cfg.enforce_eager, seed=seed)
    engine.sync_weights(model)
    return engine
