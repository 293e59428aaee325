"""math-verify off the main thread, with its timeouts.

math-verify bounds parse() and verify() with signal.alarm, which Python allows in the main thread only; elsewhere
(the producer thread of pipeline mode, evaluation threads) they would run unbounded, and one pathological answer
could hang the run. `verify_pairs` sends (answer, reference) pairs to one worker process (`python -m
rlx.tasks.math_process`, a JSON line per request on its stdin) whose main thread runs math-verify with its own
alarms: the same scores and the same 5-second bounds as in the main thread. A worker that does not answer in time
(it died, or an alarm did not fire) is killed and replaced, and the pairs of that request score 0: the run goes on.
The worker dies with this process (its stdin closes, and it is killed at exit).
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import threading

TIMEOUT_S = 5  # math-verify's own bound on parse() and verify(), as in the main thread

_lock = threading.Lock()
_worker: subprocess.Popen | None = None


def verify_one(answer: str, reference: str, timeout: int | None = TIMEOUT_S) -> float:
    """1.0 when math-verify finds `answer` equivalent to `reference` (both LaTeX or plain), in this process."""
    from math_verify import parse, verify

    gold = parse(f"${reference}$", parsing_timeout=timeout)
    pred = parse(f"${answer}$", parsing_timeout=timeout)
    return 1.0 if gold and pred and verify(gold, pred, timeout_seconds=timeout) else 0.0


def _stop() -> None:
    global _worker
    if _worker is not None:
        _worker.kill()
        _worker.wait()
        _worker = None


def _start() -> subprocess.Popen:
    atexit.register(_stop)
    return subprocess.Popen([sys.executable, "-m", "rlx.tasks.math_process"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)


def verify_pairs(pairs: list[tuple[str, str]], grace_s: float = 60.0) -> list[float]:
    """Scores of (answer, reference) pairs computed in the worker process (see the module docstring). The worker
    gets 2 x TIMEOUT_S per pair plus `grace_s` (its start-up) before it is replaced."""
    global _worker
    if not pairs:
        return []
    with _lock:
        if _worker is None or _worker.poll() is not None:
            _worker = _start()
        try:
            _worker.stdin.write(json.dumps(pairs) + "\n")
            _worker.stdin.flush()
            ready, _, _ = select.select([_worker.stdout], [], [], grace_s + 2 * TIMEOUT_S * len(pairs))
            line = _worker.stdout.readline() if ready else ""
            scores = json.loads(line) if line else None
        except (OSError, ValueError):
            scores = None
        if not isinstance(scores, list) or len(scores) != len(pairs):
            _stop()
            return [0.0] * len(pairs)
        return [float(s) for s in scores]


def serve() -> None:
    """The worker: one JSON list of [answer, reference] pairs per line in, one JSON list of scores per line out."""
    for line in sys.stdin:
        pairs = json.loads(line)
        print(json.dumps([verify_one(answer, reference) for answer, reference in pairs]), flush=True)


if __name__ == "__main__":
    serve()
