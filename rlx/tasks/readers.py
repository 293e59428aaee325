"""Answer readers: where a completion states its answer. fn(completion: str, problem: dict) -> str | None.

How an answer is found belongs to the model and the prompt it was given (model.answer.reader: a model asked for
<answer> tags writes them; an instruct model asked the bare question says "The answer is 10."); whether it is
right belongs to the task (rlx/tasks VERIFIERS: exact, numeric, math-verify, reasoning-gym's scorer, unit tests).
`rlx.tasks.grader` composes the two. Each reader is registered by name (`@READERS.register("name")`, from a
plugin `@rlx.register("reader", "name")`) and returns None when the completion states no answer it recognises.
"""

from __future__ import annotations

import functools
import re

from rlx.registry import Registry, publish

READERS = publish("reader", Registry("answer reader"))  # name -> fn(completion, problem) -> str | None

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def completion_text(completion) -> str:
    """The text of a completion in either TRL form: a string, or [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion)
    return completion


def extract_answer(completion) -> str | None:
    """The text inside the last <answer>...</answer> pair, stripped; None when there is none."""
    found = ANSWER_RE.findall(completion_text(completion))
    return found[-1].strip() if found else None


@READERS.register("tag")
def answer_tag(completion: str, problem: dict) -> str | None:
    """The text of the last <answer>...</answer> (the format rlx's default prompt asks for)."""
    return extract_answer(completion)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces balanced (MATH-style solutions); None when there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin - 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i].strip()
    return None


@READERS.register("boxed")
def boxed(completion: str, problem: dict) -> str | None:
    """The last \\boxed{...} of the completion."""
    return last_boxed(completion)


@READERS.register("last_number")
def last_number(completion: str, problem: dict) -> str | None:
    """The last number in the text ("-3", "1,200", "2.5"), as written."""
    numbers = _NUMBER_RE.findall(completion)
    return numbers[-1] if numbers else None


@READERS.register("tag_or_last_number")
def answer_tag_or_last_number(completion: str, problem: dict) -> str | None:
    """<answer> tag, else the number after '####', else the last number in the text (GSM8K)."""
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    marked = re.search(r"####\s*(\S+)", completion)
    if marked:
        return marked.group(1)
    return last_number(completion, problem)


@READERS.register("tag_or_boxed")
def answer_tag_or_boxed(completion: str, problem: dict) -> str | None:
    """<answer> tag, else the last \\boxed{...} (MATH-style solutions)."""
    tagged = extract_answer(completion)
    return tagged if tagged is not None else last_boxed(completion)


# "the answer is 10", "answer: 10", "the final answer to this problem is -3.5" (at most 40 characters between)
# A number followed by an operator and another number starts an expression ("The answer is 1 + 7 = 8."): not taken.
_STATED_RE = re.compile(r"answer(?:[^.\n\d]{0,40}?\bis|\s*:|\s*=)\s*\$?\s*(-?\d+(?:,\d{3})*(?:\.\d+)?)"
                        r"(?![\d,.]*\s*[-+*/\u00d7=]\s*-?\d)(?!\d)", re.IGNORECASE)


def stated_answer(completion: str) -> str | None:
    """The answer a completion states outright: the last <answer> tag, else the last \\boxed{...}, else the number
    after the last "answer is" / "answer:" (what an instruct model such as SmolLM2 writes); None otherwise."""
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    found = last_boxed(completion)
    if found is not None:
        return found
    stated = _STATED_RE.findall(completion)
    return stated[-1] if stated else None


@READERS.register("stated")
def stated(completion: str, problem: dict) -> str | None:
    """The answer stated outright (`stated_answer`): <answer> tag, \\boxed{}, or "the answer is N"."""
    return stated_answer(completion)


# An operand of an expression left without its result: "... 0 + 9 =" or "... 9 + 0" (a question echoed back)
_OPERAND_BEFORE_RE = re.compile(r"\d\s*[-+*/\u00d7\u00f7]\s*$")
_OPERAND_AFTER_RE = re.compile(r"\s*[-+*/\u00d7\u00f7=]\s*(?:-?\d|\?|$)")


@READERS.register("final_number")
def final_number(completion: str, problem: dict) -> str | None:
    """The stated answer (`stated_answer`), else the last number in the text: an instruct model's final answer.
    A last number that is an operand of an unfinished expression ("What is 9 + 0 =", "so 4 + 5") is no answer
    (None): an echoed question would otherwise score whenever its last operand equals the sum (x + 0, 0 + x)."""
    said = stated_answer(completion)
    if said is not None:
        return said
    numbers = list(_NUMBER_RE.finditer(completion))
    if not numbers:
        return None
    last = numbers[-1]
    before = completion[:last.start()]
    if last.group().startswith("-") and re.search(r"\d\s*$", before):
        before += "-"  # "8 -3": a binary minus, not a negative number
    if _OPERAND_BEFORE_RE.search(before) or _OPERAND_AFTER_RE.match(completion, last.end()):
        return None
    return last.group()


def choice_letters(problem: dict) -> str:
    """The letters a multiple-choice problem offers: one per entry of its `choices` column (A, B, ...), else A-J."""
    choices = problem.get("choices")
    count = len(choices) if isinstance(choices, (list, tuple)) and choices else 10
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:count]


@READERS.register("letter")
def letter(completion: str, problem: dict) -> str | None:
    """The multiple-choice letter (a capital) a completion picks, among the problem's letters (`choice_letters`):
    in an <answer> tag, else after the last "answer is" / "answer:" ("Answer: B", "the answer is (C)"), else the
    last one in parentheses ("(B)"), else one opening a line ("B." or "B)"), else a completion that is one letter."""
    one = f"([{choice_letters(problem)}])"
    tagged = extract_answer(completion)
    text = tagged if tagged is not None else completion
    for pattern in (rf"(?i:answer)(?:[^.\n]{{0,20}}?\bis|\s*:)\s*\(?{one}\)?(?![A-Za-z])", rf"\({one}\)",
                    rf"(?m)^\s*{one}[.)](?!\w)", rf"^\s*{one}\s*$"):
        found = re.findall(pattern, text)
        if found:
            return found[-1]
    return None


CODE_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")  # end of a completed function body


def code_completion(completion: str, problem: dict, stop: tuple[str, ...] = ()) -> str | None:
    """The program to test: the prompt plus the completion cut at the first stop sequence (the
    Codex protocol: stop at the next top-level def/class/if/print).  A fenced ```python block that
    defines the entry point is taken as the whole program instead (chat models)."""
    fenced = re.findall(r"```(?:python|py)?\n(.*?)```", completion, flags=re.DOTALL)
    for block in reversed(fenced):
        if f"def {problem['entry_point']}" in block:
            return block
    cut = len(completion)
    for marker in stop:
        found = completion.find(marker)
        if found >= 0:
            cut = min(cut, found)
    return problem["prompt"] + completion[:cut]


code = READERS.add("code", functools.partial(code_completion, stop=CODE_STOP), definition=code_completion)


def reader_name(extract) -> str:
    """The registered name of a reader function (a plugin's own extractor: its function name)."""
    for name, fn in READERS.items():
        if fn is extract:
            return name
    return getattr(extract, "__name__", None) or getattr(getattr(extract, "func", None), "__name__", "custom")
