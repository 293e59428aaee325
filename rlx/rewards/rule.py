"""Rule-based reward functions.

Contract (shared with TRL): fn(prompts=, completions=, **row) -> list[float | None], called by keyword,
where every data column arrives as a keyword holding one value per completion; None means "does not
apply". Completions are strings, or [{"role": "assistant", "content": ...}] for a conversational dataset.
"""

from __future__ import annotations

import re

from rlx.rewards import completion_text
from rlx.tasks import extract_answer, verifier_reward  # noqa: F401  (extract_answer: re-exported)

FORMAT_RE = re.compile(r"^\s*<answer>[^<>]+</answer>\s*$", re.DOTALL)


def format_reward(prompts, completions, **row) -> list[float]:
    """1.0 when the whole completion is a single non-empty <answer>...</answer> block, else 0.0."""
    return [1.0 if FORMAT_RE.match(completion_text(c)) else 0.0 for c in completions]


def stated_answer_format(prompts, completions, **row) -> list[float]:
    """1.0 when the completion states its answer outright (an <answer> tag, \\boxed{}, or "the answer is N"), else
    0.0: the format bonus for instruct models that do not write tags. A format signal only, never correctness
    (reward.accuracy names the verifier's component)."""
    from rlx.tasks import stated_answer

    return [1.0 if stated_answer(completion_text(c)) is not None else 0.0 for c in completions]


def exact_match(prompts, completions, answer, **row) -> list[float]:
    """1.0 when the <answer> text equals the reference after whitespace normalisation (verifier "exact")."""
    return verifier_reward(prompts, completions, "exact", answer=answer, **row)


def task_score(prompts, completions, answer, verifier: str | None = None, **row) -> list[float]:
    """The data's own verifier (data.verifier, rlx/tasks): reasoning-gym's scorer for rows generated from a
    reasoning-gym task, exact match otherwise when the data names none."""
    return verifier_reward(prompts, completions, verifier, answer=answer, **row)


def math_equivalence(prompts, completions, answer, **row) -> list[float]:
    """1.0 when math-verify finds the answer (<answer> tag, else the last \\boxed{}) equivalent to the
    reference (verifier "math"; math-verify's signal-based timeouts only run in the main thread)."""
    return verifier_reward(prompts, completions, "math", answer=answer, **row)
