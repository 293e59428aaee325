"""An evaluation's results files: one JSON line per problem or question, appended batch by batch."""

from __future__ import annotations

import json
from pathlib import Path

from rlx.runtime.storage import writing


def read_records(path: Path) -> list[dict]:
    """Finished problems of a results file; a line cut short by an interruption is ignored."""
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def drop_partial_line(path: Path) -> None:
    """Cut a last line left unfinished by an interruption, so appended records start on a new line."""
    if path.is_file():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with writing(path, f"{path.name} without its cut-short last line"):
                path.write_bytes(data[: data.rfind(b"\n") + 1])
