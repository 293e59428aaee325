"""Prompt/answer rows for RL and SFT: reasoning-gym tasks, local jsonl/parquet files, hub datasets.

Every loader returns (train_rows, eval_rows), each row a dict with at least
  question  the raw question text
  prompt    the user message (question put through data.prompt_template), or a chat message list
            [{"role": ..., "content": ...}] when the dataset's prompt column holds one (conversational)
  answer    the reference answer (a string)
plus any other columns, which reward functions receive as keyword arguments.
The held-out split never shares a question with the training split.
"""

from __future__ import annotations

import json
import random
import re

from rlx.data.readers import read_hub, read_records
from rlx.errors import UserError
from rlx.registry import Registry, publish


def _is_messages(value) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in value))


def _format_rows(rows: list[dict], prompt_template: str | None) -> list[dict]:
    """row["prompt"]: the user message (the question through the template; the question itself when the
    template is None), or for a conversational row its chat message list as given (system prompts included)."""
    out = []
    for row in rows:
        row = dict(row)
        messages = row.pop("messages", None)
        if messages is not None:
            row["prompt"] = messages
        else:
            row["prompt"] = prompt_template.format(question=row["question"]) if prompt_template else row["question"]
        out.append(row)
    return out


def reasoning_gym_tasks(task, task_config) -> list[tuple[str, dict]]:
    """(task name, its dataset config) for data.task = one name or a list of names. With several tasks,
    data.task_config is null or maps a task name to its options: {gcd: {max_value: 100}}."""
    from reasoning_gym.factory import DATASETS

    names = [task] if isinstance(task, str) else [str(t) for t in task]
    if not names:
        raise UserError("data.task is an empty list; name one reasoning-gym task or several: "
                        "data.task=[gcd,leg_counting]")
    for name in names:
        if name not in DATASETS:
            raise UserError(f"unknown reasoning-gym task '{name}'; valid choices include: "
                            f"{', '.join(sorted(DATASETS)[:40])}, ...")
    config = dict(task_config or {})
    if len(names) == 1:
        return [(names[0], config)]
    stray = sorted(set(config) - set(names))
    if stray:
        raise UserError(f"with several tasks, data.task_config maps a task to its options ({{{names[0]}: {{...}}}}); "
                        f"'{stray[0]}' is not one of {names}")
    return [(name, dict(config.get(name) or {})) for name in names]


def reasoning_gym_entries(tasks: list[tuple[str, dict]], size: int, seed: int) -> list[tuple[str, dict]]:
    """`size` generated problems as (task, entry): several tasks share `size` evenly (the first ones
    take the remainder) and alternate, task by task, so any first N problems mix the tasks."""
    import reasoning_gym

    per_task = []
    for index, (name, config) in enumerate(tasks):
        count = size // len(tasks) + (index < size % len(tasks))
        try:
            per_task.append([(name, entry)
                             for entry in reasoning_gym.create_dataset(name, size=count, seed=seed, **config)]
                            if count else [])
        except TypeError as exc:
            raise UserError(f"bad data.task_config for '{name}': {exc}") from None
    longest = max(len(entries) for entries in per_task)
    return [entries[i] for i in range(longest) for entries in per_task if i < len(entries)]


def reasoning_gym_rows(task, task_config: dict, train_size: int, eval_size: int, seed: int, eval_seed: int):
    """Generate one task or several (data.task=[gcd,leg_counting]) offline; eval questions come from
    eval_seed and are removed from training. Each row keeps its task, so its own scorer checks it."""
    tasks = reasoning_gym_tasks(task, task_config)
    eval_entries = reasoning_gym_entries(tasks, eval_size, eval_seed)
    train_entries = reasoning_gym_entries(tasks, train_size, seed)

    def row(name, entry):
        return {
            "question": entry["question"],
            "answer": str(entry["answer"]),
            "task": name,
            "metadata": json.dumps(entry["metadata"], default=str),
        }

    eval_rows = [row(*e) for e in eval_entries]
    held_out = {r["question"] for r in eval_rows}
    train_rows = [row(*e) for e in train_entries if e[1]["question"] not in held_out]
    if not train_rows:
        raise UserError(f"task '{task}' has no training questions left after removing held-out ones; raise "
                        "data.train_size")
    return train_rows, eval_rows


def _read_table(path: str) -> list[tuple[str, dict]]:
    """Rows of a data file, each with where it came from ('file:line' or 'file row N')."""
    return read_records(path, "set data.train_path / data.eval_path to an existing .jsonl or .parquet")


def _map_columns(rows: list, columns: dict, source: str, answer_regex: str | None = None) -> list[dict]:
    """rows: dicts, or (where, dict) pairs from _read_table for messages that name the line. columns["answer"]
    None: the rows carry no reference answer (rewards that do not need one)."""
    out = []
    wanted = [columns["prompt"]] + ([columns["answer"]] if columns.get("answer") is not None else [])
    for index, item in enumerate(rows):
        where, row = item if isinstance(item, tuple) else (f"{source} row {index}", item)
        missing = [col for col in wanted if col not in row]
        if missing:
            raise UserError(
                f"{where} has no column {missing[0]!r} (columns: {', '.join(row)}); "
                f"set data.columns.prompt / data.columns.answer"
                + ("=null when no reward needs an answer" if missing[0] == columns.get("answer") else "")
            )
        for col in wanted:
            if row[col] is None or (isinstance(row[col], str) and not row[col].strip()):
                raise UserError(f"{where}: column {col!r} is {'null' if row[col] is None else 'empty'}; every row "
                                f"needs a prompt and an answer (fix or drop the row)")
        mapped = dict(row)  # every column stays under its own name: reward functions get them by keyword (TRL)
        prompt = row[columns["prompt"]]
        if _is_messages(prompt):  # a conversational prompt: the chat messages are the prompt, no template
            mapped["messages"] = [dict(m) for m in prompt]
            mapped["question"] = str(next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), ""))
        else:
            mapped["question"] = str(prompt)
        if columns.get("answer") is not None:
            answer = str(row[columns["answer"]])
            if answer_regex:
                match = re.search(answer_regex, answer, flags=re.MULTILINE)
                answer = match.group(1).strip() if match else answer
            mapped["answer"] = answer
        out.append(mapped)
    return out


def split_held_out(rows: list[dict], eval_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Shuffle, take eval_size distinct questions as held out, drop every training row sharing one."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    eval_rows, held_out = [], set()
    for i in order:
        if len(eval_rows) >= eval_size:
            break
        if rows[i]["question"] not in held_out:
            held_out.add(rows[i]["question"])
            eval_rows.append(rows[i])
    train_rows = [r for r in rows if r["question"] not in held_out]
    return train_rows, eval_rows


def file_rows(train_path: str, eval_path: str | None, eval_size: int, columns: dict, seed: int):
    train = _map_columns(_read_table(train_path), columns, train_path)
    if eval_path:
        evals = _map_columns(_read_table(eval_path), columns, eval_path)
        held_out = {r["question"] for r in evals}
        return [r for r in train if r["question"] not in held_out], evals
    questions = len({r["question"] for r in train})
    if eval_size >= questions:
        raise UserError(f"{train_path}: {questions} distinct prompts cannot give data.eval_size={eval_size} held-out "
                        "rows and leave any for training; lower data.eval_size or set data.eval_path")
    return split_held_out(train, eval_size, seed)


def hub_rows(dataset_id: str, subset, train_split: str, eval_split, eval_size: int, columns: dict, seed: int,
             answer_regex):
    loaded = read_hub(dataset_id, subset, None, "save it as jsonl and use data=file data.train_path=...")
    train = _map_columns(list(loaded[train_split]), columns, dataset_id, answer_regex)
    if eval_split:
        evals = _map_columns(list(loaded[eval_split]), columns, dataset_id, answer_regex)[:eval_size]
        held_out = {r["question"] for r in evals}
        return [r for r in train if r["question"] not in held_out], evals
    return split_held_out(train, eval_size, seed)


# data.source: fn(data_cfg, seed) -> (train rows, held-out rows)
DATA_SOURCES = publish("data_source", Registry("data.source"))


@DATA_SOURCES.register("reasoning_gym")
def _reasoning_gym_source(d, seed: int):
    return reasoning_gym_rows(d.task, d.task_config, d.train_size, d.eval_size, seed, d.eval_seed)


@DATA_SOURCES.register("file")
def _file_source(d, seed: int):
    return file_rows(d.train_path, d.eval_path, d.eval_size, dict(d.columns), d.seed)


@DATA_SOURCES.register("hub")
def _hub_source(d, seed: int):
    return hub_rows(d.id, d.subset, d.train_split, d.eval_split, d.eval_size, dict(d.columns), d.seed,
                    getattr(d, "answer_regex", None))


def load_rows(data_cfg, seed: int) -> tuple[list[dict], list[dict]]:
    """Rows from the data.source's reader (DATA_SOURCES), with the prompt template applied."""
    source = data_cfg.source
    if source not in DATA_SOURCES:
        raise UserError(f"unknown data.source '{source}'; valid choices: {', '.join(DATA_SOURCES)}")
    train, evals = DATA_SOURCES[source](data_cfg, seed)
    template = data_cfg.prompt_template
    if source in ("file", "hub"):
        say_template(template, train, getattr(data_cfg, "train_path", None) or getattr(data_cfg, "id", None))
    return _format_rows(train, template), _format_rows(evals, template)


def say_template(template: str | None, rows: list[dict], source: str) -> str | None:
    """One log line when data.prompt_template changes the user's own prompts (a file or hub dataset), saying
    what it adds and how to turn it off; None (and no line) when it leaves them as they are."""
    import logging

    if not template or template == "{question}" or not any("messages" not in row for row in rows[:1]):
        return None
    if template.startswith("{question}"):
        change = f"appends {template[len('{question}'):]!r} to every prompt of {source}"
    else:
        change = f"puts every prompt of {source} into {template!r}"
    line = (f"data.prompt_template {change} (the default reward reads <answer> tags); data.prompt_template=null "
            f"keeps the prompts as they are")
    logging.getLogger("rlx").info("%s", line)
    return line

