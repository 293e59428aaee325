"""Tasks: one scoring contract for training rewards and `rlx eval` benchmarks.

A verifier is a pair (extract, verify), registered by name in VERIFIERS:

    extract: fn(completion: str, problem: dict) -> str | None        the answer the completion gives (a reader)
    verify:  fn(extracted: list[str | None], problems: list[dict]) -> list[float]   1.0 = correct

A problem is a data row (question, answer, and any other columns: task/metadata for reasoning-gym,
test/entry_point for code). Where an answer is read belongs to the model (model.answer.reader names a reader of
rlx/tasks/readers.py: tag, stated, boxed, last_number, letter, ...); whether it is right belongs to the task (the
verifier's verify). `grader(verifier, reader)` composes the two, once, for both the benchmark (conf/benchmark/*.yaml:
`verifier: <name>`) and, through `verifier_reward`, the training reward component (conf/reward/*.yaml), so training
reward and `rlx eval` score agree on the same completion by construction (tests/test_scoring_contract.py).
Data configs name their task's verifier (`data.verifier`), which the default reward (`reward=task`) uses.
A new task is one verifier (a verify function registered with `@register_verifier("name", extract)`, from a
plugin with `@rlx.register("verifier", "name")`, or an existing name) plus a YAML file."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from dataclasses import dataclass

from rlx.registry import Registry, publish
from rlx.tasks.readers import (  # noqa: F401  (readers: importable from rlx.tasks as before)
    ANSWER_RE,
    CODE_STOP,
    READERS,
    answer_tag,
    answer_tag_or_boxed,
    answer_tag_or_last_number,
    code_completion,
    completion_text,
    extract_answer,
    final_number,
    reader_name,
    stated_answer,
)

# --------------------------------------------------------------------------------------------
# The registry: data.verifier, benchmark.<name>.verifier and the `verifier` of reward=task name an entry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verifier:
    extract: object  # fn(completion, problem) -> str | None: the task's own reader
    verify: object   # fn(extracted, problems) -> list[float]
    needs: tuple = ("answer",)  # problem columns it reads
    own_reader: bool = False  # True: always read by `extract` (a program; a name that promises its reader), never
    # by the model's (model.answer.reader)

    @property
    def reader(self) -> str:
        """The name of the reader `extract` is (rlx/tasks/readers.py READERS), for the eval table."""
        return reader_name(self.extract)

    def score(self, completions: list, problems: list[dict]) -> tuple[list[str | None], list[float]]:
        extracted = [self.extract(completion_text(c), p) for c, p in zip(completions, problems)]
        return extracted, [float(s) for s in self.verify(extracted, problems)]


VERIFIERS = publish("verifier", Registry("verifier"))  # name -> Verifier(extract, verify, needs)


def register_verifier(name: str, extract=answer_tag, needs=("answer",), own_reader: bool = False):
    """Decorator registering a verify function under `name`, paired with its own answer reader (a function or a
    READERS name; default: the <answer> tag), the problem columns it reads, and own_reader=True when it must always
    read with that reader, never a model preset's (`grader`: a program; a name that promises how it reads):
    `@register_verifier("numeric", "tag_or_last_number")`. Returns the function unchanged."""

    def decorate(verify):
        reader = READERS[extract] if isinstance(extract, str) else extract
        VERIFIERS.add(name, Verifier(reader, verify, tuple(needs), bool(own_reader)), definition=verify)
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


@register_verifier("numeric", "tag_or_last_number")
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


@register_verifier("final_number", "final_number", own_reader=True)
def final_number_match(extracted: list[str | None], problems: list[dict]) -> list[float]:
    """Numeric match (as `numeric`) of the answer an instruct model states: the <answer> tag, \\boxed{}, the number
    after "the answer is", else the last number. For models that do not write tags (model=smollm2-135m-instruct)."""
    return numeric_match(extracted, problems)


@register_verifier("math", "tag_or_boxed")
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
        entry = {"question": problem["question"], "answer": problem["answer"],
                 "metadata": json.loads(problem["metadata"])}
        scores.append(float(reasoning_gym.get_score_answer_fn(problem["task"])(answer, entry)))
    return scores


@register_verifier("unit_tests", "code", ("prompt", "test", "entry_point"), own_reader=True)
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
        result = check_program(program, problem["test"], problem["entry_point"], timeout_s=timeout_s,
                               memory_mb=memory_mb)
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


def get_reader(name: str):
    """The reader registered as `name` (rlx/tasks/readers.py); an unknown name: one line with the choices."""
    from rlx.errors import UserError

    if name not in READERS:
        raise UserError(f"unknown answer reader '{name}'; valid choices: {', '.join(READERS)}")
    return READERS[name]


def grader(verifier: str, reader: str | None = None) -> Verifier:
    """The task's check composed with the model's reader: the verifier `verifier` (what is right: exact, numeric,
    math-verify, reasoning-gym's scorer, unit tests) reading answers with the reader `reader` (where the model
    states its answer: model.answer.reader; conf/model/*.yaml). reader None, or a verifier that always reads with
    its own reader (own_reader: unit_tests reads a program; final_number names its reader): the verifier's own. The one
    composition the training reward (`verifier_reward`, reward=task) and `rlx eval` benchmarks both use, so they score a
    completion alike."""
    chosen = get_verifier(verifier)
    if reader is None or chosen.own_reader:
        return chosen
    return dataclasses.replace(chosen, extract=get_reader(reader))


def verifier_reward(prompts, completions, verifier: str | None = None, reader: str | None = None,
                    **columns) -> list[float]:
    """A reward component (TRL keyword contract: one value per completion in every column) that scores
    each completion with a registered verifier read by `reader` (`grader`): exactly the score `rlx eval` gives it.
    verifier None: reasoning-gym's scorer for rows generated from a reasoning-gym task (task and metadata
    columns), exact match otherwise. reader None: the verifier's own reader."""
    if verifier is None:
        generated = any(v is not None for v in columns.get("task") or []) and any(
            v is not None for v in columns.get("metadata") or [])
        verifier = "reasoning_gym" if generated else "exact"
    chosen = grader(verifier, reader)
    missing = [c for c in chosen.needs if c not in columns and c != "prompt"]
    if missing:
        from rlx.errors import UserError

        raise UserError(f"verifier '{verifier}' needs the data column(s) {', '.join(missing)}; map them with "
                        "data.columns")
    problems = [{k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                for i in range(len(completions))]
    for problem, prompt in zip(problems, prompts or [None] * len(problems)):
        problem.setdefault("prompt", prompt if isinstance(prompt, str) else "")
    return chosen.score(completions, problems)[1]
