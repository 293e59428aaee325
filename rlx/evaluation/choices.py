"""Multiple-choice benchmarks in `rlx eval` (`kind: loglikelihood` in conf/benchmark/*.yaml): questions, seeded
stratified subsets, the scoring pass with resume, and the per-question values the summary bootstraps.

    <eval dir>/<benchmark>/model.jsonl   one line per question: id, stratum, gold, each choice's log-likelihood sum
                                         and length in bytes, the predicted choice (raw and normalised), acc, acc_norm

`limit=N` takes a benchmark's first N questions; `subset=N` a seeded subset of N drawn stratum by stratum in
proportion to the strata (MMLU's subjects; elsewhere the gold choice), the same questions for every model and seed
(`subset_seed`), so paired differences and `rlx report` across seeds compare like with like. The interval of a
subset is wider than the full set's: it says what the subset costs in precision.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np

from rlx.errors import UserError
from rlx.evaluation.loglikelihood import ChoiceQuestion, choice_loglikelihoods, choice_scores
from rlx.evaluation.progress import EvalProgress
from rlx.evaluation.records import drop_partial_line, read_records
from rlx.evaluation.subsets import stratified_indices
from rlx.runtime.rundir import append_text
from rlx.runtime.storage import writing

log = logging.getLogger("rlx")

CHUNK_QUESTIONS = 64  # questions scored and appended to the results file at a time (what an interruption can lose)


def stratified_subset(questions: list[ChoiceQuestion], size: int, seed: int) -> list[ChoiceQuestion]:
    """`size` questions (stratified_indices) by stratum, else by gold choice; in the original order."""
    strata = [q.stratum or f"gold={q.gold}" for q in questions]
    return [questions[i] for i in stratified_indices(strata, size, seed)]


@dataclass(frozen=True)
class ChoiceBenchmark:
    """A log-likelihood benchmark built from its config section: the loader (a dotted function and its keyword
    arguments, returning ChoiceQuestions) and the headline metric (acc or acc_norm)."""

    name: str
    load_spec: dict
    metric: str
    kind = "loglikelihood"
    reader = "log-likelihood"  # the eval table's `read by`: no answer is read, each choice is scored

    def load(self, limit: int | None = None, subset: int | None = None, subset_seed: int = 0) -> list[ChoiceQuestion]:
        from rlx.evaluation.benchmarks import _callable

        questions = _callable(self.load_spec, "load", self.name)()
        if limit:
            questions = questions[:limit]
        if subset:
            questions = stratified_subset(questions, int(subset), subset_seed)
        if not questions:
            raise UserError(f"benchmark '{self.name}' has no questions")
        ids = [q.id for q in questions]
        if len(set(ids)) != len(ids):
            raise UserError(f"benchmark '{self.name}' has duplicate question ids")
        return questions

    @staticmethod
    def values(records: list[dict], ks: list[int], threshold: float) -> dict[str, np.ndarray]:
        return per_question_values(records, ks, threshold)


def question_record(question: ChoiceQuestion, sums: list[float]) -> dict:
    """The results line of one scored question."""
    scores = choice_scores(sums, question.continuations, question.gold)
    return {"id": question.id, "stratum": question.stratum, "gold": question.gold,
            "loglikelihoods": [float(s) for s in sums],
            "bytes": [len(c.encode("utf-8")) for c in question.continuations], **scores}


def per_question_values(records: list[dict], ks: list[int], threshold: float) -> dict[str, np.ndarray]:
    """acc and acc_norm, one value per question (the summary's values_fn for log-likelihood benchmarks)."""
    return {name: np.asarray([r[name] for r in records], dtype=np.float64) for name in ("acc", "acc_norm")}


def run_choice_benchmark(model, tokenizer, bench: ChoiceBenchmark, questions: list[ChoiceQuestion], run,
                         token_budget: int) -> list[dict]:
    """Score every question not yet in `run.results` (an EvalPass), appending its records chunk by chunk; returns
    all records in question order."""
    results = run.results
    done = {r["id"]: r for r in read_records(results)}
    todo = [q for q in questions if q.id not in done]
    if done:
        log.info("%s: %d/%d questions already in %s, scoring the rest", run.label, len(questions) - len(todo),
                 len(questions), results)
    with writing(results.parent, "the results folder"):
        results.parent.mkdir(parents=True, exist_ok=True)
    drop_partial_line(results)
    bar = EvalProgress(run.label, len(questions), len(questions) - len(todo), run.progress, unit="questions")
    running = [r[bench.metric] for r in done.values()]
    try:
        for start in range(0, len(todo), CHUNK_QUESTIONS):
            chunk = todo[start:start + CHUNK_QUESTIONS]
            sums = choice_loglikelihoods(model, tokenizer, chunk, token_budget=token_budget)
            records = [question_record(q, s) for q, s in zip(chunk, sums)]
            append_text(results, "".join(json.dumps(r) + "\n" for r in records),
                        f"the records of {len(chunk)} questions")
            for record in records:
                done[record["id"]] = record
                running.append(record[bench.metric])
            bar.update(len(chunk), sum(len(q.continuations) for q in chunk), bench.metric, float(np.mean(running)))
    finally:
        bar.close()
    return [done[q.id] for q in questions]
