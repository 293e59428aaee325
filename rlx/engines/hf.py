"""Generation with a transformers model: prompts in, token ids, masks and texts out."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlx.algorithms.logprobs import token_logprobs
from rlx.engines.fast_decode import decode_step_for
from rlx.engines.records import Rollout
from rlx.engines.sampling import ONEDNN_DECODE, sample_tokens
from rlx.models.forward import position_ids_from_mask
from rlx.runtime.parallel import is_sharded


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


class PreallocatedLayer(DynamicLayer):
    """A full-attention KV layer that writes into a buffer with room for `extra` more positions.

    DynamicLayer grows by torch.cat, copying the whole cache at every generated token (quadratic in
    the completion length); here each token is one in-place write, and `keys`/`values` are views."""

    def __init__(self, extra: int):
        super().__init__()
        self.extra = extra
        self.length = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            rows, heads, steps, _ = key_states.shape
            self.key_buffer = key_states.new_empty(rows, heads, steps + self.extra, key_states.shape[-1])
            self.value_buffer = value_states.new_empty(rows, heads, steps + self.extra, value_states.shape[-1])
        steps = key_states.shape[-2]
        if self.length + steps > self.key_buffer.shape[-2]:  # out of room: fall back to growing
            grow = max(steps, self.extra)
            self.key_buffer = _extend(self.key_buffer, grow)
            self.value_buffer = _extend(self.value_buffer, grow)
        self.key_buffer[:, :, self.length : self.length + steps] = key_states
        self.value_buffer[:, :, self.length : self.length + steps] = value_states
        self.length += steps
        self._refresh()
        return self.keys, self.values

    def _refresh(self):
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
            self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
            self._refresh()

    def batch_select_indices(self, indices) -> None:
        if self.length:
            self.key_buffer = self.key_buffer[indices]
            self.value_buffer = self.value_buffer[indices]
            self._refresh()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("rlx's generation cache is never cropped")


def _extend(buffer: torch.Tensor, positions: int) -> torch.Tensor:
    """buffer (n, h, T, d) with `positions` more (uninitialised) slots along T."""
    return torch.cat([buffer, buffer.new_empty(*buffer.shape[:2], positions, buffer.shape[-1])], dim=-2)


def generation_cache(model, new_tokens: int) -> DynamicCache:
    """A DynamicCache whose full-attention layers are preallocated for `new_tokens` more positions."""
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(new_tokens) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@dataclass(frozen=True)
class Decoding:
    """How rlx's decoder samples (`generate`, `generate_tokens`): `samples_per_prompt` completions of at most
    `max_new_tokens` tokens for each prompt, drawn at `temperature` with top-p / top-k filtering (or greedily),
    no stop token before `min_new_tokens`, `batch_size` rows decoded at a time; `sampler`: the draw's version
    (engines/sampling.py SAMPLERS); `onednn`: the decode step's projections through oneDNN; `logprobs`: keep the
    decoder's log-prob of each sampled token; `schedule`: a temperature per completion position."""

    samples_per_prompt: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    batch_size: int = 256
    min_new_tokens: int = 0
    sampler: str = "v2"
    onednn: bool = False
    logprobs: bool = False
    schedule: list[float] | None = None
    segment: int | None = None  # at most this many token steps per row (a round of rollout.segment_tokens)
    shared_prefix: int = 0  # the first columns of every prompt are the same tokens (prefix_pad): encoded once per chunk
    quantize: str = "none"  # the decode step's weights: none (as the model's) | int8 (fast_decode.py)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, seeds: list[int] | None = None, **decoding) -> Rollout:
    """G completions for each prompt, ordered prompt by prompt (the G samples of a prompt are adjacent).

    decoding: the fields of Decoding by keyword (samples_per_prompt and max_new_tokens required; temperature,
    top_p, top_k, greedy, batch_size, min_new_tokens, sampler, onednn, logprobs, schedule).
    Sampling is seeded per completion (engines/sampling.py): completion i depends only on seeds[i], so
    chunking or sharding the batch does not change what is drawn. Without seeds, they are drawn from
    the global torch generator. Each prompt is encoded once and its KV cache copied to its G samples;
    rows that emitted a stop token leave the batch, and generation ends when every row has stopped.
    min_new_tokens > 0 forbids the stop tokens before that many tokens (fixed-length benchmarks).
    sampler: the draw's version (engines/sampling.py SAMPLERS; training passes rollout.sampler); v3 decodes through
    oneDNN as onednn=True does.
    onednn: the decode step's projections through oneDNN on the CPU (rollout.onednn_decode; fast_decode.py).
    logprobs: also return the decoder's log-prob of each sampled token, log softmax(z / T) of the logits z
    the token was drawn from (T <= 0 read as 1), before min_new_tokens' stop mask and top-k / top-p (the
    distribution the trainer's log-probs refer to, rlx/models/forward.py), as Rollout.logprobs: the loops
    compare it with the trainer's forward (rollout/logprob_gap_*). One logsumexp over the vocabulary per
    row and token step.
    A sharded model (ZeRO-3, FSDP2) gathers its weights in every forward pass, a collective: there no
    row leaves the batch early and every process keeps stepping until all processes' rows have stopped
    (`lockstep`), so each runs the same forward passes; each process must then pass as many prompts."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return generate_tokens(model, tokenizer, enc["input_ids"], enc["attention_mask"], Decoding(**decoding), seeds=seeds)


@dataclass(frozen=True)
class Continued:
    """Rows that go on from their completion so far (partial rollouts; samples_per_prompt 1): `positions`, row i's
    first completion position (its prefix's length, the prefix already at the end of its prompt); `source`
    (optional), row i continues unique prompt source[i], so rows that share a prompt and prefix have it encoded
    once (None: row i continues prompt i)."""

    positions: list[int]
    source: list[int] | None = None


@dataclass(frozen=True)
class _DecodeRun:
    """The rules one generate_tokens call decodes every chunk by: its Decoding, the stop and pad tokens, and
    whether rows decode in lockstep (a sharded model: no row leaves the batch early)."""

    decoding: Decoding
    stop_ids: list[int]
    pad_id: int
    lockstep: bool


@torch.no_grad()
def generate_tokens(model, tokenizer, unique_ids: torch.Tensor, unique_mask: torch.Tensor, decoding: Decoding, *,
                    seeds: list[int] | None = None, continued: Continued | None = None, stop_when=None) -> Rollout:
    """`generate` on prompts given as left-padded token ids (B, P) and their mask (B, P); the tokenizer only
    names the pad and stop tokens and decodes the texts.

    Continuation (`continued`, Continued, samples_per_prompt 1): row i's "prompt" ends with the first
    continued.positions[i] tokens of its completion, already sampled; the decoder draws token t of the completion
    (t >= start) from (seeds[i], position t), forbids the stop tokens while t < min_new_tokens and stops the row
    at max_new_tokens completion tokens in all: the new tokens are those an uninterrupted row would have drawn
    next (the logits of the prefix come from a prefill instead of decode steps, equal up to float rounding).
    The Rollout then holds the NEW tokens only. stop_when(finished (N,) bool: rows that emitted a stop token or
    reached their budget) is called after every token step; True ends generation there, and the rows still
    going come back as far as they got (no stop token, shorter than their budget).

    decoding.schedule: a temperature per completion position (rollout.temperature_schedule,
    rlx/rollout/stages/temperature.py; at least max_new_tokens values): token t is drawn at schedule[t] instead of
    `temperature`, and its recorded log-prob is log softmax(z / schedule[t]). Not with continuation (the config
    refuses partial rollouts with a schedule: a continued row's positions differ per row).

    continued.source: row i continues unique_ids[source[i]], so rows that share a prompt and prefix (a fresh group's G
    rows) have it encoded once and its KV cache copied to each, as a group's prompt is; all rows then decode as one
    batch (at most decoding.batch_size)."""
    d = decoding
    start_positions = continued.positions if continued is not None else None
    source = continued.source if continued is not None else None
    if d.schedule is not None and len(d.schedule) < d.max_new_tokens:
        raise ValueError(f"a temperature schedule of {len(d.schedule)} positions for {d.max_new_tokens} new tokens")
    if d.schedule is not None and start_positions is not None:
        raise ValueError("a temperature schedule with continued rows (start_positions): not supported")
    lockstep = is_sharded(model) and torch.distributed.is_available() and torch.distributed.is_initialized()
    run = _DecodeRun(d, eos_ids(model, tokenizer), tokenizer.pad_token_id, lockstep)
    was_training = model.training
    model.eval()
    group = d.samples_per_prompt
    num_rows = unique_ids.shape[0] * group if source is None else len(source)
    if source is not None and (group != 1 or num_rows > d.batch_size):
        raise ValueError(f"source: samples_per_prompt 1 and at most batch_size ({d.batch_size}) rows, got {num_rows}")
    if seeds is None:
        seeds = torch.randint(0, 2**31 - 1, (num_rows,)).tolist()
    if len(seeds) != num_rows:
        raise ValueError(f"{len(seeds)} seeds for {num_rows} completions")
    starts = None
    if (start_positions is not None or stop_when is not None) and lockstep:
        raise ValueError("continuing rows or stopping early needs a model that is not sharded")
    if start_positions is not None:
        if (group != 1 or len(start_positions) != num_rows
            or any(not 0 <= p < d.max_new_tokens for p in start_positions)):
            raise ValueError("start_positions: one per row (samples_per_prompt=1), each in [0, max_new_tokens)")
        starts = torch.tensor(start_positions, dtype=torch.int64)  # (N,)
    seed_tensor = torch.tensor(seeds, dtype=torch.int64)  # (N,)
    rows_of = torch.tensor(source, dtype=torch.long) if source is not None else None  # (N,)
    completion_ids, sampled_logp, width, counts = _decode_chunks(model, unique_ids, unique_mask, seed_tensor, run,
                                                                 starts=starts, stop_when=stop_when, source=rows_of)
    completion_ids, completion_mask, truncated, sampled_logp = _trim(completion_ids, sampled_logp, width, counts, run)
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if was_training:
        model.train()
    expand = rows_of if rows_of is not None else torch.arange(unique_ids.shape[0]).repeat_interleave(group)  # (N,)
    prompt_ids, prompt_mask = unique_ids[expand], unique_mask[expand]  # (N, P) each
    return Rollout.single_turn(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, texts, sampled_logp)


def _decode_chunks(model, unique_ids: torch.Tensor, unique_mask: torch.Tensor, seeds: torch.Tensor, run: _DecodeRun,
                   *, starts: torch.Tensor | None, stop_when, source=None):
    """Decode the prompts `run.decoding.batch_size` rows at a time. Returns the completion ids (N, C_max), the
    sampled log-probs (N, C_max) or None, the widest chunk's width, and each row's count of emitted tokens (N,)
    for continued rows or with stop_when (else None). stop_when ends the decoding (the later chunks' rows stay
    empty). source (N,): row i continues unique prompt source[i] (one chunk, see generate_tokens)."""
    d = run.decoding
    device = next(model.parameters()).device
    group, num_rows = d.samples_per_prompt, seeds.shape[0]
    counts = torch.zeros(num_rows, dtype=torch.long) if (starts is not None or stop_when is not None) else None  # (N,)
    completion_ids = torch.full((num_rows, d.max_new_tokens), run.pad_id, dtype=torch.long)  # (N, C_max)
    sampled_logp = torch.zeros((num_rows, d.max_new_tokens)) if d.logprobs else None  # (N, C_max)
    width = 0
    prompts_per_chunk = max(1, d.batch_size // group if source is None else unique_ids.shape[0])
    for first in range(0, unique_ids.shape[0], prompts_per_chunk):
        last = min(unique_ids.shape[0], first + prompts_per_chunk)
        rows = slice(first * group, last * group) if source is None else slice(0, num_rows)
        chunk_stop = None
        if stop_when is not None:  # the caller sees every row: those of earlier chunks finished, later ones not yet
            def chunk_stop(done, rows=rows):
                finished = counts.new_zeros(num_rows, dtype=torch.bool)
                finished[: rows.start] = True
                finished[rows] = done.cpu()
                return stop_when(finished)
        chunk, chunk_logp, chunk_counts, interrupted = _decode(
            model, unique_ids[first:last].to(device), unique_mask[first:last].to(device), seeds[rows], run,
            starts=starts[rows] if starts is not None else None, stop_when=chunk_stop,
            source=source.to(device) if source is not None else None,
        )  # (n, c) each
        if counts is not None:
            counts[rows] = chunk_counts.cpu()
        completion_ids[rows, : chunk.shape[1]] = chunk.cpu()
        if sampled_logp is not None:
            sampled_logp[rows, : chunk.shape[1]] = chunk_logp.cpu()
        width = max(width, chunk.shape[1])
        if interrupted:  # stop_when ended generation: the later chunks' rows come back empty
            break
    return completion_ids, sampled_logp, width, counts


def _trim(completion_ids: torch.Tensor, sampled_logp: torch.Tensor | None, width: int, counts: torch.Tensor | None,
          run: _DecodeRun):
    """(completion ids, completion mask, truncated, log-probs) of the decoded rows: each row up to its stop
    token (or its own count: a stop token, the budget, or an early stop), padded to the longest completion."""
    stop_ids, pad_id = run.stop_ids, run.pad_id
    num_rows = completion_ids.shape[0]
    completion_mask, truncated = completion_mask_from_ids(completion_ids[:, :width], stop_ids)
    if counts is not None:  # rows end at their own count: a stop token, the budget, or an early stop
        completion_mask = (torch.arange(width).unsqueeze(0) < counts.unsqueeze(1)).long()  # (N, C)
        last = completion_ids[:, :width].gather(1, (counts - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # (N,)
        truncated = ~((counts > 0) & torch.isin(last, torch.tensor(stop_ids, dtype=torch.long)))
    # (N, C): padded to the longest completion, not the budget (nor past it, as a lockstep batch may run)
    width = int(completion_mask.sum(dim=1).max()) if num_rows else 0
    completion_ids, completion_mask = completion_ids[:, :width], completion_mask[:, :width]
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_id)
    if sampled_logp is not None:
        sampled_logp = sampled_logp[:, :width] * completion_mask  # (N, C)
    return completion_ids, completion_mask, truncated, sampled_logp


def _all_stopped(stopped: torch.Tensor) -> bool:
    """True when every row of every process has stopped (one all-reduce)."""
    flag = torch.tensor([0.0 if bool(stopped.all()) else 1.0], device=stopped.device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return flag.item() == 0.0


def _prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, d: Decoding, source=None):
    """Encode the b prompts once for their whole group (or, `source` (n,), for the rows that continue each). Returns
    the first token's logits (n, V), the cache (repeated per sample), rlx's own decode step for Llama-family models
    (engines/fast_decode.py) or None, the attention mask (n, P) and each row's next position (n,)."""
    group = d.samples_per_prompt
    positions = position_ids_from_mask(prompt_mask)  # (b, P), as in the training forward (models/forward.py)
    shared = d.shared_prefix if source is None else 0
    cache = generation_cache(model, d.max_new_tokens + prompt_ids.shape[1] - shared)
    if shared:  # the prompts' common first tokens once, their keys and values copied to every prompt
        model(input_ids=prompt_ids[:1, :shared], attention_mask=prompt_mask[:1, :shared],
              position_ids=positions[:1, :shared], past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(prompt_ids.shape[0])
    step = model(input_ids=prompt_ids[:, shared:], attention_mask=prompt_mask, position_ids=positions[:, shared:],
                 past_key_values=cache, use_cache=True, logits_to_keep=1)  # the prompt once for its whole group
    cache = step.past_key_values
    fast = (decode_step_for(model, onednn=d.onednn or d.sampler in ONEDNN_DECODE, quantize=d.quantize)
            if all(isinstance(layer, PreallocatedLayer) for layer in cache.layers) else None)
    if fast is None and d.quantize != "none":  # never a silent float32 rollout when 8-bit was asked for
        raise ValueError(f"quantize={d.quantize}: this model has no rlx decode step (engines/fast_decode.py)")
    if source is not None:  # each row from its unique prompt + prefix (a copy, as repeat_interleave makes)
        cache.batch_select_indices(source)
        return step.logits[source, -1], cache, fast, prompt_mask[source], positions[source, -1] + 1
    logits = step.logits[:, -1].repeat_interleave(group, dim=0)  # (n, V)
    if group > 1:
        cache.batch_repeat_interleave(group)
    attention = prompt_mask.repeat_interleave(group, dim=0)  # (n, P + t)
    next_position = positions[:, -1].repeat_interleave(group) + 1  # (n,)
    return logits, cache, fast, attention, next_position


def _forbid_early_stop(logits: torch.Tensor, t: int, position, stop: torch.Tensor, starts, min_new_tokens: int) -> None:
    """The stop tokens' logits to -inf (in place) for the rows whose next completion position is below
    min_new_tokens: all rows at step t, or (continuation, `starts`) each row by its own position."""
    if starts is None:
        if t < min_new_tokens and stop.numel():
            logits[:, stop] = float("-inf")
    elif stop.numel() and bool((position < min_new_tokens).any()):
        early = (position < min_new_tokens).nonzero().squeeze(1)
        logits[early.unsqueeze(1), stop.unsqueeze(0)] = float("-inf")


def _next_logits(model, fast, token: torch.Tensor, next_position: torch.Tensor, attention: torch.Tensor, cache):
    """The logits (a, V) of the next token of each alive row, by rlx's decode step when there is one."""
    if fast is not None:
        return fast(token, next_position, attention, cache)  # (a, V)
    step = model(input_ids=token.unsqueeze(1), attention_mask=attention,
                 position_ids=next_position.unsqueeze(1), past_key_values=cache, use_cache=True)
    return step.logits[:, -1]  # (a, V)


def _decode(model, prompt_ids, prompt_mask, seeds, run: _DecodeRun, *, starts=None,
            stop_when=None, source=None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, bool]:
    """Token-by-token decoding of `group` (run.decoding.samples_per_prompt) samples for each of b prompts.
    Returns (b*group, c) token ids, with logprobs (b*group, c) log softmax(z / T) of each sampled token (see
    generate), else None, the count of tokens each row emitted (b*group,), and whether stop_when ended the
    decoding. run.decoding.schedule: a temperature per completion position (see generate_tokens).
    run.lockstep: rows that stopped stay in the batch (their later tokens are masked by the caller) and the
    loop runs until every process's rows have stopped. starts (b,) with group 1: each row's first completion
    position (continuation, see generate_tokens); stop_when(finished (b*group,) bool) after every token step."""
    d = run.decoding
    max_new_tokens, temperature, schedule = d.max_new_tokens, d.temperature, d.schedule
    device = prompt_ids.device
    num_rows = prompt_ids.shape[0] * d.samples_per_prompt if source is None else source.shape[0]
    out = torch.full((num_rows, max_new_tokens), run.pad_id, dtype=torch.long, device=device)  # (n, C_max)
    logp = torch.zeros((num_rows, max_new_tokens), device=device) if d.logprobs else None  # (n, C_max)
    counts = torch.zeros(num_rows, dtype=torch.long, device=device)  # (n,) tokens emitted
    scale = 1.0 if temperature <= 0 else float(temperature)  # as the trainer's forward (HFGenerator._logprobs)
    budget = None
    if starts is not None:  # continuation: completion position t + start, at most max_new_tokens in all
        starts = starts.to(device)
        budget = (max_new_tokens - starts).clamp(min=0)  # (n,)
        steps = int(budget.max()) if num_rows else 0
    else:
        steps = max_new_tokens
    if d.segment:  # a round: every row advances at most `segment` tokens; rows cut here are not finished
        steps = min(steps, int(d.segment))
    if steps == 0:
        return out[:, :0], (logp[:, :0] if logp is not None else None), counts, False
    logits, cache, fast, attention, next_position = _prefill(model, prompt_ids, prompt_mask, d, source)
    stopped = torch.zeros(num_rows, dtype=torch.bool, device=device)  # lockstep: rows that emitted a stop token
    alive = torch.arange(num_rows, device=device)  # rows of `out` still generating
    stop = torch.tensor(run.stop_ids, dtype=torch.long, device=device)  # (S,)
    seeds = seeds.to(device)
    used = steps
    done = torch.zeros(num_rows, dtype=torch.bool, device=device)  # rows that emitted a stop token or hit their budget
    for t in range(steps):
        if schedule is not None:  # a per-position temperature (EAD): draw and record at tau_t
            temperature = float(schedule[t])
            scale = 1.0 if temperature <= 0 else temperature
        if logp is not None:  # the model's tempered distribution, a copy taken before the stop mask and any filter
            scaled = logits.float() / scale  # (a, V)
        position = t if starts is None else starts[alive] + t  # completion position of each row's next token
        _forbid_early_stop(logits, t, position, stop, starts, d.min_new_tokens)
        if d.greedy:
            token = logits.argmax(dim=-1)  # (a,)
        else:
            token = sample_tokens(logits, seeds[alive], position, temperature, d.top_k, d.top_p, d.sampler)  # (a,)
        out[alive, t] = token
        counts[alive] += 1
        if logp is not None:
            logp[alive, t] = token_logprobs(scaled, token)  # (a,)
        finished = torch.isin(token, stop)  # (a,)
        if budget is not None:
            finished = finished | (counts[alive] >= budget[alive])
        if stop_when is not None:
            done[alive[finished]] = True
            if t < steps - 1 and stop_when(done):
                used = t + 1
                return out[:, :used], (logp[:, :used] if logp is not None else None), counts, True
        if t == steps - 1:
            break
        if run.lockstep:
            stopped |= finished
            if _all_stopped(stopped):
                used = t + 1
                break
        elif finished.any():
            keep = (~finished).nonzero().squeeze(1)
            if keep.numel() == 0:
                used = t + 1
                break
            alive, token, attention, next_position = alive[keep], token[keep], attention[keep], next_position[keep]
            cache.batch_select_indices(keep)
        attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=1)
        logits = _next_logits(model, fast, token, next_position, attention, cache)  # (a, V)
        next_position = next_position + 1
    return out[:, :used], (logp[:, :used] if logp is not None else None), counts, False
