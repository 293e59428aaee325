"""A dataset handed to the Python API (`rlx.fit(..., dataset=rows)`): a list of dicts, a `datasets.Dataset`,
or a `datasets.DatasetDict` (its train split, and its test or validation split as the held-out rows), written
as JSONL into the run directory and trained as `data=file`, so the run stays reproducible from its folder.

As in TRL, the `prompt` column is the prompt (a string or a chat message list) and every other column reaches
the reward functions under its own name; an `answer` column is needed only by what reads one (the default task
reward, SFT), and with reward functions given the prompts are used as they are (no data.prompt_template).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from rlx.errors import UserError

EVAL_FRACTION = 10  # without an eval split, 1 row in 10 (at most data.eval_size's 200) is held out


def dataset_rows(dataset, what: str = "dataset") -> list[dict]:
    """The rows of a list of dicts, a datasets.Dataset (or any iterable of mappings) as plain dicts."""
    if isinstance(dataset, (str, bytes, Mapping)) or not isinstance(dataset, Iterable):
        raise UserError(f"{what}= takes a list of dicts or a datasets.Dataset, not {type(dataset).__name__}")
    rows = []
    for index, row in enumerate(dataset):
        if not isinstance(row, Mapping):
            raise UserError(f"{what}= row {index} is a {type(row).__name__}, not a dict of columns")
        rows.append(dict(row))
    if not rows:
        raise UserError(f"{what}= has no rows")
    return rows


def split_dataset_dict(dataset, eval_dataset):
    """(train, eval) from a datasets.DatasetDict: its `train` split, and `test` or `validation` unless an
    eval_dataset is given; anything else passes through."""
    keys = getattr(dataset, "keys", None)
    if not callable(keys) or isinstance(dataset, Mapping) and not hasattr(dataset, "column_names"):
        return dataset, eval_dataset
    splits = list(dataset.keys())
    if "train" not in splits:
        raise UserError(f"dataset= is a DatasetDict without a 'train' split (splits: {', '.join(splits)}); pass "
                        f"dataset=ds['<split>']")
    held_out = eval_dataset if eval_dataset is not None else next((dataset[s] for s in ("test", "validation")
                                                                   if s in splits), None)
    return dataset["train"], held_out


def write_jsonl(rows: list[dict], path: Path, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for index, row in enumerate(rows):
        try:
            lines.append(json.dumps(row, ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            bad = next((k for k, v in row.items() if not _jsonable(v)), "?")
            raise UserError(f"{what}= row {index}: column {bad!r} cannot be written as JSON ({exc}); give plain "
                            f"strings, numbers, lists or dicts") from None
    path.write_text("\n".join(lines) + "\n")


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _given(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in overrides)


def _quoted(path: Path) -> str:
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def dataset_overrides(dataset, eval_dataset, folder: Path, overrides: list[str], has_rewards: bool) -> list[str]:
    """Write the rows under `folder` (train.jsonl, eval.jsonl) and return the overrides that train on them."""
    if _given(overrides, "data") or _given(overrides, "data.train_path"):
        raise UserError("give the data either as dataset= or as data=... overrides, not both")
    dataset, eval_dataset = split_dataset_dict(dataset, eval_dataset)
    train = dataset_rows(dataset)
    out = ["data=file", f"data.train_path={_quoted(folder / 'train.jsonl')}"]
    write_jsonl(train, folder / "train.jsonl", "dataset")
    if eval_dataset is not None:
        write_jsonl(dataset_rows(eval_dataset, "eval_dataset"), folder / "eval.jsonl", "eval_dataset")
        out.append(f"data.eval_path={_quoted(folder / 'eval.jsonl')}")
    elif not _given(overrides, "data.eval_size"):
        out.append(f"data.eval_size={min(200, max(1, len(train) // EVAL_FRACTION))}")
    if "answer" not in train[0] and not _given(overrides, "data.columns.answer"):
        out.append("data.columns.answer=null")  # only what reads an answer needs one (rlx/data/answers.py)
    if has_rewards and not _given(overrides, "data.prompt_template"):
        out.append("data.prompt_template=null")  # TRL: the prompt column as it is
    return out
