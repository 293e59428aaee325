"""What `rlx view` reads from run directories, as plain dicts and lists the page draws: the runs, their metrics,
their configs (samples.py: the samples files; evals.py: rlx eval directories).

Only what runs already write is read: metrics.jsonl, samples/step_*.jsonl, config.yaml, overrides.yaml,
env.json, failure.json (`rlx train`), summary.json and <benchmark>/{model,compare}.jsonl (`rlx eval`).
Every reader tolerates what a live or damaged run leaves: a last line still being written is read on the
next poll, a damaged line is left out with a note, bytes that are not UTF-8 are replaced with a note.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlx.report.runs import config_key, run_name
from rlx.runtime.rundir import flatten_settings

TRAIN_MARKERS = ("metrics.jsonl", "failure.json")
EVAL_MARKER = "summary.json"


@dataclass
class ViewRun:
    """One run directory: `kind` "train" (metrics.jsonl) or "eval" (summary.json)."""

    id: str
    path: Path
    kind: str
    name: str
    overrides: list[str]
    seed: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def config_group(self) -> tuple[str, ...]:
        """Seeds of one configuration share this key (report's grouping: overrides without seed and name)."""
        return config_key(self.overrides)


def _is_run(path: Path) -> str | None:
    if (path / EVAL_MARKER).is_file():
        return "eval"
    if any((path / name).is_file() for name in TRAIN_MARKERS):
        return "train"
    return None


def _natural(path: Path) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts]


def discover(paths: list[Path]) -> tuple[list[ViewRun], list[str]]:
    """Every training and evaluation run under the given run or sweep directories, in path order, each once,
    and a note for each given directory that holds no run (the page says so; the others are still shown)."""
    found: dict[Path, str] = {}
    notes = []
    for path in map(Path, paths):
        kind = _is_run(path)
        if kind:
            found.setdefault(path.resolve(), kind)
            continue
        inside = sorted({p.parent for name in (*TRAIN_MARKERS, EVAL_MARKER) for p in path.rglob(name)}, key=_natural)
        inside = [p for p in inside if _is_run(p)]
        if not inside:
            notes.append(f"{path} is not a run: no metrics.jsonl (rlx train) or summary.json (rlx eval) in it or "
                         f"below it; pass a run, eval or sweep directory")
        for run_dir in inside:
            found.setdefault(run_dir.resolve(), _is_run(run_dir))
    runs = [_load(index, run_dir, kind) for index, (run_dir, kind) in enumerate(found.items())]
    return runs, notes


def _load(index: int, run_dir: Path, kind: str) -> ViewRun:
    notes = []
    overrides = []
    if (run_dir / "overrides.yaml").is_file():
        loaded, note = _yaml(run_dir / "overrides.yaml")
        overrides = [str(o) for o in loaded] if isinstance(loaded, list) else []
        notes += [note] if note else []
    seed = None
    for item in overrides:
        if item.split("=", 1)[0].lstrip("+") == "seed":
            seed = int(item.split("=", 1)[1]) if item.split("=", 1)[1].lstrip("-").isdigit() else None
    if (run_dir / "failure.json").is_file():
        failure, note = read_json(run_dir / "failure.json")
        notes.append("the run failed: "
                     f"{failure.get('error', 'see failure.json')}" if isinstance(failure, dict) else note)
    return ViewRun(f"r{index}", run_dir, kind, run_name(run_dir), overrides, seed, notes)


def read_text(path: Path) -> tuple[str, str]:
    """The file's text and a note when bytes that are not UTF-8 were replaced (or '')."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        return data.decode("utf-8", errors="replace"), (f"{path.name}: bytes that are not UTF-8 (first at byte "
                                                        f"{exc.start}) are shown as \ufffd")


def _yaml(path: Path):
    try:
        text, note = read_text(path)
        return yaml.safe_load(text), note
    except Exception as exc:  # a damaged file is a note, the page keeps working
        return None, f"{path.name} is damaged ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"


def read_json(path: Path):
    try:
        text, note = read_text(path)
        return json.loads(text), note
    except Exception as exc:
        return None, f"{path.name} is damaged ({exc})"


# ---------------------------------------------------------------------------------------------------- metrics
def finite_or_none(value):
    """A metric value for the page: numbers stay, NaN/inf and non-numbers become None (the curve has a gap)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    return None


class MetricsTail:
    """metrics.jsonl read incrementally: each update() reads only the bytes appended since the last one, and
    keeps a last line without its newline (a row being written) for the next update.

    Rows are kept as parsed (NaN/inf replaced by None while parsing: json's parse_constant hook, so a
    finite row costs nothing extra); `columns` are built on demand, one list per metric aligned with the
    rows (None where a row lacks the metric or its value was not finite). nonfinite counts NaN/inf values per
    metric (left out of the curves); notes name damaged lines (left out)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.line = 0
        self.parsed: list[dict] = []
        self.names: dict[str, None] = {}  # metric names in order of first appearance
        self.nonfinite: dict[str, int] = {}
        self.first_nonfinite: dict[str, int] = {}
        self.notes: list[str] = []
        self.pending = False  # a last line without its newline is waiting
        self._columns: tuple[int, dict] = (-1, {})
        self._constants = 0  # NaN / Infinity / -Infinity seen by the parser
        self._decoder = json.JSONDecoder(parse_constant=self._constant)

    @property
    def rows(self) -> int:
        return len(self.parsed)

    @property
    def step(self) -> list[int]:
        return [row["step"] for row in self.parsed]

    @property
    def time(self) -> list[float | None]:
        return [finite_or_none(row.get("time")) for row in self.parsed]

    @property
    def columns(self) -> dict[str, list]:
        if self._columns[0] != self.rows:
            self._columns = (self.rows, {name: [row.get(name) for row in self.parsed] for name in self.names})
        return self._columns[1]

    def update(self) -> int:
        """Read what was appended; returns the number of new rows."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return 0
        if size < self.offset:  # the file was replaced (a run restarted in place): read it again
            self.__init__(self.path)
        if size == self.offset:
            return 0
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read(size - self.offset)
        end = data.rfind(b"\n")
        self.pending = end != len(data) - 1
        if end < 0:
            return 0
        self.offset += end + 1
        before = self.rows
        lines = data[:end].split(b"\n")
        self._add_lines(lines)
        self.line += len(lines)
        return self.rows - before

    def _constant(self, text: str):
        self._constants += 1
        return None

    def _add_lines(self, lines: list[bytes]) -> None:
        """Parse the lines as one JSON array (one call into json's C parser); a damaged line sends the chunk
        through line by line, so the notes name it."""
        seen = self._constants
        body = b",".join(line for line in lines if line.strip())
        try:
            rows = self._decoder.decode("[" + body.decode("utf-8", errors="replace") + "]")
        except json.JSONDecodeError:
            rows = None
        if rows is None or not all(type(row) is dict and type(row.get("step")) is int for row in rows):
            self._constants = seen
            rows = [row for number, line in enumerate(lines, self.line + 1) if (row := self._row(line, number))]
        if self._constants != seen:  # non-finite values: counted, and gaps in their curves
            for row in rows:
                for name, value in row.items():
                    if value is None:
                        self.nonfinite[name] = self.nonfinite.get(name, 0) + 1
                        self.first_nonfinite.setdefault(name, row["step"])
        if b"true" in body or b"false" in body or b': "' in body:  # a value that is not a number: a gap
            rows = [{k: v if k == "step" else finite_or_none(v) for k, v in row.items()} for row in rows]
        for row in rows:
            self.names.update(dict.fromkeys(row))
        self.names.pop("step", None)
        self.names.pop("time", None)
        self.parsed.extend(rows)

    def _row(self, line: bytes, number: int) -> dict | None:
        if not line.strip():
            return None
        try:
            row = self._decoder.decode(line.decode("utf-8", errors="replace"))
        except json.JSONDecodeError as exc:
            self.notes.append(f"metrics.jsonl line {number} is not JSON ({exc.msg}); left out")
            return None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            self.notes.append(f"metrics.jsonl line {number} is not a row with a step; left out")
            return None
        return row

    def since(self, start: int) -> dict:
        """The rows from `start` on, column by column (what the page appends to its curves)."""
        rows = self.parsed[start:]
        return {"start": start, "rows": self.rows, "step": [r["step"] for r in rows],
                "time": [r.get("time") for r in rows],
                "metrics": {name: [r.get(name) for r in rows] for name in self.names},
                "pending": self.pending, "notes": list(self.notes)}

    def curve(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the finite values of one metric."""
        points = [(row["step"], row[name]) for row in self.parsed if row.get(name) is not None]
        return [s for s, _ in points], [v for _, v in points]


# (group title, docs anchor, name patterns): a metric joins the first group with a matching pattern; groups are
# shown in this order. The same grouping is documented in docs/view.md#curves.
METRIC_GROUPS = (
    ("Accuracy", "accuracy", ("reward/accuracy", "eval/accuracy", "eval/task", "*success*", "eval/*accuracy*")),
    ("Reward and its components", "reward", ("reward/*", "eval/reward", "env/return", "env/*reward*")),
    ("Lengths", "lengths", ("completions/*", "*length*", "*truncated*", "env/turns*", "*budget*")),
    ("KL", "kl", ("*kl*",)),
    ("Entropy", "entropy", ("*entropy*",)),
    ("Clip fractions", "clip-fractions", ("*clip_frac*",)),
    ("Gradient norm", "gradient-norm", ("*grad_norm*",)),
    ("Staleness", "staleness", ("rollout/*",)),
    ("Throughput", "throughput", ("perf/*",)),
    ("Loss, advantages and the rest", "other", ("*",)),
)


def metric_group(name: str) -> str:
    """The title of the group a metric is drawn in (METRIC_GROUPS: first matching pattern wins)."""
    for title, _, patterns in METRIC_GROUPS:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return title
    return METRIC_GROUPS[-1][0]


def group_metrics(names) -> list[dict]:
    """[{title, anchor, metrics}] in METRIC_GROUPS order, metrics sorted by name, empty groups left out."""
    members: dict[str, list[str]] = {}
    for name in names:
        members.setdefault(metric_group(name), []).append(name)
    return [{"title": title, "anchor": anchor, "metrics": sorted(members[title])}
            for title, anchor, _ in METRIC_GROUPS if title in members]


def seed_bands(tails: list[MetricsTail], metrics) -> dict:
    """Mean over seeds with its Student-t band, metric by metric, on the steps every seed logged: rlx report's
    band (rlx.report.stats.seed_band), not a second implementation.
    Returns {metric: {step, mean, low, high}}; a metric some seed lacks is left out."""
    from rlx.report.stats import seed_band

    out = {}
    for name in metrics:
        band = seed_band([tail.curve(name) for tail in tails])
        if band is not None:
            steps, mean, low, high, _ = band
            out[name] = {"step": steps.tolist(), "mean": mean.tolist(), "low": low.tolist(), "high": high.tolist()}
    return out


# ---------------------------------------------------------------------------------------------------- config
def run_config(run: ViewRun) -> dict:
    """The run's resolved config, overrides, command line (env.json) and notes about damaged files."""
    config, note = _yaml(run.path / "config.yaml") if (run.path / "config.yaml").is_file() else ({}, "")
    env, env_note = read_json(run.path / "env.json") if (run.path / "env.json").is_file() else ({}, "")
    command = env.get("command") if isinstance(env, dict) else None
    if isinstance(command, list) and command:  # env.json names the Hydra app: rlx-train, rlx-eval
        command = [str(command[0]).replace("rlx-", "rlx ", 1), *map(str, command[1:])]
    text = read_text(run.path / "config.yaml")[0] if (run.path / "config.yaml").is_file() else ""
    return {"config": config if isinstance(config, dict) else {}, "overrides": run.overrides, "text": text,
            "command": " ".join(command) if isinstance(command, list) else "",
            "env": env if isinstance(env, dict) else {}, "notes": [n for n in (note, env_note) if n]}


def config_diff(a: dict, b: dict) -> list[dict]:
    """The settings that differ between two configs: [{key, a, b}] sorted by key (a missing key is None)."""
    flat_a, flat_b = flatten_settings(a), flatten_settings(b)
    return [{"key": key, "a": flat_a.get(key), "b": flat_b.get(key)} for key in sorted(set(flat_a) | set(flat_b))
            if flat_a.get(key) != flat_b.get(key)]


def samples_per_step(config: dict) -> int | None:
    """Completions sampled per step (prompts_per_step x rollout.samples_per_prompt): the x axis in samples."""
    prompts = config.get("prompts_per_step")
    per_prompt = ((config.get("rollout") or {}).get("samples_per_prompt") if isinstance(config.get("rollout"), dict)
                  else None)
    if isinstance(prompts, int) and isinstance(per_prompt, int):
        return prompts * per_prompt
    return None
