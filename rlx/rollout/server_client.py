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
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor

from rlx.errors import RolloutServerError


class BadAnswer(ValueError):
    """A server answer rlx cannot use (malformed JSON, missing fields, ids out of range, non-finite log-probs)."""


class Refused(Exception):
    """HTTP 4xx: the server understood the request and rejected it (retrying would not help)."""


def with_retries(call: Callable[[], object], *, retries: int, backoff_s: float, what: str,
                 dead: Callable[[], str | None] = lambda: None, sleep: Callable[[float], None] = time.sleep):
    """call() until it returns, at most 1 + retries times, sleeping backoff_s * 2**k before retry k+1.
    RolloutServerError naming `what` and the last failure when every attempt fails, at once when `dead()`
    explains a failure (the child exited: its note is the message) or the server refused the request."""
    failure = None
    for attempt in range(retries + 1):
        if attempt:
            sleep(backoff_s * 2 ** (attempt - 1))
        try:
            return call()
        except Refused as exc:
            raise RolloutServerError(f"the rollout server refused {what}: {exc}", resumable=False) from None
        except (OSError, urllib.error.URLError, http.client.HTTPException, BadAnswer, TimeoutError) as exc:
            # HTTPException: the connection broke mid-answer (IncompleteRead, RemoteDisconnected when the server dies)
            failure = exc
            note = dead()
            if note is not None:
                raise RolloutServerError(f"{note} (while {what})") from None
    kind = "timed out" if isinstance(failure, TimeoutError) or "timed out" in str(failure) else "failed"
    raise RolloutServerError(f"{what} {kind} {retries + 1} times, last: {_describe(failure)}") from None


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
        raise OSError(f"HTTP {exc.code} from {url}: {detail}") from None
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


class ServerClient:
    """Requests to one or more servers, with the retry policy above, `concurrency` at a time."""

    def __init__(self, urls: list[str], *, timeout_s: float, retries: int, backoff_s: float, concurrency: int,
                 dead: Callable[[], str | None] = lambda: None):
        self.urls, self.timeout_s, self.retries, self.backoff_s = list(urls), timeout_s, retries, backoff_s
        self.dead = dead
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="rlx-rollout-http")
        self._lock = threading.Lock()
        self.failed_attempts = 0  # attempts that failed and were retried (a metric: rollout/server_retries)

    def call(self, url: str, path: str, body: dict | None, *, what: str, parse: Callable = lambda a: a,
             timeout_s: float | None = None, text_ok: bool = False):
        """parse(answer of url+path), retried as a whole (a BadAnswer from parse is retried too)."""
        def attempt():
            try:
                return parse(request_json(url + path, body, timeout_s or self.timeout_s, text_ok))
            except (OSError, urllib.error.URLError, BadAnswer, TimeoutError):
                with self._lock:
                    self.failed_attempts += 1
                raise

        return with_retries(attempt, retries=self.retries, backoff_s=self.backoff_s, what=f"{what} at {url}",
                            dead=self.dead)

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

    def everywhere(self, path: str, body: dict | None, *, what: str, parse: Callable = lambda a: a,
                   timeout_s: float | None = None, text_ok: bool = False) -> list:
        """The same call on every server, concurrently."""
        return self.map(lambda url: self.call(url, path, body, what=what, parse=parse, timeout_s=timeout_s,
                                              text_ok=text_ok), self.urls)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
