"""What `rlx report` says beside its numbers, so that it shows no certainty it does not have: intervals it cannot
give (too few runs), comparisons across different tasks, directories it left out and why, the metric an agent
run is judged by, and labels short enough to read.
"""

from __future__ import annotations

import math
from pathlib import Path

# a folder holding one of these was written by an rlx command (Hydra's folder, the run files, a log)
_RUN_MARKERS = (".hydra", "train.log", "eval.log", "config.yaml", "overrides.yaml")


def interval_caveat(n: int, confidence: float = 0.95) -> str | None:
    """Why an interval over n runs is not shown (n < 2) or is rough, else None.

    A percentile bootstrap over n runs can only produce C(2n - 1, n) distinct resamples (multisets of n of
    the n values); when fewer than one of them falls in each (1 - confidence) / 2 tail, the interval's ends
    are set by a handful of resamples and it understates the uncertainty: n = 2 gives 3 distinct
    resamples, n = 4 gives 35 (fewer than 40, one per 2.5% tail at 95%), n = 5 gives 126."""
    if n < 2:
        return f"n={n}: no interval (one run; repeat the configuration over seeds, e.g. -m seed=0,1,2)"
    distinct = math.comb(2 * n - 1, n)
    if distinct * (1 - confidence) / 2 < 1:
        return f"n={n}: rough ({distinct} distinct bootstrap resamples)"
    return None


def pair_caveat(n_x: int, n_y: int) -> str | None:
    """Why P(X > Y) gets no interval: either side has fewer than 2 runs (one run against one run is a single
    comparison, 0, 0.5 or 1, not an estimate of a probability)."""
    if min(n_x, n_y) < 2:
        return f"no interval: {n_x} run(s) against {n_y}; one comparison, not an estimate"
    return None


def _config(run_dir: Path) -> dict | None:
    from omegaconf import OmegaConf

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:
        return None
    return loaded if isinstance(loaded, dict) else None


def task_of(run_dir: Path) -> str | None:
    """What a run was trained and evaluated on, from its config.yaml: `env=grid {size: 4}` for an agent run,
    `data=chain_sum` (with the file or hub id, and the task options) otherwise; None when unknown."""
    config = _config(run_dir)
    if config is None:
        return None
    env = config.get("env")
    if isinstance(env, dict) and env.get("name"):
        name = str(env.get("target") or env["name"]).rpartition(".")[2] if env["name"] == "custom" else env["name"]
        kwargs = env.get("kwargs") or {}
        return f"env={name}" + (f" {_compact(kwargs)}" if kwargs else "")
    data = config.get("data")
    if not isinstance(data, dict) or data.get("source") in (None, "none"):
        return None
    text = f"data={data.get('name')}"
    for key in ("train_path", "id"):
        if data.get(key):
            text += f" {Path(str(data[key])).name if key == 'train_path' else data[key]}"
    if data.get("task_config"):
        text += f" {_compact(data['task_config'])}"
    return text


def _compact(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_compact(v)}" for k, v in sorted(value.items())) + "}"
    return str(value)


def task_remark(tasks: dict[str, str | None]) -> str | None:
    """tasks: configuration id -> task_of its runs. A remark when the configurations compared trained on
    different tasks, else None."""
    known = {name: task for name, task in tasks.items() if task is not None}
    if len(set(known.values())) < 2:
        return None
    listed = ", ".join(f"{name} on {task}" for name, task in known.items())
    return (f"different tasks: {listed}. Their scores come from different held-out sets, so a comparison between "
            f"them measures the tasks as much as the settings.")


def default_metrics(run_dirs: list[Path]) -> tuple[str, ...]:
    """The final metrics to report when --metrics is not given: each run's own optimized metric
    (`optimized_metric`, auto: eval/success for agent runs, eval/pref_accuracy for reward models and task-less
    preference runs, eval/accuracy for the others), in order of first appearance; eval/accuracy when no run says."""
    from rlx.config.rules import optimized_metric

    found = []
    for run_dir in run_dirs:
        config = _config(run_dir) or {}
        family = (config.get("algorithm") or {}).get("family", "policy_gradient")
        source = (config.get("data") or {}).get("source")
        metric = optimized_metric(str(config.get("optimized_metric", "auto")), family, source)
        if metric not in found:
            found.append(metric)
    return tuple(found) or ("eval/accuracy",)


def default_curves(metrics: tuple[str, ...]) -> tuple[str, ...]:
    """Learning curves to draw by default: the reported metrics and the training signal beside them
    (reward/total for single-turn runs, env/success for agent runs)."""
    training = ["env/success" if m == "eval/success" else "reward/total" for m in metrics]
    return tuple(dict.fromkeys([*metrics, *training]))


LABEL_LIMIT = 80  # characters of a configuration's label in tables and legends
VALUE_LIMIT = 32  # characters of one override's value within it


def short_label(overrides: list[str], limit: int = LABEL_LIMIT) -> str:
    """The overrides that tell a configuration apart, short enough for a table cell or a legend: a path value
    shows its last part, a long value is cut with '...', and past `limit` characters the rest is counted
    (`(+3 more)`); aggregates.csv keeps the full overrides."""
    items = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and "/" in value and not value.startswith(("{", "[")):
            value = value.rstrip("/").rpartition("/")[2]
        if sep and len(value) > VALUE_LIMIT:
            value = value[: VALUE_LIMIT - 3] + "..."
        items.append(f"{key}{sep}{value}")
    label = ""
    for index, item in enumerate(items):
        candidate = f"{label} {item}".strip()
        rest = len(items) - index - 1
        if len(candidate) + (len(f" (+{rest} more)") if rest else 0) > limit and label:
            return f"{label} (+{len(items) - index} more)"
        label = candidate
    return label


def skipped_dirs(paths: list[Path], found: list[Path], out: Path | None = None) -> list[tuple[Path, str]]:
    """Folders under `paths` that an rlx command wrote but that hold no run to report, each with the reason:
    an evaluation directory, a run that stopped before its first logged step (with its last log line), or
    nothing but Hydra's files. `found`: the run directories the report uses (their sub-folders are not
    looked at); `out`: the report's own folder."""
    found = {Path(p).resolve() for p in found}
    skipped: dict[Path, str] = {}
    for root in paths:
        root = Path(root)
        if not root.is_dir():
            continue
        candidates = {root} | {p.parent for marker in _RUN_MARKERS for p in root.rglob(marker)}
        for folder in sorted(candidates):
            resolved = folder.resolve()
            if resolved in found or any(parent in found for parent in resolved.parents):
                continue
            if out is not None and (resolved == Path(out).resolve() or Path(out).resolve() in resolved.parents):
                continue
            if folder.name == ".hydra" or not any((folder / m).exists() for m in _RUN_MARKERS):
                continue
            skipped[folder] = _why_skipped(folder)
    return sorted(skipped.items())


def _why_skipped(folder: Path) -> str:
    if (folder / "summary.json").is_file() or (folder / "eval.log").is_file():
        return "an rlx eval directory, not a training run"
    log = folder / "train.log"
    last = ""
    if log.is_file():
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1].split(" - ", 1)[-1].strip() if lines else ""
    if last:
        return f"no metrics.jsonl: the run stopped before its first logged step (last log line: {last[:160]})"
    return "no metrics.jsonl: only start-up files (a command rejected before it started, or still starting)"
