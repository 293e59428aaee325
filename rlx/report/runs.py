"""Find run directories, read their metrics, and group seeds of one configuration together.

A run directory is any folder holding metrics.jsonl (what `rlx train` writes); a sweep directory is
searched recursively. Runs belong to the same configuration when their overrides (overrides.yaml)
are equal once `seed=` (and hydra/sweep selections) are removed.

An evaluation directory (`rlx eval`'s summary.json) counts as a run too: its final values are the summary's
metrics, `<benchmark>/<metric>` and, with compare=, the paired difference `<benchmark>/<metric>/diff`, plus over a
suite's benchmarks the macro mean of their headline metrics (`suite/headline`, `suite/headline/diff`: the summary's
`suite`, rlx/evaluation/runner.py: suite_summary). An evaluation of a
training run (run=...) takes that run's overrides and seed, so `rlx report outputs/eval/...` groups the evaluations
of one training configuration's seeds together, whatever their run directories are called.
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
# An evaluation's overrides that name what is evaluated rather than how (the trained run's own overrides stand for it)
_EVAL_SUBJECT_KEYS = ("run", "resume", "progress")


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
        raise UserError(f"{path} is damaged ({first}); repair or remove it, or leave this run out of the "
                        "report") from None


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


def is_eval_dir(path: Path) -> bool:
    return ((path / "summary.json").is_file() and (path / "config.yaml").is_file()
            and not (path / "metrics.jsonl").is_file())


def eval_finals(summary: dict) -> dict[str, float]:
    """The final values of an evaluation (module docstring) from its summary.json content."""
    final = {}
    for bench, result in summary.get("benchmarks", {}).items():
        for metric, entry in result.get("model", {}).items():
            final[f"{bench}/{metric}"] = float(entry["value"])
        for metric, entry in result.get("diff", {}).items():
            if isinstance(entry, dict):
                final[f"{bench}/{metric}/diff"] = float(entry["value"])
    suite = summary.get("suite") or {}
    if suite.get("model"):  # rlx/evaluation/runner.py: suite_summary
        final["suite/headline"] = float(suite["model"]["value"])
        if suite.get("diff"):
            final["suite/headline/diff"] = float(suite["diff"]["value"])
    return final


def eval_metrics(eval_dir: Path) -> list[str]:
    """The metrics an evaluation is reported by: each benchmark's headline, as the paired difference when the
    evaluation has compare=, then suite/headline(/diff) for several benchmarks."""
    summary = _read(eval_dir / "summary.json", _json_object)
    final = eval_finals(summary)
    names = []
    for bench, result in summary.get("benchmarks", {}).items():
        headline = result.get("headline") or next(
            (m for m in ("greedy/accuracy", "pass@1", "greedy/success", "success") if m in result.get("model", {})),
            None)
        if headline is not None:
            name = f"{bench}/{headline}"
            names.append(f"{name}/diff" if f"{name}/diff" in final else name)
    if "suite/headline" in final:
        names.insert(0, "suite/headline/diff" if "suite/headline/diff" in final else "suite/headline")
    return names


def load_eval(eval_dir: Path) -> Run:
    """An evaluation directory as a Run without curves (module docstring)."""
    from omegaconf import OmegaConf

    overrides = []
    if (eval_dir / "overrides.yaml").is_file():
        overrides = [str(o) for o in _read(eval_dir / "overrides.yaml", lambda p: list(OmegaConf.load(p)))]
    config = _read(eval_dir / "config.yaml", OmegaConf.load)
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in _EVAL_SUBJECT_KEYS]
    seed = _seed_of(overrides, eval_dir)
    trained = config.get("run")
    if trained and Path(str(trained)).is_dir():
        run = load_run(Path(str(trained))) if (Path(str(trained)) / "metrics.jsonl").is_file() else None
        if run is not None:
            kept = [f"train:{o}" for o in run.overrides if o.split("=", 1)[0].lstrip("+~") != "seed"] + kept
            seed = run.seed
    summary = _read(eval_dir / "summary.json", _json_object)
    return Run(eval_dir, kept, seed, [], eval_finals(summary))


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run under the given run or sweep directories (a run is a folder with metrics.jsonl or
    failure.json; an evaluation directory, with summary.json, is read by load_eval), in path order, each once."""
    found: dict[Path, None] = {}
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            from rlx.errors import UserError

            raise UserError(f"'{path}' is not a directory; pass run or sweep directories written by rlx train")
        candidates = [path] if (path / "metrics.jsonl").is_file() or is_eval_dir(path) else sorted(
            {p.parent for name in ("metrics.jsonl", "failure.json", "summary.json") for p in path.rglob(name)
             if name != "summary.json" or is_eval_dir(p.parent)},
            # 0/ 1/ test_seeds/0/
            key=lambda p: [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in p.parts],
        )
        for candidate in candidates:
            found.setdefault(candidate.resolve(), None)
    return [load_eval(p) if is_eval_dir(p) else load_run(p) for p in found]


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
