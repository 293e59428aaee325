"""Pipeline mode (rollout.max_staleness = k > 0): the next batches are sampled in a background producer thread
while the trainer trains on the current one.

Schedule. Batch s is sampled with the weights after update max(0, s-1-k) (k = 0 is the synchronous loop: the
weights after update s-1). With k = 1, while the trainer runs update s on batch s, the producer samples batch
s+1 with the weights after update s-1; the trainer's `publish(model, s)` hands the weights of update s over for
batch s+2. The producer never samples a batch before the weights it needs were published, and at most k+1
batches wait for the trainer.

    step s:     trainer  [ wait for batch s | update s on batch s | publish s ]
                producer       [ batch s+1 with version s-1 ][ batch s+2 with version s ] ...

What each batch holds is the synchronous run's: the same prompts (the inner producer runs in step order on the
producer thread), the same seeds (sample_seed(seed, step, i)), only the weights are older. Every row carries the
version that sampled it (Rollout.versions); the loops' off-policy correction (rollout.correction) weighs the rows
by pi_trainer / pi_sampler.

Weights. The producer samples with its own copy of the policy (`rollout_model`): for rollout=hf the generator IS
that copy (an HFGenerator on it); for rollout=server the copy is what `publish` pushes to the server. The trainer's
`publish` takes a CPU snapshot of its trainable parameters (the adapter alone under LoRA), and the producer thread
loads the snapshot into the copy (and pushes it) between two batches, never during one.

Checkpoints. A checkpoint after step s must let a resumed run sample exactly what this one would: batches s+1 ..
s+k were (or are being) sampled with weights older than the checkpoint's, so they are saved as they are (rows,
rewards, versions), together with the inner producer's state (the data position) as it was right after batch s+k.
Batch s+k+1 onward needs the weights of update s or later, which the resumed run has. `state_dict` waits for
batches s+1 .. s+k to finish.

Threads. One producer thread (daemon) per run, started by the first `produce`; `close` (the run's generator
close, on every exit path) stops it: an HFGenerator stops at the next token (its `interrupt`), a server request
in flight finishes or fails. An exception in the producer reaches the trainer at its next `produce`, as it is.
`producer_cpus` pins the producer thread to those cores (Linux: a thread's own affinity) and the trainer thread
to the process's other cores; `producer_threads` sets the producer's torch intra-op threads (per thread in torch).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from dataclasses import replace

import torch

from rlx.engines.generator import Continuation
from rlx.engines.records import Generation
from rlx.rollout.types import Batch

log = logging.getLogger("rlx")


def staleness_metrics(versions: torch.Tensor, step: int) -> dict[str, float]:
    """rollout/staleness_mean|max: updates between the weights that sampled each row (versions (N,)) and the
    trainer's at step `step` (version step - 1)."""
    staleness = (step - 1 - versions).clamp(min=0).float()
    return {"rollout/staleness_mean": staleness.mean().item() if staleness.numel() else 0.0,
            "rollout/staleness_max": staleness.max().item() if staleness.numel() else 0.0}


@torch.no_grad()
def load_snapshot(model, snapshot: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    for name, value in snapshot.items():
        params[name].copy_(value)


def rollout_copy(policy):
    """The producer's own copy of the policy: frozen, in eval mode, on the policy's device."""
    clone = copy.deepcopy(policy)
    clone.eval()
    for param in clone.parameters():
        param.requires_grad_(False)
    return clone


class PipelineProducer:
    """The producer interface (produce(step), checkpointed(), records, loss_width) around `inner`, whose
    batches are sampled ahead by a background thread through `generator` (built on `rollout_model`)."""

    def __init__(self, inner, generator, rollout_model, policy, *, max_staleness: int, total_steps: int,
                 producer_cpus: list[int] | None = None, producer_threads: int | None = None):
        if max_staleness < 1:
            raise ValueError(f"max_staleness={max_staleness}: the pipeline needs k >= 1 (k = 0 is the synchronous "
                             "loop)")
        self.inner, self.generator, self.rollout_model = inner, generator, rollout_model
        self.trainable = {name for name, param in policy.named_parameters() if param.requires_grad}
        self.k, self.total_steps = int(max_staleness), int(total_steps)
        self.producer_cpus, self.producer_threads = list(producer_cpus or []), producer_threads
        self._cond = threading.Condition()
        self._ready: dict[int, tuple[Batch, float]] = {}  # step -> (batch, seconds the producer took for it)
        self._states: dict[int, dict] = {}  # step -> the inner producer's state right after that batch
        self._snapshots: dict[int, dict] = {}  # version -> trainable weights, published and not loaded yet
        self._loaded = 0  # the version the rollout copy holds (the starting weights)
        self._published = 0  # the newest version published (or loaded)
        self._awaited: int | None = None  # the version the producer waits for, while it waits
        self._consumed = 0  # the last step handed to the trainer
        self._producer_idle = 0.0  # seconds the producer waited for weights since the last batch handed over
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trainer_affinity = None
        if hasattr(generator, "interrupt"):
            generator.interrupt = self._stop

    # -- the producer interface ------------------------------------------------------------------------------------

    @property
    def loss_width(self) -> int:
        return self.inner.loss_width

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        return self.inner.records(batch, samples, count)

    def checkpointed(self) -> dict:
        return {"pipeline": self}

    def produce(self, step: int) -> Batch:
        """Batch `step` (waiting for it), with the rollout/staleness_* and perf/* figures of the pipeline."""
        if self._thread is None:
            self._start(step)
        began = time.perf_counter()
        with self._cond:
            while step not in self._ready and self._error is None:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the rollout producer stopped before batch {step} (the pipeline was closed)")
                if self._awaited is not None and self._awaited > self._published:  # would wait for each other forever
                    raise RuntimeError(f"pipeline schedule broken: batch {step} is awaited while the producer waits "
                                       f"for weights {self._awaited}, newer than the last published "
                                       f"({self._published})")
                self._cond.wait(timeout=1.0)
            if self._error is not None:
                raise self._error
            batch, producing = self._ready.pop(step)
            producer_idle, self._producer_idle = self._producer_idle, 0.0
            self._consumed = step
            for old in [s for s in self._states if s < step]:
                del self._states[old]
        return replace(batch, metrics={
            **batch.metrics,
            **staleness_metrics(batch.rollout.versions, step),
            "perf/trainer_idle_s": time.perf_counter() - began,
            "perf/producer_idle_s": producer_idle,
            "perf/rollout_time_s": producing,
        })

    # -- weights from the trainer ----------------------------------------------------------------------------------

    def publish(self, model, version: int) -> None:
        """The trainer's weights after update `version`, for the batches that need them (the first is version+1+k)."""
        if version + 1 + self.k > self.total_steps:
            return  # no batch of this run samples with them
        snapshot = {name: param.detach().to("cpu", copy=True) for name, param in model.named_parameters()
                    if name in self.trainable}
        with self._cond:
            self._snapshots[version] = snapshot
            self._published = max(self._published, version)
            self._cond.notify_all()

    # -- the producer thread ---------------------------------------------------------------------------------------

    def _start(self, step: int) -> None:
        first = max(self._ready, default=step - 1) + 1  # batches restored from a checkpoint are not sampled again
        if self.producer_cpus and hasattr(os, "sched_setaffinity"):
            self._trainer_affinity = os.sched_getaffinity(0)
            others = self._trainer_affinity - set(self.producer_cpus)
            if others:
                os.sched_setaffinity(0, others)  # this (the trainer's) thread only
        self._thread = threading.Thread(target=self._run, args=(first,), name="rlx-rollout-producer", daemon=True)
        self._thread.start()

    def _run(self, first: int) -> None:
        try:
            if self.producer_cpus and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, set(self.producer_cpus))  # this thread only
            if self.producer_threads:
                torch.set_num_threads(int(self.producer_threads))  # per thread in torch
            for step in range(first, self.total_steps + 1):
                version = max(0, step - 1 - self.k)  # the weights batch `step` is sampled with
                if not self._weights_for(version):
                    return
                began = time.perf_counter()
                batch = self.inner.produce(step)
                producing = time.perf_counter() - began
                state = {name: copy.deepcopy(obj.state_dict()) for name, obj in self.inner.checkpointed().items()}
                with self._cond:
                    if self._stop.is_set():
                        return
                    self._ready[step] = (batch, producing)
                    self._states[step] = state
                    self._cond.notify_all()
        except BaseException as exc:  # the trainer raises it at its next produce()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _weights_for(self, version: int) -> bool:
        """Put the weights of `version` into the rollout copy (and the generator), waiting for them to be published.
        False when the pipeline is closing."""
        waited = time.perf_counter()
        with self._cond:
            self._awaited = version
            while self._loaded != version and version not in self._snapshots and not self._stop.is_set():
                self._cond.wait()
            self._awaited = None
            self._producer_idle += time.perf_counter() - waited
            if self._stop.is_set():
                return False
            snapshot = self._snapshots.pop(version, None) if self._loaded != version else None
            for old in [v for v in self._snapshots if v < version]:
                del self._snapshots[old]
        if snapshot is not None:
            load_snapshot(self.rollout_model, snapshot)
            self._loaded = version
        if snapshot is not None or self.generator.version != version:
            # (the copy may hold them already: loaded early for rounds drawn ahead, rollout.server.overlap_steps)
            self.generator.publish(self.rollout_model, version)
        return True

    def weights_ahead(self, step: int):
        """(version, the rollout copy holding it) of the weights batch `step` samples with, loaded into the copy now
        if the trainer has published them; None if not yet (never waits). For rounds drawn ahead
        (rollout.server.overlap_steps), called by the producer while it samples batch step-1, whose weights the
        servers already hold."""
        version = max(0, step - 1 - self.k)
        with self._cond:
            if self._loaded != version and version not in self._snapshots:
                return None
            snapshot = self._snapshots.pop(version, None) if self._loaded != version else None
        if snapshot is not None:
            load_snapshot(self.rollout_model, snapshot)
            self._loaded = version
        return version, self.rollout_model

    def close(self) -> None:
        """Stop the producer thread (whatever it is doing) and give the trainer thread its cores back."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                log.warning("the rollout producer thread is still finishing a request; it stops with the process")
        if self._trainer_affinity is not None:
            os.sched_setaffinity(0, self._trainer_affinity)
            self._trainer_affinity = None

    # -- checkpoints -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """After step s: batches s+1 .. s+k as sampled (waiting for them), and the inner producer's state after s+k."""
        last = min(self._consumed + self.k, self.total_steps)
        if self._thread is None and last > self._consumed and not all(s in self._ready
                                                                      for s in range(self._consumed + 1, last + 1)):
            self._start(self._consumed + 1)  # a checkpoint before the first produce (not reached by the loops)
        with self._cond:
            while (any(s not in self._ready for s in range(self._consumed + 1, last + 1)) and self._error is None
                   and not self._stop.is_set()):
                self._cond.wait()
            if self._error is not None:
                raise self._error
            pending = {s: self._ready[s] for s in range(self._consumed + 1, last + 1)}
            inner = self._states.get(last)
        if inner is None:  # nothing sampled ahead (the last step, or no batch yet): the inner producer's own state
            inner = {name: obj.state_dict() for name, obj in self.inner.checkpointed().items()}
        return {"max_staleness": self.k, "consumed": self._consumed, "pending": pending, "inner": inner}

    def load_state_dict(self, state: dict) -> None:
        if state["max_staleness"] != self.k:
            from rlx.errors import UserError

            raise UserError(f"this run was checkpointed with rollout.max_staleness={state['max_staleness']}; resume it "
                            f"with the same value (its queued batches were sampled for it)")
        for name, obj in self.inner.checkpointed().items():
            obj.load_state_dict(state["inner"][name])
        self._ready = dict(state["pending"])
        self._consumed = state["consumed"]

    # -- the generator's side ---------------------------------------------------------------------------------------

    def step_metrics(self) -> dict[str, float]:
        return self.generator.step_metrics()


class PipelineGenerator:
    """The run's generator in pipeline mode (the Generator protocol): `publish` hands the trainer's weights to the
    pipeline; `generate_ids` (evaluation) samples the trainer's current policy itself (`current`, an HFGenerator on
    it), as the synchronous loop's evaluation does; `close` stops the producer thread, then closes the producer's
    generator (a child server with it)."""

    def __init__(self, pipeline: PipelineProducer, current):
        self.pipeline, self.current = pipeline, current
        self.version = 0

    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int], greedy: bool = False,
                     samples_per_prompt: int = 1, min_new_tokens: int = 0, continuation: Continuation | None = None,
                     schedule: list[float] | None = None) -> Generation:
        return self.current.generate_ids(prompts, max_new_tokens=max_new_tokens, seeds=seeds, greedy=greedy,
                                         samples_per_prompt=samples_per_prompt, min_new_tokens=min_new_tokens,
                                         continuation=continuation, schedule=schedule)

    def publish(self, model, version: int) -> None:
        self.version = version
        self.current.publish(model, version)
        self.pipeline.publish(model, version)

    def sleep(self) -> None:
        pass

    def step_metrics(self) -> dict[str, float]:
        return self.pipeline.step_metrics()

    def close(self) -> None:
        try:
            self.pipeline.close()
        finally:
            self.pipeline.generator.close()


def pipelined(roll, producer, generator, rollout_model, policy, current, total_steps: int):
    """(producer, generator) of the run: as given when rollout.max_staleness is 0, else the pipeline around them."""
    if not roll.max_staleness:
        return producer, generator
    pipeline = PipelineProducer(producer, generator, rollout_model, policy, max_staleness=roll.max_staleness,
                                total_steps=total_steps, producer_cpus=roll.producer_cpus,
                                producer_threads=roll.producer_threads)
    return pipeline, PipelineGenerator(pipeline, current)
