"""An `rlx eval` directory for the page: summary.json and the problems two models disagree on."""

from __future__ import annotations

from pathlib import Path

from rlx.view.data import EVAL_MARKER, read_json
from rlx.view.samples import read_samples


def eval_view(run_dir: Path) -> dict:
    """An `rlx eval` directory: summary.json (per-benchmark values with intervals, paired differences, support
    changes) and, per benchmark with compare=, the problems where the two models disagree, side by side."""
    summary, note = read_json(Path(run_dir) / EVAL_MARKER)
    notes = [note] if note else []
    if not isinstance(summary, dict):
        return {"summary": {}, "disagree": {}, "notes": notes}
    disagree = {}
    for bench in (summary.get("benchmarks") or {}):
        model_file, compare_file = Path(run_dir) / bench / "model.jsonl", Path(run_dir) / bench / "compare.jsonl"
        if not (model_file.is_file() and compare_file.is_file()):
            continue
        model_records, n1 = read_samples(model_file)
        compare_records, n2 = read_samples(compare_file)
        notes += n1 + n2
        disagree[bench] = disagreements(model_records, compare_records)
    return {"summary": summary, "disagree": disagree, "notes": notes}


def _solved(record: dict) -> float | None:
    """A problem's score for the disagreement list: the greedy score, else the fraction of samples scored 1."""
    greedy = record.get("greedy")
    if isinstance(greedy, dict) and isinstance(greedy.get("score"), (int, float)):
        return float(greedy["score"])
    scores = record.get("scores")
    if isinstance(scores, list) and scores:
        return sum(s >= 1.0 for s in scores) / len(scores)
    return None


def disagreements(model_records: list[dict], compare_records: list[dict]) -> list[dict]:
    """Problems (matched by id) where the model and the compare= model score differently: greedy score, or
    without greedy decoding the fraction of samples solved. [{id, prompt, answer, model, compare}]."""
    other = {r.get("id"): r for r in compare_records}
    out = []
    for record in model_records:
        twin = other.get(record.get("id"))
        if twin is None:
            continue
        a, b = _solved(record), _solved(twin)
        if a is None or b is None or a == b:
            continue

        def side(r, score):
            greedy = r.get("greedy") if isinstance(r.get("greedy"), dict) else {}
            return {"score": score, "completion": greedy.get("completion") or ((r.get("samples") or [""])[0]),
                    "extracted": greedy.get("extracted")}

        out.append({"id": record.get("id"), "prompt": record.get("prompt"), "answer": record.get("answer"),
                    "model": side(record, a), "compare": side(twin, b)})
    return out
