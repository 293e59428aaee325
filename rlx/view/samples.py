"""The sample browser's data: the samples files of a run (samples/step_*.jsonl), their completions grouped by
prompt with a verdict per group, the filters, and one prompt followed across the steps."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rlx.view.data import finite_or_none, read_text

SAMPLES_DIR = "samples"


def sample_steps(run_dir: Path) -> list[int]:
    """The steps with a samples file, ascending."""
    folder = Path(run_dir) / SAMPLES_DIR
    if not folder.is_dir():
        return []
    steps = []
    for entry in os.scandir(folder):
        name = entry.name
        if name.startswith("step_") and name.endswith(".jsonl") and name[5:-6].isdigit():
            steps.append(int(name[5:-6]))
    return sorted(steps)


def read_samples(path: Path) -> tuple[list[dict], list[str]]:
    """The records of one samples file and notes (bytes that are not UTF-8, lines that are not JSON)."""
    text, note = read_text(Path(path))
    notes = [note] if note else []
    records = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            last = number >= len(lines) - 1
            notes.append(f"{Path(path).name} line {number} " + ("is being written; shown on the next refresh" if last
                                                                else f"is not JSON ({exc.msg}); left out"))
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, notes


def _verdict(record: dict) -> bool | None:
    """Whether a completion was right: the samples file's `correct`, an episode's `success` (1.0 counts as
    solved, as rlx eval's correct_threshold does by default), else unknown."""
    for key in ("correct", "success"):
        value = record.get(key)
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and math.isfinite(value):
            return value >= 1.0
    return None


def _completion(record: dict) -> dict:
    """One completion (or episode) as the page shows it."""
    components = record.get("components") if isinstance(record.get("components"), dict) else {}
    if "actions" in record:  # an agent episode: its turns with per-turn reward and credit
        observations, actions = record.get("observations") or [], record.get("actions") or []
        rewards = record.get("rewards") or []
        # per turn (loops/credit.py)
        credit = record.get("advantages") if isinstance(record.get("advantages"), list) else []
        turns = [{"observation": observations[i] if i < len(observations) else "", "action": action,
                  "reward": rewards[i] if i < len(rewards) else None, "credit": credit[i] if i < len(credit) else None}
                 for i, action in enumerate(actions)]
        text = "\n".join(str(a) for a in actions)
        reward = sum(r for r in rewards if isinstance(r, (int, float)))
        length, unit = len(actions), "turns"
    else:
        turns, text, reward = None, str(record.get("completion", "")), record.get("reward")
        length, unit = (record["length"], "tokens") if "length" in record else (len(text), "characters")
    return {"text": text, "reward": finite_or_none(reward), "advantage": finite_or_none(record.get("advantage")),
            "length": length, "length_unit": unit,
            "truncated": bool(record.get("truncated")), "correct": _verdict(record), "error": record.get("error"),
            "components": {k: finite_or_none(v) for k, v in components.items()}, "turns": turns}


def _prompt_of(record: dict) -> str:
    if "prompt" in record:
        return str(record["prompt"])
    observations = record.get("observations") or [""]
    return str(observations[0])


def prompt_groups(records: list[dict], group_size: int | None = None) -> list[dict]:
    """The completions of a samples file grouped by prompt: the file's `group` ids when present, else runs of
    equal prompts (G adjacent rows share a prompt), at most `group_size` each when given (two groups in a row
    may share a prompt: an environment's fixed layout). Each group: prompt, answer, completions, and `kind`:
    "right" (all correct), "wrong" (none), "mixed", or "unknown" (no verdicts); tied (all rewards equal);
    truncated (any completion cut by the budget)."""
    groups: list[dict] = []
    for record in records:
        key = record.get("group", _prompt_of(record))
        full = "group" not in record and group_size and groups and len(groups[-1]["completions"]) >= group_size
        if not groups or groups[-1]["key"] != key or full:
            groups.append({"key": key, "prompt": _prompt_of(record), "answer": record.get("answer"), "completions": []})
        groups[-1]["completions"].append(_completion(record))
    for group in groups:
        group["key"] = str(group["key"])
        completions = group["completions"]
        verdicts = [c["correct"] for c in completions]
        if any(v is None for v in verdicts):
            group["kind"] = "unknown"
        else:
            group["kind"] = "right" if all(verdicts) else "wrong" if not any(verdicts) else "mixed"
        rewards = [c["reward"] for c in completions]
        group["tied"] = len(completions) > 1 and len(set(rewards)) == 1
        group["truncated"] = any(c["truncated"] for c in completions)
    return groups


FILTERS = ("all", "wrong", "right", "mixed", "truncated", "tied")


def filter_groups(groups: list[dict], kind: str = "all", query: str = "") -> list[dict]:
    """The groups of one kind (FILTERS) whose prompt, answer or a completion contains `query` (any case)."""
    if kind not in FILTERS:
        raise ValueError(f"unknown filter '{kind}'; one of {', '.join(FILTERS)}")
    query = query.lower()
    kept = []
    for group in groups:
        if kind in ("wrong", "right", "mixed") and group["kind"] != kind:
            continue
        if kind in ("truncated", "tied") and not group[kind]:
            continue
        if query and not any(query in str(text).lower() for text in
                             (group["prompt"], group["answer"], *(c["text"] for c in group["completions"]))):
            continue
        kept.append(group)
    return kept


class SamplesCache:
    """Parsed samples files, re-read only when a file's size or time changes (a live run rewrites none, but
    a file may be caught half-written)."""

    def __init__(self):
        self._files: dict[Path, tuple[tuple, list[dict], list[str]]] = {}

    def groups(self, run_dir: Path, step: int, group_size: int | None = None) -> tuple[list[dict], list[str]]:
        path = Path(run_dir) / SAMPLES_DIR / f"step_{step:06d}.jsonl"
        stat = path.stat()
        stamp = (stat.st_size, stat.st_mtime_ns, group_size)
        cached = self._files.get(path)
        if cached is None or cached[0] != stamp:
            records, notes = read_samples(path)
            cached = self._files[path] = (stamp, prompt_groups(records, group_size), notes)
        return cached[1], cached[2]

    def follow(self, run_dir: Path, prompt: str, group_size: int | None = None) -> list[dict]:
        """One prompt across the steps: [{step, group}] for every samples file that holds it."""
        out = []
        for step in sample_steps(run_dir):
            groups, _ = self.groups(run_dir, step, group_size)
            out += [{"step": step, "group": g} for g in groups if g["prompt"] == prompt]
        return out
