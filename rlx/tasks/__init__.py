"""Tasks: one scoring contract for training rewards and `rlx eval` benchmarks.

A verifier is a pair (extract, verify), registered by name in VERIFIERS:

    extract: fn(completion: str, problem: dict) -> str | None        the answer the completion gives
    verify:  fn(extracted: list[str | None], problems: list[dict]) -> list[float]   1.0 = correct

A problem is a data row (question, answer, and any other columns: task/metadata for reasoning-gym,
test/entry_point for code). The same pair scores a benchmark (conf/benchmark/*.yaml: `verifier: <name>`)
and, through `verifier_reward`, a training reward component (conf/reward/*.yaml), so training reward and
`rlx eval` score agree on the same completion by construction (tests/test_scoring_contract.py).
Data configs name their task's verifier (`data.verifier`), which the default reward (`reward=task`) uses.
A new task is one verifier (a verify function registered with `@register_verifier("name", extract)`, from a
plugin with `@rlx.register("verifier", "name")`, or an existing name) plus a YAML file.
"""

from __future__ import annotations

import functools
import json
import math
import re
import threading
from dataclasses import dataclass

from rlx.registry import Registry, publish

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def completion_text(completion) -> str:
    """The text of a completion in either TRL form: a string, or [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion)
    return completion


def extract_answer(completion) -> str | None:
    """The text inside the last <answer>...</answer> pair, stripped; None when there is none."""
    found = ANSWER_RE.findall(completion_text(completion))
    return found[-1].strip() if found else None


# --------------------------------------------------------------------------------------------
# Answer extractors: fn(completion, problem) -> str | None
# --------------------------------------------------------------------------------------------

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def answer_tag(completion: str, problem: dict) -> str | None:
    """The text of the last <answer>...</answer> (the format rlx trains for)."""
    return extract_answer(completion)


def answer_tag_or_last_number(completion: str, problem: dict) -> str | None:
    """<answer> tag, else the number after '####', else the last number in the text (GSM8K)."""
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    marked = re.search(r"####\s*(\S+)", completion)
    if marked:
        return marked.group(1)
    numbers = _NUMBER_RE.findall(completion)
    return numbers[-1] if numbers else None


def _last_boxed(text: str) -> str | None:
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


def answer_tag_or_boxed(completion: str, problem: dict) -> str | None:
    """<answer> tag, else the last \\boxed{...} (MATH-style solutions)."""
    tagged = extract_answer(completion)
    return tagged if tagged is not None else _last_boxed(completion)


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
    boxed = _last_boxed(completion)
    if boxed is not None:
        return boxed
    stated = _STATED_RE.findall(completion)
    return stated[-1] if stated else None


# An operand of an expression left without its result: "... 0 + 9 =" or "... 9 + 0" (a question echoed back)
_OPERAND_BEFORE_RE = re.compile(r"\d\s*[-+*/\u00d7\u00f7]\s*$")
_OPERAND_AFTER_RE = re.compile(r"\s*[-+*/\u00d7\u00f7=]\s*(?:-?\d|\?|$)")


def final_number(completion: str, problem: dict) -> str | None:
    """The stated answer (`stated_answer`), else the last number in the text: an instruct model's final answer.
    A last number that is an operand of an unfinished expression ("What is 9 + 0 =", "so 4 + 5") is no answer
    (None): an echoed question would otherwise score whenever its last operand equals the sum (x + 0, 0 + x)."""
    stated = stated_answer(completion)
    if stated is not None:
        return stated
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


# --------------------------------------------------------------------------------------------
# The registry: data.verifier, benchmark.<name>.verifier and the `verifier` of reward=task name an entry
# --------------------------------------------------------------------------------------------


CODE_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")  # end of a completed function body


@dataclass(frozen=True)
class Verifier:
    extract: object  # fn(completion, problem) -> str | None
    verify: object   # fn(extracted, problems) -> list[float]
    needs: tuple = ("answer",)  # problem columns it reads

    def score(self, completions: list, problems: list[dict]) -> tuple[list[str | None], list[float]]:
        extracted = [self.extract(completion_text(c), p) for c, p in zip(completions, problems)]
        return extracted, [float(s) for s in self.verify(extracted, problems)]


VERIFIERS = publish("verifier", Registry("verifier"))  # name -> Verifier(extract, verify, needs)


def register_verifier(name: str, extract=answer_tag, needs=("answer",)):
    """Decorator registering a verify function under `name`, paired with its answer extractor (default: the
    <answer> tag) and the problem columns it reads: `@register_verifier("numeric", answer_tag_or_last_number)`.
    Returns the function unchanged."""

    def decorate(verify):
        VERIFIERS.add(name, Verifier(extract, verify, tuple(needs)), definition=verify)
        return verify

    return decorate


# --------------------------------------------------------------------------------------------
# Verifiers: fn(extracted, problems) -> list[float], registered in this order
# --------------------------------------------------------------------------------------------


def _normalize(text: str) -> str:
    return " ".join(str(text).split())


@register_verifier("exact")
def exact_string(extracted: list[str | None], problems: list[dict]) -> list[float]:
    """1.0 when the answer equals the reference after whitespace normalisation."""
    return [1.0 if answer is not None and _normalize(answer) == _normalize(problem["answer"]) else 0.0
            for answer, problem in zip(extracted, problems)]


def _as_number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    if cleaned.endswith("%"):
        cleaned = cleaned[:-1]
    try:
        return float(cleaned)
    except ValueError:
        return None


@register_verifier("numeric", answer_tag_or_last_number)
def numeric_match(extracted: list[str | None], problems: list[dict], rel_tol: float = 1e-6) -> list[float]:
    """1.0 when the answer and the reference parse to the same number (commas, '$', '%' ignored);
    otherwise exact string match after whitespace normalisation."""
    scores = []
    for answer, problem in zip(extracted, problems):
        if answer is None:
            scores.append(0.0)
            continue
        got, want = _as_number(answer), _as_number(problem["answer"])
        if got is not None and want is not None:
            scores.append(1.0 if math.isclose(got, want, rel_tol=rel_tol, abs_tol=1e-9) else 0.0)
        else:
            scores.append(1.0 if " ".join(answer.split()) == " ".join(problem["answer"].split()) else 0.0)
    return scores


@register_verifier("final_number", final_number)
def final_number_match(extracted: list[str | None], problems: list[dict]) -> list[float]:
    """Numeric match (as `numeric`) of the answer an instruct model states: the <answer> tag, \\boxed{}, the number
    after "the answer is", else the last number. For models that do not write tags (model=smollm2-135m-instruct)."""
    return numeric_match(extracted, problems)


@register_verifier("math", answer_tag_or_boxed)
def math_equivalence(extracted: list[str | None], problems: list[dict]) -> list[float]:
    """1.0 when math-verify finds the answer equivalent to the reference (LaTeX or plain).
    Its timeouts use signal.alarm, which only works in the main thread: elsewhere (pipeline mode's producer thread,
    evaluation threads) the pairs go to a worker process that keeps them (rlx/tasks/math_process.py)."""
    from rlx.tasks.math_process import verify_one, verify_pairs

    pairs = [(answer, problem["answer"]) for answer, problem in zip(extracted, problems) if answer is not None]
    if threading.current_thread() is threading.main_thread():
        scored = iter([verify_one(answer, reference) for answer, reference in pairs])
    else:
        scored = iter(verify_pairs(pairs))
    return [0.0 if answer is None else next(scored) for answer in extracted]


@register_verifier("reasoning_gym", needs=("answer", "question", "task", "metadata"))
def reasoning_gym_score(extracted: list[str | None], problems: list[dict]) -> list[float]:
    """reasoning-gym's own scorer of each task (1.0 for a correct answer)."""
    import reasoning_gym

    scores = []
    for answer, problem in zip(extracted, problems):
        if answer is None:
            scores.append(0.0)
            continue
        entry = {"question": problem["question"], "answer": problem["answer"], "metadata": json.loads(problem["metadata"])}
        scores.append(float(reasoning_gym.get_score_answer_fn(problem["task"])(answer, entry)))
    return scores


@register_verifier("unit_tests", functools.partial(code_completion, stop=CODE_STOP), ("prompt", "test", "entry_point"))
def unit_tests(extracted: list[str | None], problems: list[dict], timeout_s: float = 5.0, memory_mb: int = 512,
               workers: int = 4) -> list[float]:
    """Run each program against its problem's tests in the sandbox (rlx.sandbox), a few at
    a time; 1.0 when every assert holds within the limits.  Broken or hostile programs score 0."""
    from concurrent.futures import ThreadPoolExecutor

    from rlx.sandbox import check_program

    def one(pair) -> float:
        program, problem = pair
        if program is None:
            return 0.0
        result = check_program(program, problem["test"], problem["entry_point"], timeout_s=timeout_s, memory_mb=memory_mb)
        return 1.0 if result.passed else 0.0

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="rlx-eval-verify") as pool:
        return list(pool.map(one, zip(extracted, problems)))


# --------------------------------------------------------------------------------------------
# The bridge to the reward contract
# --------------------------------------------------------------------------------------------


def get_verifier(name: str) -> Verifier:
    from rlx.errors import UserError

    if name not in VERIFIERS:
        raise UserError(f"unknown verifier '{name}'; valid choices: {', '.join(VERIFIERS)}")
    return VERIFIERS[name]


def verifier_reward(prompts, completions, verifier: str | None = None, **columns) -> list[float]:
    """A reward component (TRL keyword contract: one value per completion in every column) that scores
    each completion with a registered verifier: exactly the score `rlx eval` gives it.
    verifier None: reasoning-gym's scorer for rows generated from a reasoning-gym task (task and metadata
    columns), exact match otherwise."""
    if verifier is None:
        generated = any(v is not None for v in columns.get("task") or []) and any(
            v is not None for v in columns.get("metadata") or [])
        verifier = "reasoning_gym" if generated else "exact"
    chosen = get_verifier(verifier)
    missing = [c for c in chosen.needs if c not in columns and c != "prompt"]
    if missing:
        from rlx.errors import UserError

        raise UserError(f"verifier '{verifier}' needs the data column(s) {', '.join(missing)}; map them with data.columns")
    problems = [{k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                for i in range(len(completions))]
    for problem, prompt in zip(problems, prompts or [None] * len(problems)):
        problem.setdefault("prompt", prompt if isinstance(prompt, str) else "")
    return chosen.score(completions, problems)[1]
