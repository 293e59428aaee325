"""Rows without a reference answer (`data.columns.answer=null`, or a dataset handed to `rlx.fit` without an
answer column): allowed when nothing reads one, refused at start-up, in one line, when something does."""

from __future__ import annotations

import inspect

from rlx.errors import UserError


def reads_answer(fn) -> bool:
    """Whether a reward function (or functools.partial) requires an `answer` keyword (no default)."""
    try:
        parameter = inspect.signature(fn).parameters.get("answer")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def check_answers(rows: list[dict], components, family: str) -> None:
    """Stop when the rows carry no answer and the run needs one: a reward component that reads `answer` (the
    task verifier, exact match, math) or SFT (its target is the answer through data.completion_template)."""
    if not rows or "answer" in rows[0]:
        return
    if family == "sft":
        raise UserError("SFT trains on the answer (data.completion_template) and the data has no answer column; set "
                        "data.columns.answer=<column>")
    needing = [c.name for c in components if reads_answer(c.fn)]
    if needing:
        raise UserError(f"reward component(s) {', '.join(needing)} read the answer column and the data has none "
                        f"(data.columns.answer is null); name the column (data.columns.answer=solution) or use rewards "
                        f"that do not need it (rlx.fit(..., rewards=[...]) replaces the configured ones)")
