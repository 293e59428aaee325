"""The docs site's build hooks (mkdocs.yml `hooks:`), and the results page as a script.

    python scripts/docs_hooks.py              # print the results page's Markdown (what `make docs` renders)
    python scripts/docs_hooks.py --check      # only validate benchmarks/results/*.json; exit 1 naming the problems

The dated measurements live in benchmarks/results/ as JSON. A *table file* has a `title` and renders as one
section of docs/results.md; every other JSON file there is raw output of a benchmark script, rendered only
when a table file names it in `sources` (so a superseded raw file stays in the folder and leaves the docs).
A table file's `kind` picks its renderer (RENDERERS):

    table         the rows are in the file: {"columns": [...], "rows": [[...], ...]}
    grpo_vs_trl   the rows are computed from raw files of benchmarks/grpo_vs_trl.py
    vllm_cpu      the rows are computed from the raw file of benchmarks/vllm_cpu.py

Every table carries its provenance, beside its figures: `date`, `machine`, `load`, `command` (set on the
file, on one of its `tables`, or on one `sources` entry; the nearest one wins). `plots` names PNG files of
benchmarks/results/ to show under the table. The hook also publishes CHANGELOG.md as changelog.md.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MARKER = "<!-- results -->"
PROVENANCE = ("date", "machine", "load", "command")
SECTIONS = ("Training on the tiny model", "Agents", "Preference optimization and RLHF", "Speed and memory: CPU",
            "Speed and memory: GPU", "Development")


class ResultsError(ValueError):
    """A results file that cannot be rendered (named in the message)."""


def table_files(folder: Path = RESULTS) -> list[tuple[str, dict]]:
    """(file stem, content) of every table file (a JSON object with a title), in page order."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ResultsError(f"{path.name}: not JSON ({exc})") from None
        if isinstance(data, dict) and "title" in data:
            found.append((path.stem, data))
    return sorted(found, key=lambda item: (_section_index(item), item[1].get("order", 100), item[0]))


def _section_index(item: tuple[str, dict]) -> int:
    stem, data = item
    section = data.get("section")
    if section not in SECTIONS:
        raise ResultsError(f"{stem}.json: section {section!r} is not one of {', '.join(SECTIONS)}")
    return SECTIONS.index(section)


def _provenance(*layers: dict) -> dict:
    """date/machine/load/command, the last layer that sets a key winning."""
    merged = {}
    for layer in layers:
        merged.update({k: layer[k] for k in PROVENANCE if layer.get(k)})
    return merged


def _provenance_line(prov: dict, where: str) -> str:
    missing = [k for k in PROVENANCE if k not in prov]
    if missing:
        raise ResultsError(f"{where}: no {', '.join(missing)} (every figure needs date, machine, load and command)")
    return f"*Measured {prov['date']} on {prov['machine']}; {prov['load']}.* Command: `{prov['command']}`"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):  # fractions (accuracies) at 3 decimals, other numbers as written
        return f"{value:.3f}" if abs(value) < 1 else f"{value:.1f}" if value.is_integer() else f"{value:g}"
    return str(value).replace("|", "\\|")


def markdown_table(columns: list[str], rows: list[list], where: str) -> str:
    for number, row in enumerate(rows, 1):
        if len(row) != len(columns):
            raise ResultsError(f"{where}: row {number} has {len(row)} cells for {len(columns)} columns")
    lines = ["| " + " | ".join(str(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def render_table(stem: str, data: dict) -> list[str]:
    """kind "table": one or more tables whose rows are in the file."""
    blocks = []
    for index, table in enumerate(data.get("tables", [data])):
        where = f"{stem}.json" + (f" table {index + 1}" if "tables" in data else "")
        if table.get("caption"):
            blocks.append(f"**{table['caption']}**")
        blocks.append(_provenance_line(_provenance(data, table), where))
        blocks.append(markdown_table(table["columns"], table["rows"], where))
        if table.get("notes"):
            blocks.append(table["notes"])
    return blocks


def _raw(name: str, where: str) -> dict:
    path = RESULTS / name
    if not path.is_file():
        raise ResultsError(f"{where}: source {name} does not exist in benchmarks/results/")
    return json.loads(path.read_text())


def _median_over_runs(runs: list[dict], key: str) -> float | None:
    per_run = [statistics.median(r[key]) for r in runs if r.get(key)]
    return statistics.median(per_run) if per_run else None


def render_grpo_vs_trl(stem: str, data: dict) -> list[str]:
    """kind "grpo_vs_trl": one row per raw file of benchmarks/grpo_vs_trl.py.

    A raw file holds, per tool, [median step s, median tokens/s, median peak MiB] over its runs, the
    compute floor, the quickest step and (newer files) every run's step and generation times."""
    columns = ["setting", "runs x steps", "rlx s/step (quickest)", "TRL s/step (quickest)", "floor s",
               "tokens/s rlx / TRL", "peak memory rlx / TRL GiB", "generation rlx / TRL s", "load", "date", "note"]
    rows, commands = [], []
    for source in data["sources"]:
        where = f"{stem}.json source {source['file']}"
        raw = _raw(source["file"], where)
        prov = _provenance(data, raw, source)
        if "load" not in prov or "date" not in prov or "command" not in prov:
            _provenance_line(prov, where)  # raises, naming what is missing
        rlx, trl = raw["rlx"], raw["trl"]
        quickest = raw.get("min_step_s", {})
        runs = raw.get("runs", {})
        gen_rlx, gen_trl = _median_over_runs(runs.get("rlx", []), "generation_times"), \
            _median_over_runs(runs.get("trl", []), "generation_times")
        generation = f"{gen_rlx:.1f} / {gen_trl:.1f}" if gen_rlx and gen_trl else ""

        timed = {tool: len(runs.get(tool, [])) * raw["steps"] for tool in ("rlx", "trl")}  # steps behind the median
        step = {tool: f"{summary[0]:.2f}"
                + (f" ({quickest[tool]:.2f})" if quickest.get(tool) and timed[tool] > 1 else "")
                for tool, summary in (("rlx", rlx), ("trl", trl))}

        rows.append([source.get("label", raw["setting"]), f"{raw['rounds']} x {raw['steps']}", step["rlx"],
                     step["trl"], f"{raw['floor_s']:.1f}", f"{rlx[1] / trl[1]:.2f}x",
                     f"{rlx[2] / 1024:.1f} / {trl[2] / 1024:.1f} ({rlx[2] / trl[2]:.2f})", generation,
                     prov["load"].replace(" on 2 CPU cores", "").replace("load average ", ""), prov["date"],
                     source.get("note", "")])
        commands.append(prov["command"])
    blocks = [f"*Machine: {data['machine']}.* Commands: " + ", ".join(f"`{c}`" for c in dict.fromkeys(commands)),
              markdown_table(columns, rows, f"{stem}.json")]
    if data.get("notes"):
        blocks.append(data["notes"])
    return blocks


def render_vllm_cpu(stem: str, data: dict) -> list[str]:
    """kind "vllm_cpu": best-of-rounds generation throughput of benchmarks/vllm_cpu.py."""
    blocks = []
    for source in data["sources"]:
        where = f"{stem}.json source {source['file']}"
        raw = _raw(source["file"], where)
        load = raw.get("load_average")
        prov = _provenance(data, {"load": f"load average {load[0]:.1f} (1 min)"} if load else {}, source)
        blocks.append(_provenance_line(prov, where))
        columns = ["generator", "best tokens/s", "quickest s", "median s"]
        labels = {"rlx": "rlx's own decoder", "vllm_request": "vLLM, one seed per completion",
                  "vllm_batch": "vLLM, one seed per call"}
        rows = [[label, f"{raw[key]['tokens_per_s_best']:.0f}", f"{raw[key]['min_s']:.2f}",
                 f"{raw[key]['median_s']:.2f}"]
                for key, label in labels.items() if key in raw]
        blocks.append(f"{raw['prompts']} prompts x {raw['samples']} samples x {raw['tokens']} forced tokens, model "
                      f"`{raw['shape']}`, {raw['threads']} threads, {raw['rounds']} rounds; engine start "
                      f"{raw['engine_start_s']:.0f} s.")
        blocks.append(markdown_table(columns, rows, where))
    if data.get("notes"):
        blocks.append(data["notes"])
    return blocks


RENDERERS = {"table": render_table, "grpo_vs_trl": render_grpo_vs_trl, "vllm_cpu": render_vllm_cpu}


def render_results(folder: Path = RESULTS, image_prefix: str = "results/") -> str:
    """The Markdown of every table file, grouped by section, with plots linked under image_prefix."""
    out, section = [], None
    for stem, data in table_files(folder):
        if data["section"] != section:
            section = data["section"]
            out.append(f"## {section}")
        kind = data.get("kind", "table")
        if kind not in RENDERERS:
            raise ResultsError(f"{stem}.json: kind {kind!r} is not one of {', '.join(RENDERERS)}")
        out.append(f"### {data['title']} {{#{stem}}}")
        if data.get("description"):
            out.append(data["description"])
        out.extend(RENDERERS[kind](stem, data))
        for plot in data.get("plots", []):
            if not (folder / plot).is_file():
                raise ResultsError(f"{stem}.json: plot {plot} does not exist in benchmarks/results/")
            out.append(f"![{data['title']}]({image_prefix}{plot})")
    return "\n\n".join(out) + "\n"


def plots(folder: Path = RESULTS) -> list[str]:
    return sorted({plot for _, data in table_files(folder) for plot in data.get("plots", [])})


# ----------------------------------------------------------------------------------------------- mkdocs hooks


def on_files(files, config):
    """Publish CHANGELOG.md as changelog.md and the results' plots as results/<name>.png."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "changelog.md", abs_src_path=str(REPO / "CHANGELOG.md")))
    for plot in plots():
        files.append(File.generated(config, f"results/{plot}", abs_src_path=str(RESULTS / plot)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "results.md":
        if MARKER not in markdown:
            raise ResultsError(f"docs/results.md lost its marker {MARKER}")
        return markdown.replace(MARKER, render_results())
    return markdown


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        page = render_results()
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if "--check" not in argv:
        print(page, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
