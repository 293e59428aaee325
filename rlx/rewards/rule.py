"""Rule-based reward functions.

Contract (shared with TRL): fn(prompts=, completions=, **row) -> list[float | None], called by keyword,
where every data column arrives as a keyword holding one value per completion; None means "does not
apply". Completions are strings, or [{"role": "assistant", "content": ...}] for a conversational dataset.
"""

from __future__ import annotations

import json
import re
import threading

from rlx.rewards import completion_text

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FORMAT_RE = re.compile(r"^\s*<answer>[^<>]+</answer>\s*$", re.DOTALL)


def extract_answer(completion: str) -> str | None:
    """The text inside the last <answer>...</answer> pair, stripped; None when there is none."""
    found = ANSWER_RE.findall(completion_text(completion))
    return found[-1].strip() if found else None


def format_reward(prompts, completions, **row) -> list[float]:
    """1.0 when the whole completion is a single non-empty <answer>...</answer> block, else 0.0."""
    return [1.0 if FORMAT_RE.match(completion_text(c)) else 0.0 for c in completions]


def _normalize(text: str) -> str:
    return " ".join(str(text).split())


def exact_match(prompts, completions, answer, **row) -> list[float]:
    """1.0 when the extracted answer equals the reference after whitespace normalisation."""
    scores = []
    for completion, reference in zip(completions, answer):
        extracted = extract_answer(completion)
        scores.append(1.0 if extracted is not None and _normalize(extracted) == _normalize(reference) else 0.0)
    return scores


def task_score(prompts, completions, answer, task=None, metadata=None, question=None, **row) -> list[float]:
    """reasoning-gym's own scorer for rows generated from a reasoning-gym task, exact match otherwise."""
    if task is None or metadata is None:
        return exact_match(prompts, completions, answer)
    import reasoning_gym

    scores = []
    for i, completion in enumerate(completions):
        entry = {"question": question[i] if question else "", "answer": answer[i], "metadata": json.loads(metadata[i])}
        scorer = reasoning_gym.get_score_answer_fn(task[i])
        extracted = extract_answer(completion)
        scores.append(float(scorer(extracted, entry)) if extracted is not None else 0.0)
    return scores


def math_equivalence(prompts, completions, answer, **row) -> list[float]:
    """1.0 when math-verify finds the extracted answer equivalent to the reference (LaTeX or plain).

    math-verify times out with signal.alarm, which only works in the main thread; elsewhere its
    timeouts are disabled (callers in worker threads bound the time themselves)."""
    from math_verify import parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if in_main else None
    scores = []
    for completion, reference in zip(completions, answer):
        extracted = extract_answer(completion)
        if extracted is None:
            scores.append(0.0)
            continue
        gold = parse(f"${reference}$", parsing_timeout=timeout)
        pred = parse(f"${extracted}$", parsing_timeout=timeout)
        ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=timeout)
        scores.append(1.0 if ok else 0.0)
    return scores
