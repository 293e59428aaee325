"""HTTP to the rollout server(s): JSON posts with a timeout and bounded retries, requests spread over URLs, and
the check of each completion answer (token ids, their log-probs, the stop flag) before rlx uses it.

Retrying is safe: a completion request carries its own seed, so the server draws the same tokens on any
attempt (and any server of the list); a weight reload reads the same file again. What is retried: refused or
dropped connections, timeouts, HTTP 5xx and answers that fail the checks (garbage); after
rollout.server.max_retries more attempts (waiting retry_backoff_s, then twice that, ...) the request fails
with RolloutServerError. An HTTP 4xx (the server refuses the request itself, e.g. a prompt longer than
rollout.max_model_len) is not retried. When the child server has exited, no retry is tried.
Standard library only.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlx.errors import NoServerAtVersion, RolloutServerError

if TYPE_CHECKING:
    from rlx.config.groups import ServerSettings

log = logging.getLogger("rlx")


class BadAnswer(ValueError):
    """A server answer rlx cannot use (malformed JSON, missing fields, ids out of range, non-finite log-probs)."""


class Refused(Exception):
    """HTTP 4xx: the server understood the request and rejected it (retrying would not help)."""


class ServerFault(OSError):
    """HTTP 5xx: the server is up and failed this request (retried on the same server first)."""


class RequestRefused(RolloutServerError):
    """A server refused the request itself (HTTP 4xx): no other server would take it either."""

    def __init__(self, message: str):
        super().__init__(message, resumable=False)


def with_retries(call: Callable[[], object], *, retries: int, backoff_s: float, what: str,
                 dead: Callable[[], str | None] = lambda: None, sleep: Callable[[float], None] = time.sleep,
                 give_up: Callable[[BaseException], bool] = lambda exc: False):
    """call() until it returns, at most 1 + retries times, sleeping backoff_s * 2**k before retry k+1.
    RolloutServerError naming `what` and the last failure when every attempt fails, at once when `dead()`
    explains a failure (the child exited: its note is the message) or `give_up(failure)` says so (a fleet
    sends the request elsewhere instead), RequestRefused when the server refused the request."""
    failure = None
    for attempt in range(retries + 1):
        if attempt:
            sleep(backoff_s * 2 ** (attempt - 1))
        try:
            return call()
        except Refused as exc:
            raise RequestRefused(f"the rollout server refused {what}: {exc}") from None
        except (OSError, urllib.error.URLError, http.client.HTTPException, BadAnswer, TimeoutError) as exc:
            # HTTPException: the connection broke mid-answer (IncompleteRead, RemoteDisconnected when the server dies)
            failure = exc
            note = dead()
            if note is not None:
                raise RolloutServerError(f"{note} (while {what})") from None
            if give_up(exc):
                raise RolloutServerError(f"{what} {_kind(exc)}: {_describe(exc)}") from None
    raise RolloutServerError(f"{what} {_kind(failure)} {retries + 1} times, last: {_describe(failure)}") from None


def _kind(exc: BaseException | None) -> str:
    return "timed out" if isinstance(exc, TimeoutError) or "timed out" in str(exc) else "failed"


def unreachable(exc: BaseException) -> bool:
    """Whether a failure says the server is gone rather than that one answer went wrong: a refused or dropped
    connection or a timeout (not HTTP 5xx, not a garbage answer, which the same server is asked again)."""
    return not isinstance(exc, (ServerFault, BadAnswer))


def _describe(exc: BaseException | None) -> str:
    text = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else type(exc).__name__
    return text[:300]


def request_json(url: str, body: dict | None, timeout_s: float, text_ok: bool = False):
    """One POST (GET when body is None) of JSON; the decoded answer (None for an empty body; the text itself
    when it is not JSON and text_ok). HTTP 4xx -> Refused, 5xx -> OSError, undecodable -> BadAnswer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300].replace("\n", " ")
        if 400 <= exc.code < 500:
            raise Refused(f"HTTP {exc.code} {detail}") from None
        raise ServerFault(f"HTTP {exc.code} from {url}: {detail}") from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        if text_ok:
            return raw.decode(errors="replace")
        raise BadAnswer(f"not JSON from {url}: {raw[:120]!r}") from None


def parse_completion(answer, *, max_new_tokens: int, vocab_size: int, stop_ids: list[int],
                     logprobs: bool = True) -> tuple[list[int], list[float], bool]:
    """(token ids, their log-probs, whether a stop token ended the row) of a one-choice /v1/completions answer
    asked with return_token_ids and logprobs=0; BadAnswer when the answer cannot be what was asked: no
    choice, ids not integers in [0, vocab_size), more than max_new_tokens of them, a stop token before the
    end, log-probs missing, of another length, non-finite or above 0."""
    try:
        choice = answer["choices"][0]
        ids = choice["token_ids"]
        if logprobs:
            values = choice["logprobs"]["token_logprobs"]
        else:
            values = [0.0] * len(ids)
    except (KeyError, IndexError, TypeError):
        raise BadAnswer(f"no token ids / log-probs in the answer: {str(answer)[:160]}") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
                                            for t in ids):
        raise BadAnswer(f"token ids outside the vocabulary (size {vocab_size}): {str(ids)[:160]}")
    if len(ids) > max_new_tokens:
        raise BadAnswer(f"{len(ids)} tokens for a budget of {max_new_tokens}")
    stops = set(stop_ids)
    if any(t in stops for t in ids[:-1]):
        raise BadAnswer("a stop token in the middle of a completion")
    if not isinstance(values, list) or len(values) != len(ids):
        raise BadAnswer(f"{len(values) if isinstance(values, list) else 'no'} log-probs for {len(ids)} tokens")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v <= 1e-6 for v in values):
        raise BadAnswer(f"log-probs that are not finite values <= 0: {str(values)[:160]}")
    return ids, [float(v) for v in values], bool(ids) and ids[-1] in stops


@dataclass(frozen=True)
class RequestPolicy:
    """How the client talks to the fleet (rollout.server): a request's timeout, its further attempts and the
    first wait between them, requests in flight over the fleet and on one server, servers the run needs."""

    timeout_s: float
    retries: int = 0
    backoff_s: float = 0.0
    concurrency: int = 64
    per_server: int | None = None  # None: up to `concurrency` on one server
    min_servers: int = 1

    @classmethod
    def of(cls, server: ServerSettings) -> RequestPolicy:
        """From rollout.server (the typed settings)."""
        return cls(timeout_s=float(server.request_timeout_s), retries=int(server.max_retries),
                   backoff_s=float(server.retry_backoff_s), concurrency=int(server.max_concurrency),
                   per_server=int(server.per_server_concurrency), min_servers=int(server.min_servers))


@dataclass(eq=False)
class Member:
    """One inference server of the fleet: its address, whether rlx sends it work, the rows assigned to it and
    not answered yet (its load), how its child process ended (None while it runs, or for a user's URL), and the
    weight version it holds (None before its first stamp, or while it is being moved to another version)."""

    url: str
    index: int
    slots: threading.BoundedSemaphore
    exit_note: Callable[[], str | None] = lambda: None
    live: bool = True
    load: int = 0
    answered: int = 0
    lost_because: str = ""
    version: int | None = None


class ServerClient:
    """Requests to a fleet of one or more servers, with the retry policy above.

    Routing (`routed`): a request goes to the live server with the least load (rows assigned and not answered;
    on a tie, the one with fewer of the call's groups), every request of one key (a prompt's group) to the same
    server, so its prefix cache encodes the prompt once; at most `per_server` requests are in flight on one
    server, `concurrency` over the fleet. Failover: a server
    that cannot be reached (refused or dropped connection, timeout; with another server live) or that keeps
    failing after the retries is dropped from the fleet and its requests go to another server; they carry
    their own seeds, so the tokens do not depend on which server drew them (where the kernels are
    batch-invariant). The run goes on while `min_servers` are live; below that, RolloutServerError (resumable).
    `everywhere` (weight pushes, version stamps) asks every live server and drops those that fail.
    `rejoin(catch_up)` probes the dropped servers' /health and, when one answers, brings it to the current
    version (`catch_up(url)`) before it gets work again. `tolerates_loss=False` (a publisher whose servers
    form one fixed group, e.g. NCCL): losing any server ends the run."""

    def __init__(self, urls: list[str], policy: RequestPolicy, *,
                 exit_notes: list[Callable[[], str | None]] | None = None, tolerates_loss: bool = True):
        self.timeout_s, self.retries, self.backoff_s = policy.timeout_s, policy.retries, policy.backoff_s
        self.min_servers, self.tolerates_loss = max(1, policy.min_servers), tolerates_loss
        notes = exit_notes if exit_notes is not None else [lambda: None] * len(urls)
        limit = int(policy.per_server or policy.concurrency)
        self.members = [Member(str(url), i, threading.BoundedSemaphore(limit), note)
                        for i, (url, note) in enumerate(zip(urls, notes))]
        self.pool = ThreadPoolExecutor(max_workers=policy.concurrency, thread_name_prefix="rlx-rollout-http")
        self._lock = threading.Lock()
        self.failed_attempts = 0  # attempts that failed and were retried (a metric: rollout/server_retries)
        self.failovers = 0  # requests sent to another server after theirs was lost (rollout/server_failovers)
        self.rejoined = 0  # lost servers brought back (rollout/servers_rejoined)

    @property
    def urls(self) -> list[str]:
        """The live servers' addresses, in the order they were given."""
        return [m.url for m in self.members if m.live]

    def member(self, url: str) -> Member:
        return next(m for m in self.members if m.url == url)

    def reserve(self, holding: int | None, count: int) -> list[Member]:
        """Up to `count` live servers that hold version `holding` and have no request in flight, the last ones
        first, taken out of routing (their version None) until they are stamped with another; the rest keep it."""
        with self._lock:
            idle = [m for m in self.members if m.live and m.version == holding and m.load == 0]
            keep = len([m for m in self.members if m.live and m.version == holding]) - 1  # never the last one
            taken = sorted(idle, key=lambda m: -m.index)[: max(0, min(count, keep))]
            for member in taken:
                member.version = None
            return taken

    def call(self, url: str, path: str, body: dict | None, *, what: str, parse: Callable = lambda a: a,
             timeout_s: float | None = None, text_ok: bool = False,
             give_up: Callable[[BaseException], bool] = lambda exc: False):
        """parse(answer of url+path), retried as a whole (a BadAnswer from parse is retried too)."""
        def attempt():
            try:
                return parse(request_json(url + path, body, timeout_s or self.timeout_s, text_ok))
            except (OSError, urllib.error.URLError, BadAnswer, TimeoutError):
                with self._lock:
                    self.failed_attempts += 1
                raise

        note = next((m.exit_note for m in self.members if m.url == url), lambda: None)
        return with_retries(attempt, retries=self.retries, backoff_s=self.backoff_s, what=f"{what} at {url}",
                            dead=note, give_up=give_up)

    def routed(self, key, assigned: dict, path: str, body: dict | None, *, what: str, parse: Callable = lambda a: a,
               version: int | None = None):
        """call() on the server `assigned[key]` (chosen by load when the key is new or its server was lost);
        on the loss of that server, the same request on another one. `version` (not None): only servers that hold
        that weight version take it (NoServerAtVersion when no live one does)."""
        while True:
            member = self._assign(key, assigned, version)
            try:
                with member.slots:
                    answer = self.call(member.url, path, body, what=what, parse=parse,
                                       give_up=lambda exc, m=member: self._elsewhere(m, exc))
                with self._lock:
                    member.answered += 1
                return answer
            except RequestRefused:
                raise
            except RolloutServerError as exc:
                self.lose(member, exc)
                with self._lock:
                    self.failovers += 1
            finally:
                with self._lock:
                    member.load -= 1

    def _elsewhere(self, member: Member, exc: BaseException) -> bool:
        """Whether a request that failed on `member` goes to another server now instead of being retried there:
        the member was lost meanwhile, or it cannot be reached and another server is live."""
        return not member.live or (unreachable(exc) and any(m.live and m is not member for m in self.members))

    def _assign(self, key, assigned: dict, version: int | None = None) -> Member:
        with self._lock:
            member = assigned.get(key)
            if member is None or not member.live or (version is not None and member.version != version):
                live = [m for m in self.members if m.live]
                if not live:
                    raise RolloutServerError(self._quorum_note())
                if version is not None:
                    live = [m for m in live if m.version == version]
                    if not live:
                        raise NoServerAtVersion(f"no live rollout server holds weight version {version}")
                groups = {m.index: 0 for m in live}  # equal loads: the server with fewer of this call's groups
                for chosen in assigned.values():
                    if chosen.index in groups:
                        groups[chosen.index] += 1
                member = assigned[key] = min(live, key=lambda m: (m.load, groups[m.index], m.index))
            member.load += 1
            return member

    def lose(self, member: Member, cause: RolloutServerError) -> None:
        """Drop `member` from the fleet after `cause`; re-raise when the fleet cannot go on without it."""
        with self._lock:
            if member.live:
                member.live, member.lost_because = False, str(cause)
                log.warning("rollout server %s lost (%s); %d of %d live", member.url, cause, len(self.urls),
                            len(self.members))
            live = len(self.urls)
        if len(self.members) == 1:
            raise cause
        if not self.tolerates_loss:
            raise RolloutServerError(f"rollout server {member.url} was lost and the weight publisher cannot go on "
                                     f"without it (its servers form one fixed group): {cause}") from None
        if live < self.min_servers:
            raise RolloutServerError(self._quorum_note()) from None

    def _quorum_note(self) -> str:
        lost = "; ".join(f"{m.url}: {m.lost_because}" for m in self.members if not m.live)
        return (f"{len(self.urls)} of {len(self.members)} rollout servers live, fewer than "
                f"rollout.server.min_servers={self.min_servers} (lost: {lost})")

    def map(self, fn: Callable, items: list) -> list:
        """[fn(item) for item in items], run concurrently. On the first error the requests not started yet are
        cancelled (a failing server is not asked for the rest of the batch); it is raised once the running
        ones have ended."""
        futures = [self.pool.submit(fn, item) for item in items]
        results, error = [], None
        for future in futures:
            try:
                results.append(future.result())
            except CancelledError:
                continue
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the running requests ended
                if error is None:
                    error = exc
                    for pending in futures:
                        pending.cancel()
        if error is not None:
            raise error
        return results

    def each(self, fn: Callable[[str], object], only: list[Member] | None = None) -> list:
        """[fn(url) for every live server (of `only`, when given)], concurrently; a server whose call fails is lost
        (lose()), and the answers of the others are returned."""
        live = [m for m in (self.members if only is None else only) if m.live]
        futures = [(m, self.pool.submit(fn, m.url)) for m in live]
        answers = []
        for member, future in futures:
            try:
                answers.append(future.result())
            except RequestRefused:
                raise
            except RolloutServerError as exc:
                self.lose(member, exc)
        return answers

    def everywhere(self, path: str, body: dict | None, *, what: str, parse: Callable = lambda a: a,
                   timeout_s: float | None = None, text_ok: bool = False) -> list:
        """The same call on every live server, concurrently (each())."""
        return self.each(lambda url: self.call(url, path, body, what=what, parse=parse, timeout_s=timeout_s,
                                               text_ok=text_ok))

    def rejoin(self, catch_up: Callable[[str], None], health_timeout_s: float = 2.0) -> list[str]:
        """Lost servers that answer /health again (and whose child process, if any, still runs), brought to the
        current version by catch_up(url), then live again; their addresses. A catch-up that fails leaves the
        server out until the next try."""
        if not self.tolerates_loss:
            return []
        back = []
        for member in [m for m in self.members if not m.live]:
            if member.exit_note() is not None or not health(member.url, health_timeout_s):
                continue
            try:
                catch_up(member.url)
            except RolloutServerError as exc:
                log.warning("rollout server %s answers again but could not be caught up: %s", member.url, exc)
                continue
            with self._lock:
                member.live, member.lost_because = True, ""
                self.rejoined += 1
            log.info("rollout server %s rejoined; %d of %d live", member.url, len(self.urls), len(self.members))
            back.append(member.url)
        return back

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def health(url: str, timeout_s: float) -> bool:
    """Whether GET url/health answers 200 within timeout_s."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False
