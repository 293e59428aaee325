"""`rlx recipes`: the reproduced configurations in recipes/, and `make reproduce`.

A recipe is a `# @package _global_` YAML whose header comments give the command (`# rlx train NAME`),
a one-line description (the first comment after the command), the source paper (`# Source:`), the
hardware (`# Hardware:`) and the numbers it should reproduce (`# Expected:`). CPU-scale recipes
(names ending in `_tiny`) also carry a machine-readable block that training ignores:

    expected:
      metric: eval/accuracy   # final metric compared
      value: 0.60             # mean over seeds it should reach (null: not measured yet)
      tolerance: 0.08         # |measured mean - value| allowed

`rlx recipes reproduce` runs each CPU-scale recipe on seeds 0-2 (a multirun per recipe, as a
subprocess), compares the mean final metric with `expected`, writes the table to <out>/reproduce.md and,
with --update-results, into benchmarks/results/recipes_tiny.json (the docs' results page renders it). It
exits 1 when a recipe is outside its tolerance or a run failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from rlx.config.paths import RECIPES_DIR, REPO_DIR
from rlx.errors import UserError

RESULTS_FILE = "benchmarks/results/recipes_tiny.json"  # in the checkout (REPO_DIR); a table file of the docs


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def recipe_path(name: str) -> Path:
    valid = recipe_names()
    if name not in valid:
        import difflib

        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UserError(f"unknown recipe '{name}'{hint}; valid choices: {', '.join(valid)}")
    return RECIPES_DIR / f"{name}.yaml"


def header(name: str) -> dict:
    """The header comments of a recipe: command, description, source, hardware, expected (text)."""
    comments = []
    for line in recipe_path(name).read_text().splitlines():
        if not line.startswith("#"):
            break
        comments.append(line[1:])
    info = {"command": "", "description": "", "source": "", "hardware": "", "expected": ""}
    field = None
    for raw in comments[1:]:  # comments[0] is "@package _global_"
        line, lowered = raw.strip(), raw.strip().lower()
        if line.startswith(f"rlx train {name}"):
            info["command"], field = line, None
        elif any(lowered.startswith(k + ":") for k in ("source", "hardware", "expected")):
            field = lowered.split(":", 1)[0]
            info[field] = line.split(":", 1)[1].strip()
        elif field is not None and raw.startswith("   "):  # an indented line continues the field above
            info[field] += " " + line
        elif field == "description" and raw.startswith("   "):  # the description's own continuation
            info["description"] += " " + line
        else:
            field = None
            if not info["description"] and info["command"]:
                info["description"], field = line, "description"
    return info


def first_sentence(text: str) -> str:
    """Text up to the first sentence end: a "." followed by a space or the end, or a ";" (a "." inside a
    number or a name, as in `1.5B` or `Qwen2.5`, is not one)."""
    return re.split(r"\.(?=\s|$)|;", text, maxsplit=1)[0].strip()


def expected(name: str) -> dict | None:
    """The recipe's `expected:` block, or None."""
    block = OmegaConf.load(recipe_path(name)).get("expected")
    return OmegaConf.to_container(block) if block is not None else None


def cpu_recipes() -> list[str]:
    return [n for n in recipe_names() if n.endswith("_tiny")]


def list_recipes() -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="recipes (rlx train NAME; rlx recipes show NAME)")
    table.add_column("name")
    table.add_column("hardware")
    table.add_column("description", overflow="fold")
    for name in recipe_names():
        info = header(name)
        hardware = info["hardware"] or info["command"].partition("(")[2].rstrip(")")
        table.add_row(name, first_sentence(hardware), info["description"])
    console = Console()
    if not console.is_terminal:
        console.width = 160
    console.print(table)


def final_values(sweep_dir: Path, metric: str) -> tuple[list[float], int]:
    """Final values of metric over the finished trials of a multirun, and the number of failed trials."""
    values, failed = [], 0
    for trial in sorted(p for p in sweep_dir.iterdir() if p.is_dir()) if sweep_dir.is_dir() else []:
        if (trial / "failure.json").is_file():
            failed += 1
        elif (trial / "result.json").is_file():
            value = json.loads((trial / "result.json").read_text())["metrics"].get(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                values.append(float(value))
    return values, failed


def compare(values: list[float], spec: dict) -> dict:
    """Mean, std and IQM CI of the values against spec {metric, value, tolerance}."""
    from rlx.report.stats import stratified_bootstrap_ci

    row = {"metric": spec["metric"], "expected": spec.get("value"), "tolerance": spec.get("tolerance", 0.0),
           "seeds": len(values), "status": "no result"}
    if not values:
        return row
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    iqm, low, high = stratified_bootstrap_ci(values, "iqm")
    row.update(mean=mean, std=std, iqm=iqm, ci_low=low, ci_high=high)
    if spec.get("value") is None:
        row["status"] = "not yet expected"
    else:
        row["status"] = "ok" if abs(mean - spec["value"]) <= row["tolerance"] + 1e-9 else (
            "HIGHER" if mean > spec["value"] else "LOWER")
    return row


def run_recipe(name: str, seeds: int, out_dir: Path, extra: list[str]) -> subprocess.CompletedProcess:
    """`rlx train -m NAME seed=0,...,seeds-1` into out_dir, as a subprocess."""
    args = [sys.executable, "-m", "rlx", "train", "-m", name, f"seed={','.join(map(str, range(seeds)))}",
            f"hydra.sweep.dir={out_dir}", *extra]
    print("$ " + " ".join(args[2:]), flush=True)
    return subprocess.run(args)


def table_markdown(rows: list[dict], seeds: int) -> str:
    lines = [f"| recipe | metric | expected (± tol) | measured mean ± std ({seeds} seeds) | IQM [95% CI] | status |",
             "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(table_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def table_cells(row: dict) -> list[str]:
    """One table row as text cells: recipe, metric, expected (± tol), mean ± std, IQM [CI], status."""
    def f(value):
        return f"{value:.3f}" if isinstance(value, float) else "-"

    expected_text = "-" if row["expected"] is None else f"{row['expected']:.2f} ± {row['tolerance']:.2f}"
    measured = f"{f(row.get('mean'))} ± {f(row.get('std'))}" if "mean" in row else "-"
    iqm = f"{f(row.get('iqm'))} [{f(row.get('ci_low'))}, {f(row.get('ci_high'))}]" if "iqm" in row else "-"
    return [row["recipe"], row["metric"], expected_text, measured, iqm, row["status"]]


def _machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or platform.machine()) \
        if Path("/proc/cpuinfo").is_file() else (platform.processor() or platform.machine())
    return f"{os.cpu_count()} CPU cores ({model}), {platform.system()}"


def write_results_table(rows: list[dict], seeds: int, command: str, path: Path | None = None,
                        date: str | None = None) -> bool:
    """Put the rows as the newest table of the results file (date, machine, load, command beside them),
    removing the re-run recipes' rows from its older tables (and tables left empty): only current figures
    stay. False when there is no checkout to write into."""
    path = path or (REPO_DIR / RESULTS_FILE if REPO_DIR is not None else None)
    if path is None:
        return False
    data = json.loads(path.read_text()) if path.is_file() else {
        "title": "CPU-scale recipes (make reproduce)", "section": "Training on the tiny model", "order": 40,
        "tables": []}
    rerun = {row["recipe"] for row in rows}
    kept = []
    for table in data.get("tables", []):
        table["rows"] = [r for r in table["rows"] if r[0] not in rerun]
        if table["rows"]:
            kept.append(table)
    load1, load5, _ = os.getloadavg()
    newest = {"caption": f"{', '.join(sorted(rerun))} on {seeds} seeds",
              "date": date or datetime.date.today().isoformat(), "machine": _machine(),
              "load": f"load average {load1:.1f} (1 min) / {load5:.1f} (5 min) at the end", "command": command,
              "columns": ["recipe", "metric", "expected (± tol)", f"measured mean ± std ({seeds} seeds)",
                          "IQM [95% CI]", "status"],
              "rows": [table_cells(row) for row in rows]}
    data["tables"] = [newest, *kept]
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return True


def reproduce(names: list[str], seeds: int, out_root: Path, extra: list[str], reuse: bool,
              write_results: bool) -> list[dict]:
    rows = []
    for name in names:
        spec = expected(name)
        if spec is None:
            raise UserError(f"recipe '{name}' has no expected: block; add one (see rlx/cli/recipes.py) or leave it out")
        out_dir = out_root / name
        values, failed = final_values(out_dir, spec["metric"])
        if not (reuse and len(values) >= seeds):
            run_recipe(name, seeds, out_dir, extra)
            values, failed = final_values(out_dir, spec["metric"])
        row = compare(values, spec)
        row["recipe"] = name
        if failed:
            row["status"] += f" ({failed} failed)"
        rows.append(row)
    table = table_markdown(rows, seeds)
    print(table)
    (out_root / "reproduce.md").parent.mkdir(parents=True, exist_ok=True)
    (out_root / "reproduce.md").write_text(table)
    if write_results:
        command = "rlx recipes reproduce " + " ".join([*names, *(f"--set {o}" for o in extra)])
        print(f"{RESULTS_FILE} updated" if write_results_table(rows, seeds, command) else
              f"no checkout to write {RESULTS_FILE} into; the table is in {out_root / 'reproduce.md'}")
    return rows


def recipes_command(args: list[str]) -> None:
    if not args or args[0] == "list":
        list_recipes()
        return
    if args[0] in ("-h", "--help"):
        print("usage: rlx recipes [list] | rlx recipes show NAME | rlx recipes reproduce [NAME ...] [--seeds 3]")
        return
    if args[0] == "show":
        if len(args) != 2:
            raise UserError("usage: rlx recipes show NAME")
        print(recipe_path(args[1]).read_text(), end="")
        return
    if args[0] == "reproduce":
        parser = argparse.ArgumentParser(prog="rlx recipes reproduce",
                                         description="Run CPU-scale recipes on several seeds and check their expected "
                                                     "numbers.")
        parser.add_argument("names", nargs="*", help="recipes (default: every *_tiny recipe)")
        parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per recipe (default: 3)")
        parser.add_argument("--out", type=Path, default=Path(os.environ.get("RLX_OUTPUTS", "outputs")) / "reproduce",
                            help="where the multiruns go (default: outputs/reproduce)")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="extra override for every run (repeatable), e.g. --set hardware.num_threads=1")
        parser.add_argument("--reuse", action="store_true", help="skip recipes whose directory already has all seeds")
        parser.add_argument("--update-results", action="store_true",
                            help=f"write the table into {RESULTS_FILE}, the docs' results page (from a checkout)")
        opts = parser.parse_args(args[1:])
        if opts.seeds < 1:
            raise UserError(f"--seeds={opts.seeds} must be at least 1")
        names = opts.names or cpu_recipes()
        for name in names:
            recipe_path(name)
        rows = reproduce(names, opts.seeds, opts.out, opts.set, opts.reuse, opts.update_results)
        off = [r["recipe"] for r in rows if not r["status"].startswith(("ok", "not yet expected"))
               or "failed" in r["status"]]
        if off:
            print(f"error: {len(off)} of {len(rows)} recipes outside their tolerance or failed: {', '.join(off)}",
                  file=sys.stderr)
            raise SystemExit(1)
        return
    raise UserError(f"unknown recipes command '{args[0]}'; valid choices: list, show NAME, reproduce")
