"""math-verify off the main thread keeps its timeouts (rlx/tasks/math_process.py): the pipeline's producer thread and
evaluation threads score in a worker process whose main thread has the alarms; a hung worker is replaced."""

import subprocess
import sys
import threading

import pytest

pytest.importorskip("math_verify")

from rlx.tasks import (
    math_equivalence,  # noqa: E402
    math_process,  # noqa: E402
)

PROBLEMS = [{"answer": "\\frac{1}{2}"}, {"answer": "3"}, {"answer": "x^2"}, {"answer": "2\\sqrt{2}"}]
ANSWERS = ["0.5", "4", None, "\\sqrt{8}"]


def _in_thread(fn):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()))
    thread.start()
    thread.join()
    return out["value"]


def test_a_thread_scores_what_the_main_thread_scores():
    want = math_equivalence(ANSWERS, PROBLEMS)
    assert want == [1.0, 0.0, 0.0, 1.0]
    assert _in_thread(lambda: math_equivalence(ANSWERS, PROBLEMS)) == want
    assert math_process._worker is not None and math_process._worker.poll() is None  # scored in the worker


def test_a_worker_that_does_not_answer_is_replaced_and_its_pairs_score_0(monkeypatch):
    math_process._stop()
    silent = []

    def start_silent():
        silent.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True))
        return silent[-1]

    monkeypatch.setattr(math_process, "_start", start_silent)
    monkeypatch.setattr(math_process, "TIMEOUT_S", 0)
    assert math_process.verify_pairs([("1", "1")], grace_s=0.5) == [0.0]
    assert silent[0].wait(timeout=10) is not None and math_process._worker is None  # killed, not left behind
    monkeypatch.undo()
    assert math_process.verify_pairs([("1", "1")]) == [1.0]  # a fresh worker
