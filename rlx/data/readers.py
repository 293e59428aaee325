"""The one file and hub reader behind training data, preference pairs and benchmarks.

`read_records(path, missing_hint)` reads .jsonl, .jsonl.gz, .json (a list of objects, or JSON lines) and
.parquet, and returns (where, row) pairs, where `where` names the row in error messages ('file:line' or
'file row N'). Every fault is one line naming the file (and line and column when there is one): a missing
file, bytes that are not UTF-8, a line that is not JSON or not an object, an empty file.
`read_hub(dataset_id, subset, split, fallback_hint)` loads a hub dataset (cached copies work offline) with
one line saying what to do when it cannot.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from rlx.errors import UserError

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def _decode(data: bytes, path: str) -> str:
    """UTF-8 text; a leading byte-order mark (Windows editors write one) is dropped."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UserError(f"{path}:{line}:{column}: byte 0x{data[exc.start]:02x} is not UTF-8; re-save the file as "
                        f"UTF-8") from None


def numbered_jsonl(text: str, source: str) -> list[tuple[int, dict]]:
    """(line number, object) for every non-empty line; a bad line is one error naming source:line:column."""
    rows = []
    # lines end at \n only (a \r before it is JSON whitespace): str.splitlines would also cut at characters that
    # JSON strings may hold raw, such as U+2028 (LINE SEPARATOR) or \x1c, pasted in from web pages
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{source}:{number}:{exc.colno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{source}:{number}:1: a JSON {type(row).__name__}, not an object; each line must be "
                                f'one object such as {{"prompt": "...", "answer": "..."}}')
            rows.append((number, row))
    if not rows:
        raise UserError(f"{source}: the file holds no rows (empty); point the config at a data file")
    return rows


def read_records(path: str, missing_hint: str, kind: str = "data file") -> list[tuple[str, dict]]:
    """(where, row) for every row of a data file. missing_hint: what to do when the file is absent; kind:
    how messages name the file (data file, benchmark file, preference file)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"{kind} '{path}' not found; {missing_hint}")
    name = file.name
    if name.endswith(".parquet"):
        import datasets

        rows = list(datasets.Dataset.from_parquet(str(file)))
        if not rows:
            raise UserError(f"{path}: the file holds no rows (empty)")
        return [(f"{path} row {i + 1}", row) for i, row in enumerate(rows)]
    if not name.endswith(SUFFIXES):
        raise UserError(f"{kind} '{path}' must end in {', '.join(SUFFIXES)}")
    data = file.read_bytes()
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    text = _decode(data, path)
    if name.endswith(".json") and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        if bad is not None:
            raise UserError(f"{path}: item {bad} is a JSON {type(rows[bad]).__name__}, not an object")
        if not rows:
            raise UserError(f"{path}: the file holds no rows (empty)")
        return [(f"{path} item {i}", row) for i, row in enumerate(rows)]
    return [(f"{path}:{number}", row) for number, row in numbered_jsonl(text, path)]


def read_hub(dataset_id: str, subset, split: str | None, fallback_hint: str):
    """A hub dataset (all splits when split is None); one line with `fallback_hint` when it cannot load."""
    import datasets

    try:
        return (datasets.load_dataset(dataset_id, subset, split=split) if split
                else datasets.load_dataset(dataset_id, subset))
    except Exception as exc:  # offline, unknown id, no cache
        raise UserError(f"cannot load hub dataset '{dataset_id}'{f' split {split!r}' if split else ''} "
                        f"({type(exc).__name__}); download it with network access first (it is then cached), "
                        f"or {fallback_hint}") from None
