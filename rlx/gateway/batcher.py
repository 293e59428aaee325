"""Micro-batching: the model calls of all live sessions become one Generator.generate_ids call.

One worker thread owns the generator (a model is not thread-safe). It takes the first waiting request,
then keeps collecting until `max_batch` requests are waiting, or `max_wait_s` has passed since the first,
or every live session is waiting (`waiting_for()`: no further request can come before an answer), and
generates them together. Each request carries its own seed (the session's, per call), so what it samples
does not depend on its batch-mates, and its own token budget: the batch is generated with the largest
budget and each row is cut to its own (a cut row is not `stopped`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

log = logging.getLogger("rlx")


@dataclass
class Sampled:
    ids: list[int]                     # sampled ids, cut to the request's budget
    logprobs: list[float] | None
    stopped: bool                      # a stop token ended the row within the budget
    version: int                       # the policy version that sampled it


@dataclass
class _Request:
    context: list[int]
    seed: int
    budget: int
    future: Future = field(default_factory=Future)


class MicroBatcher:
    """submit(context, seed, budget) -> Future[Sampled]; start() / stop() the worker."""

    def __init__(self, generator, *, max_batch: int, max_wait_s: float, greedy: bool = False,
                 waiting_for: Callable[[], int | None] | None = None, version: Callable[[], int] = lambda: 0):
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait_s >= 0, got {max_batch}, {max_wait_s}")
        self.generator, self.max_batch, self.max_wait_s, self.greedy = generator, max_batch, max_wait_s, greedy
        self.waiting_for, self.version = waiting_for, version
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.batches: list[int] = []       # size of every batch generated (the tests and metrics read it)

    def start(self) -> MicroBatcher:
        self._thread = threading.Thread(target=self._run, name="rlx-gateway-batcher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        while True:  # requests nobody will generate: their callers get an error, not a hang
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                break
            request.future.set_exception(RuntimeError("the gateway stopped"))

    def submit(self, context: list[int], seed: int, budget: int) -> Future:
        if self._stop.is_set():
            raise RuntimeError("the gateway stopped")
        request = _Request(list(context), int(seed), int(budget))
        self._queue.put(request)
        return request.future

    def _collect(self, first: _Request) -> list[_Request]:
        batch, deadline = [first], time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            remaining = deadline - time.monotonic()
            expected = self.waiting_for() if self.waiting_for is not None else None
            if remaining <= 0 or (expected is not None and len(batch) + self._queue.qsize() >= expected):
                try:  # time is up, or every live session is waiting: take what is queued and go
                    batch.append(self._queue.get_nowait())
                    continue
                except queue.Empty:
                    break
            try:  # with a live-session count, look again every 5 ms (a session may end meanwhile)
                batch.append(self._queue.get(timeout=remaining if expected is None else min(remaining, 0.005)))
            except queue.Empty:
                continue
        return batch

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            batch = self._collect(first)
            self.batches.append(len(batch))
            try:
                version = self.version()
                out = self.generator.generate_ids([r.context for r in batch],
                                                  max_new_tokens=max(r.budget for r in batch),
                                                  seeds=[r.seed for r in batch], greedy=self.greedy)
            except BaseException as exc:  # the model failed: every caller of this batch hears it
                log.warning("gateway: generation failed for a batch of %d: %s: %s", len(batch), type(exc).__name__, exc)
                for r in batch:
                    r.future.set_exception(exc)
                continue
            for row, r in enumerate(batch):
                ids = out.ids[row][: r.budget]
                logprobs = out.logprobs[row][: r.budget] if out.logprobs is not None else None
                stopped = bool(out.stopped[row]) and len(ids) == len(out.ids[row])
                r.future.set_result(Sampled(list(ids), logprobs, stopped, version))
