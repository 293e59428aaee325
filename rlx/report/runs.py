"""Find run directories, read their metrics, and group seeds of one configuration together.

A run directory is any folder holding metrics.jsonl (what `rlx train` writes); a sweep directory is
searched recursively. Runs belong to the same configuration when their overrides (overrides.yaml)
are equal once `seed=` (and hydra/sweep selections) are removed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlx.errors import UserError
from rlx.runtime.rundir import read_metrics

# Overrides that do not change the configuration being measured.
_IGNORED_KEYS = ("seed", "sweep", "name")


@dataclass
class Run:
    path: Path
    overrides: list[str]
    seed: int | None
    rows: list[dict]
    final: dict = field(default_factory=dict)  # result.json metrics when present
    failed: str = ""  # the error of failure.json, empty when the run did not fail

    def curve(self, metric: str) -> tuple[list[int], list[float]]:
        """(steps, values) of every logged, finite value of metric."""
        points = [(r["step"], float(r[metric])) for r in self.rows
                  if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
        return [s for s, _ in points], [v for _, v in points]

    def final_value(self, metric: str) -> float | None:
        """The run's final value: result.json if it has the metric, else the last logged value."""
        value = self.final.get(metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        steps, values = self.curve(metric)
        return values[-1] if values else None


@dataclass
class Group:
    key: tuple[str, ...]  # sorted overrides without the seed
    runs: list[Run]
    name: str = ""  # short id shown in tables and legends: c1, c2, ...
    label: str = ""  # the overrides that differ between groups


def config_key(overrides: list[str]) -> tuple[str, ...]:
    kept = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if key in _IGNORED_KEYS or key.startswith("hydra"):
            continue
        kept.append(item)
    return tuple(sorted(kept))


def _seed_of(overrides: list[str], run_dir: Path) -> int | None:
    for item in overrides:
        if item.split("=", 1)[0].lstrip("+") == "seed":
            try:
                return int(item.split("=", 1)[1])
            except ValueError:
                return None
    config = run_dir / "config.yaml"
    if config.is_file():
        from omegaconf import OmegaConf

        return _read(config, OmegaConf.load).get("seed")
    return None


def _read(path: Path, load):
    """load(path), or one line naming the damaged file (bad YAML/JSON, bytes that are not text, wrong shape)."""
    try:
        return load(path)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path} is damaged ({first}); repair or remove it, or leave this run out of the report") from None


def _json_object(path: Path) -> dict:
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"a JSON object was expected, not {type(value).__name__}")
    return value


def load_run(run_dir: Path) -> Run:
    from omegaconf import OmegaConf

    overrides = []
    if (run_dir / "overrides.yaml").is_file():
        overrides = [str(o) for o in _read(run_dir / "overrides.yaml", lambda p: list(OmegaConf.load(p)))]
    final, failed = {}, ""
    if (run_dir / "result.json").is_file():
        final = _read(run_dir / "result.json", _json_object).get("metrics", {})
    if (run_dir / "failure.json").is_file():
        failed = _read(run_dir / "failure.json", _json_object).get("error", "failed")
    return Run(run_dir, overrides, _seed_of(overrides, run_dir), read_metrics(run_dir / "metrics.jsonl"), final, failed)


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run under the given run or sweep directories (a run is a folder with metrics.jsonl or
    failure.json), in path order, each once."""
    found: dict[Path, None] = {}
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            from rlx.errors import UserError

            raise UserError(f"'{path}' is not a directory; pass run or sweep directories written by rlx train")
        candidates = [path] if (path / "metrics.jsonl").is_file() else sorted(
            {p.parent for name in ("metrics.jsonl", "failure.json") for p in path.rglob(name)},
            key=lambda p: [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in p.parts],  # 0/ 1/ test_seeds/0/
        )
        for candidate in candidates:
            found.setdefault(candidate.resolve(), None)
    return [load_run(p) for p in found]


def run_name(path: Path) -> str:
    """A run's name for legends: its folder, with the sweep folder in front of a trial number (`0`)."""
    return f"{path.parent.name}/{path.name}" if path.name.isdigit() else path.name


def short_override(text: str) -> str:
    """`optim.lr=0.00012345678` -> `optim.lr=0.000123`: float values at 3 significant digits, for tables
    (summary.csv keeps the exact overrides)."""
    key, sep, value = text.partition("=")
    if not sep or value.lstrip("-").isdigit():
        return text
    try:
        number = float(value)
    except ValueError:
        return text
    return f"{key}={number:.3g}" if math.isfinite(number) else text


def _short(override: str) -> str:
    """`optim.lr=0.00030000000000000003` -> `optim.lr=0.0003`; `optim.lr=1e-4` stays as written."""
    return min(override, short_override(override), key=len)


def group_runs(runs: list[Run]) -> list[Group]:
    """Groups of runs sharing a configuration, in order of first appearance; each gets a name
    (c1, c2, ...) and a label: the overrides not common to every group (floats at 3 significant
    digits), or, for a single run with none of its own, the run's folder name."""
    groups: dict[tuple[str, ...], Group] = {}
    for run in runs:
        key = config_key(run.overrides)
        groups.setdefault(key, Group(key, [])).runs.append(run)
    ordered = list(groups.values())
    common = set(ordered[0].key).intersection(*(set(g.key) for g in ordered[1:])) if ordered else set()
    for index, group in enumerate(ordered, 1):
        group.name = f"c{index}"
        differing = [_short(o) for o in group.key if o not in common]
        if len(ordered) == 1:
            group.label = run_name(group.runs[0].path) if len(group.runs) == 1 else "all runs"
        elif differing:
            from rlx.report.remarks import short_label

            group.label = short_label(differing)  # aggregates.csv keeps the full overrides
        elif len(group.runs) == 1:
            group.label = run_name(group.runs[0].path)
        else:
            group.label = "defaults" if not group.key else "shared overrides only"
    return ordered


def common_overrides(groups: list[Group]) -> list[str]:
    if not groups:
        return []
    common = set(groups[0].key).intersection(*(set(g.key) for g in groups[1:]))
    return sorted(common)
