"""The generator protocol: token ids in, sampled token ids and their sampling log-probs out.

Multi-turn rollouts (rollout/env.py) hand the generator the exact token ids of the conversation so
far, so nothing the model sampled is ever re-tokenized. `HFGenerator` implements it on a transformers
model through rlx.engines.hf.generate (seeded per row, KV-cached decoding); a vLLM engine fits the
same protocol by passing prompt_token_ids and reading its logprobs.

Single-turn sampling (rollout/single_turn.py: the policy-gradient and PPO loops) is the one-turn case:
`sample_rollout` tokenizes the rendered prompts once, asks the generator for G adjacent samples of
each (samples_per_prompt, the prompt encoded once for its group) and builds the padded Rollout from
the returned ids. Through HFGenerator it draws exactly what rlx.engines.hf.generate draws on the
same prompts and seeds (tests/test_sampling.py checks it token for token).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from rlx.engines.hf import Continued, Decoding, eos_ids, generate_tokens
from rlx.engines.records import Generation, Rollout
from rlx.errors import UserError
from rlx.models.forward import position_ids_from_mask

log = logging.getLogger("rlx")


@dataclass(frozen=True)
class Continuation:
    """A generate_ids request that goes on from where rows stopped, or stops early (partial rollouts).

    prefixes (one per row, optional): the row's completion so far; the generator continues it, drawing completion
    token t from (the row's seed, position t) as an uninterrupted row would (max_new_tokens and min_new_tokens count
    the prefix), and returns the NEW tokens only. stop_when(finished (rows,) bool): called after each token step,
    True ends generation with the unfinished rows as far as they got. segment: every row advances at most this
    many tokens (a round of rollout.segment_tokens); a backend that cannot stop early (a server) can still do
    rounds: it asks each row for min(segment, what is left of its budget)."""

    prefixes: list[list[int]] | None = None
    stop_when: Callable[[torch.Tensor], bool] | None = None
    segment: int | None = None


class Generator(Protocol):
    """Token ids in, sampled ids and log-probs out; the policy's weights reach it through `publish`.

    Every backend implements it (HFGenerator on the policy itself, the vLLM engine, a vLLM server), so a
    producer never asks which one it holds. `version`: the number of updates published so far (stamped on
    every row it samples; 0 before the first publish)."""

    version: int

    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                     greedy: bool = False, samples_per_prompt: int = 1, min_new_tokens: int = 0,
                     continuation: Continuation | None = None, schedule: list[float] | None = None) -> Generation:
        """len(prompts) * samples_per_prompt rows, the samples of a prompt adjacent; seeds one per row.

        continuation (optional, Continuation): continue each row from its prefix (the NEW tokens come back) and/or
        stop generation early. schedule (optional): a sampling temperature per completion position (EAD,
        rollout.temperature_schedule), the log-probs taken at it. Backends that cannot do these refuse them with one
        line (rollout=hf can; partial rollouts use continuation, the temperature schedule `schedule`)."""
        ...

    def publish(self, model, version: int) -> None:
        """The trainer's weights after update `version` (the policy itself needs no copy)."""
        ...

    def sleep(self) -> None:
        """Give memory back for the update (vLLM's sleep mode); a no-op elsewhere."""
        ...

    def step_metrics(self) -> dict[str, float]:
        """The generator's own figures for the step's metrics row (e.g. perf/weight_sync_s)."""
        ...

    def close(self) -> None:
        ...


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> left-padded ids (B, P) and attention mask (B, P)."""
    width = max((len(r) for r in prompts), default=0)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, r in enumerate(prompts):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids, mask


SHARED_PREFIX_MIN = 32  # a common prefix shorter than this is encoded with each prompt or question (its
# cache costs more than it saves; rlx/evaluation/loglikelihood.py shares it)


def common_prefix(prompts: list[list[int]], minimum: int = SHARED_PREFIX_MIN) -> int:
    """The number of first tokens every prompt shares (a few-shot prompt's examples), leaving each prompt at least one
    token of its own; 0 when that is under `minimum` or there is a single prompt."""
    if len(prompts) < 2:
        return 0
    limit = min(len(p) for p in prompts) - 1
    length = 0
    while length < limit and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length if length >= minimum else 0


def prefix_pad(prompts: list[list[int]], pad_id: int, shared: int) -> tuple[torch.Tensor, torch.Tensor]:
    """left_pad with the `shared` common first tokens kept in front: ids (B, shared + W) = the prefix, then each
    prompt's rest left-padded to W, so the prefix sits at the same columns in every row (encoded once, hf.py)."""
    if not shared:
        return left_pad(prompts, pad_id)
    ids, mask = left_pad([p[shared:] for p in prompts], pad_id)
    head = torch.tensor(prompts[0][:shared], dtype=torch.long).expand(len(prompts), shared)
    return torch.cat([head, ids], dim=1), torch.cat([torch.ones_like(head), mask], dim=1)


def completion_texts(tokenizer, ids: list[list[int]]) -> list[str]:
    """Each row's text: the token-id lists right-padded with the pad id to one (N, C) tensor, decoded in one call with
    the special tokens (the pad among them) skipped. Every producer decodes its sampled ids through it."""
    width = max((len(row) for row in ids), default=0)
    padded = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)  # (N, C)
    for i, row in enumerate(ids):
        padded[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokenizer.batch_decode(padded, skip_special_tokens=True)


def shared_prefixes(rows: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """(the distinct token-id lists of `rows` in order of first appearance, the index of each row's among them)."""
    index: dict[tuple[int, ...], int] = {}
    source = [index.setdefault(tuple(r), len(index)) for r in rows]
    return [list(r) for r in index], source


@dataclass(frozen=True)
class DecodeStep:
    """Which decoder HFGenerator runs: the seeded draw's version (rollout.sampler, engines/sampling.py SAMPLERS),
    whether the decode step's projections go through oneDNN (rollout.onednn_decode; v3 always does) and whether the
    prompts' common first tokens are encoded once (share_prefix, common_prefix: evaluation's few-shot prompts), and the
    decode step's weights (quantize: none | int8, rollout.quantize; engines/fast_decode.py)."""

    sampler: str = "v2"
    onednn: bool = False
    share_prefix: bool = False
    quantize: str = "none"


class QuietLifecycle:
    """The Generator members an engine without memory to give back, figures of its own or anything to release has:
    no-ops (the policy sampling itself, a rank that does not sample, a user's simple engine)."""

    def sleep(self) -> None:
        pass

    def step_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class HFGenerator(QuietLifecycle):
    """Generator on a transformers model. Log-probs are those of the temperature-scaled distribution
    (before top-k / top-p filtering). logprobs=True: recomputed by one forward pass over prompt + sample;
    "sampler": the decoder's own, taken while sampling (engines/hf.py generate(logprobs=True); no extra
    pass; the single-turn loops compare them with their forward: rollout/logprob_gap_*); False: none
    (Generation.logprobs is None). decode: the draw's version and the decode step (DecodeStep)."""

    def __init__(self, model, tokenizer, *, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 batch_size: int = 256, logprobs: bool | str = True, decode: DecodeStep = DecodeStep()):
        if logprobs not in (True, False, "sampler"):
            raise ValueError(f"logprobs must be True, False or 'sampler', got {logprobs!r}")
        self.model, self.tokenizer, self.sampler, self.onednn = model, tokenizer, decode.sampler, decode.onednn
        self.temperature, self.top_p, self.top_k, self.batch_size = temperature, top_p, top_k, batch_size
        self.with_logprobs = logprobs
        self.share_prefix = decode.share_prefix  # encode the prompts' common first tokens once (common_prefix)
        self.quantize = decode.quantize  # the decode step's weights: none | int8 (an 8-bit copy made every call)
        self.version = 0
        self.interrupt = None  # a threading.Event: once set, generation stops at the next token (a pipeline closing)

    def rounds_in_one_call(self, rows: int) -> bool:
        """Whether `rows` continued rows decode as one batch (batch_size), advancing one token per step together, so
        that token-budget rounds at one version can run as one call stopped at a round's end (partial.py)."""
        return rows <= self.batch_size

    def publish(self, model, version: int) -> None:
        """The policy generates itself: the update already changed its weights; only the version moves."""
        self.version = version

    @torch.no_grad()
    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                     greedy: bool = False, samples_per_prompt: int = 1, min_new_tokens: int = 0,
                     continuation: Continuation | None = None, schedule: list[float] | None = None) -> Generation:
        """continuation: continue each row from its token prefix (partial rollouts) and/or end generation early;
        schedule: a sampling temperature per completion position (EAD), the decoder's log-probs taken at it."""
        starts = source = None
        prefixes, stop_when = (continuation.prefixes, continuation.stop_when) if continuation else (None, None)
        if prefixes is not None:  # each row is its own prompt: prompt + the completion so far (engines/hf.py)
            if len(prefixes) != len(prompts) * samples_per_prompt:
                raise ValueError(f"{len(prefixes)} prefixes for {len(prompts) * samples_per_prompt} rows")
            prompts = [list(prompts[i // samples_per_prompt]) + list(p) for i, p in enumerate(prefixes)]
            starts, samples_per_prompt = [len(p) for p in prefixes], 1
            if len(prompts) <= self.batch_size:  # rows with one prompt + prefix (a fresh group) encode it once
                prompts, source = shared_prefixes(prompts)
        if self.interrupt is not None:
            stop_when = _or_interrupted(self.interrupt, stop_when)
        shared = common_prefix(prompts) if self.share_prefix and starts is None else 0
        ids, mask = prefix_pad(prompts, self.tokenizer.pad_token_id, shared)
        decoding = Decoding(shared_prefix=shared, samples_per_prompt=samples_per_prompt, max_new_tokens=max_new_tokens,
                            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, greedy=greedy,
                            batch_size=self.batch_size, min_new_tokens=min_new_tokens, sampler=self.sampler,
                            onednn=self.onednn, quantize=self.quantize, schedule=schedule,
                            segment=continuation.segment if continuation else None,
                            logprobs=self.with_logprobs == "sampler"
                            or (schedule is not None and bool(self.with_logprobs)))
        continued = Continued(starts, source) if starts is not None else None
        out = generate_tokens(self.model, self.tokenizer, ids, mask, decoding, seeds=seeds, continued=continued,
                              stop_when=stop_when)
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
        logits = self.model(input_ids=input_ids, attention_mask=attention,
                            position_ids=position_ids_from_mask(attention),
                            use_cache=False).logits[:, prompt_ids.shape[1] - 1 : -1].float()  # (N, C, V)
        if was_training:
            self.model.train()
        temperature = 1.0 if self.temperature <= 0 else self.temperature
        logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, completion_ids.to(device).unsqueeze(-1))
        return (logp.squeeze(-1) * completion_mask.to(device)).cpu()


def _or_interrupted(event, stop_when):
    """stop_when, or the event set."""
    return lambda finished: event.is_set() or (stop_when is not None and bool(stop_when(finished)))


def refuse_continuation(backend: str, continuation: Continuation | None, continues_prefixes: bool = False) -> None:
    """One line for a backend that cannot continue rows from a prefix (unless `continues_prefixes`: rollout=server
    continues them in rounds) nor stop generation early."""
    if continuation is None:
        return
    if continuation.stop_when is not None and continues_prefixes:
        raise UserError(f"rollout={backend} cannot stop generation early once enough groups finished (partial "
                        f"rollouts without rounds); it continues rows in token-budget rounds: set "
                        f"rollout.segment_tokens, or use rollout=hf")
    if continuation.prefixes is not None and not continues_prefixes or continuation.stop_when is not None:
        raise UserError(f"rollout={backend} cannot continue a row from its token prefix with rlx's seeded draws nor "
                        "stop generation early (partial rollouts, hints); use rollout=hf")


def refuse_schedule(backend: str, schedule: list[float] | None) -> None:
    """One line for a backend that samples a generation at one temperature when asked for a temperature per position
    (rollout.temperature_schedule; the config refuses it before the run, a user's stage reaches it here)."""
    if schedule is not None:
        raise UserError(f"rollout={backend} samples a generation at one temperature; a per-position temperature "
                        "schedule (rollout.temperature_schedule, a stage's schedule) needs rollout=hf")


def policy_generator(model, tokenizer, roll, *, logprobs: bool | str = "sampler") -> HFGenerator:
    """The policy as its own generator (rollout=hf), with rollout's sampling settings: temperature, top-p/top-k,
    batch size, the draw version (rollout.sampler; a config from before sampler versions drew with v1) and the
    oneDNN decode step (rollout.onednn_decode). logprobs: the decoder's own by default ("sampler")."""
    from rlx.engines.sampling import LEGACY_SAMPLER

    quantize = getattr(roll, "quantize", "none")
    decode = DecodeStep(sampler=getattr(roll, "sampler", None) or LEGACY_SAMPLER,
                        onednn=bool(getattr(roll, "onednn_decode", False)),
                        quantize="none" if quantize == "auto" else quantize)  # training decides auto (resolved_rollout)
    if decode.quantize != "none":
        check_quantized_decoding(model, decode.quantize)
    return HFGenerator(model, tokenizer, temperature=roll.temperature, top_p=roll.top_p, top_k=roll.top_k,
                       batch_size=roll.batch_size, logprobs=logprobs, decode=decode)


def check_quantized_decoding(model, quantize: str) -> None:
    """One line, before any generation, when rollout.quantize cannot run on this model: rlx's decode step must
    reproduce it (Llama / Qwen2 / Qwen3 / Mistral, not sharded) and it must be on the CPU (fbgemm's int8 kernels)."""
    from rlx.engines.fast_decode import decode_step_for, int8_available, unwrapped

    inner = unwrapped(getattr(model, "module", model))
    if not int8_available(next(inner.parameters())):
        raise UserError(f"rollout.quantize={quantize} runs on the CPU (fbgemm's int8 kernels); this policy is on "
                        f"{next(inner.parameters()).device}: set rollout.quantize=none")
    if decode_step_for(inner) is None:
        kind = getattr(getattr(inner, "config", None), "model_type", type(inner).__name__)
        raise UserError(f"rollout.quantize={quantize} needs rlx's decode step (Llama, Qwen2, Qwen3, Mistral; not "
                        f"sharded); this model is {kind}: set rollout.quantize=none")


def eval_policy_generator(model, tokenizer, batch_size: int) -> HFGenerator:
    """The policy decoding itself for held-out evaluation (rollout=hf, and the loops that build no generator): rlx's
    decoder at its defaults (the v2 draw on the F.linear decode step, whatever rollout.sampler says), `batch_size`
    rows at a time, no log-probs. Evaluation decodes greedily, so no temperature, top-p or top-k enters. A prefix that
    every prompt starts with (few-shot examples) is encoded once per batch (common_prefix)."""
    return HFGenerator(model, tokenizer, batch_size=batch_size, logprobs=False, decode=DecodeStep(share_prefix=True))


@dataclass(frozen=True)
class Draw:
    """What sample_rollout asks the generator for: `samples_per_prompt` adjacent completions of each prompt, at most
    `max_new_tokens` tokens each and no stop token before `min_new_tokens`, greedy or sampled, and optionally a
    sampling temperature per completion position (EAD's `schedule`: rollout=hf only)."""

    samples_per_prompt: int
    max_new_tokens: int
    greedy: bool = False
    min_new_tokens: int = 0
    schedule: list[float] | None = None


def sample_rollout(generator: Generator, tokenizer, prompts: list[str], draw: Draw, seeds: list[int]) -> Rollout:
    """Single-turn sampling through the generator protocol: rendered prompts are tokenized once (no special
    tokens added: the chat template has them), G = draw.samples_per_prompt adjacent completions of each are drawn
    as token ids (seeds: one per completion), and the Rollout is built from those ids (Rollout.from_ids), texts
    decoded without special tokens, every row stamped with the generator's policy version."""
    samples_per_prompt, schedule = draw.samples_per_prompt, draw.schedule
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]  # B lists of ids
    out = generator.generate_ids(prompt_ids, samples_per_prompt=samples_per_prompt, max_new_tokens=draw.max_new_tokens,
                                 seeds=seeds, greedy=draw.greedy, min_new_tokens=draw.min_new_tokens, schedule=schedule)
    texts = completion_texts(tokenizer, out.ids)
    rollout = Rollout.from_ids(prompt_ids, out, samples_per_prompt, tokenizer.pad_token_id, texts,
                               version=generator.version)
    if schedule is not None:  # the temperature each token was drawn at (1.0 on padding, which carries no loss)
        width = rollout.completion_ids.shape[1]
        taus = torch.tensor(list(schedule[:width]), dtype=torch.float32).expand(len(rollout), width)
        rollout = replace(rollout,
                          temperatures=torch.where(rollout.completion_mask.bool(), taus, torch.ones_like(taus)))
    return rollout


AUTO_INT8_MIN_TOKENS = 128  # rollout.quantize=auto: the completion budget from which the int8 copy pays for itself


def auto_quantize(model, roll, *, cpu: bool, sharded: bool) -> tuple[str, str]:
    """rollout.quantize=auto, decided once for the loaded policy: int8 where rlx's 8-bit decode step runs (the policy
    sampling itself on the CPU, rollout=hf with rlx's decoder, a Llama / Qwen2 / Qwen3 / Mistral model, not sharded)
    and a completion may run to AUTO_INT8_MIN_TOKENS tokens or more; else none. The copy is made once per generate
    call and pays back after ~30-65 decode steps at the 0.5B shape (docs/scaling/quantized.md); with a budget of 128
    the longest row of a batch, which sets the step count, usually runs past that. Returns (choice, why)."""
    if roll.backend != "hf" or roll.engine != "builtin":
        return "none", f"rollout={roll.backend}" + ("" if roll.engine == "builtin" else f", engine {roll.engine}")
    if not cpu or sharded:
        return "none", "not the CPU" if not cpu else "sharded weights"
    if roll.max_new_tokens < AUTO_INT8_MIN_TOKENS:
        return "none", f"completions of at most {roll.max_new_tokens} < {AUTO_INT8_MIN_TOKENS} tokens"
    try:
        check_quantized_decoding(model, "int8")
    except UserError:
        return "none", "no rlx decode step for this model"
    return "int8", f"CPU, completions up to {roll.max_new_tokens} >= {AUTO_INT8_MIN_TOKENS} tokens"


def resolved_rollout(settings, model):
    """The run's typed settings with rollout.quantize=auto decided (auto_quantize) and, where it decided int8 and no
    correction was set, rollout.correction=tis: the sampler is then not the trainer, and the trainer corrects with
    truncated importance sampling (to sample from int8 without it, set rollout.quantize=int8). Logs the choice."""
    roll = settings.rollout
    if getattr(roll, "quantize", "none") != "auto":
        return settings
    hw = settings.hardware
    sharded = hw.distributed == "fsdp" or (hw.distributed == "deepspeed" and hw.deepspeed.zero_stage == 3)
    choice, why = auto_quantize(model, roll, cpu=hw.cpu, sharded=sharded)
    correction = "tis" if choice != "none" and roll.correction == "none" else roll.correction
    log.info("built: rollout.quantize=auto -> %s (%s)%s", choice, why,
             f", rollout.correction -> {correction}" if correction != roll.correction else "")
    return replace(settings, rollout=replace(roll, quantize=choice, correction=correction))
