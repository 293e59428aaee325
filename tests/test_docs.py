"""The docs site builds, agrees with the code, and shows only what composes.

- `mkdocs build --strict` passes (a broken link, anchor or missing page fails; run here so `make test`, and so
  CI, catches it);
- every registry entry has a docs section with its anchor, on the page that documents its registry;
- every `key=value` of an rlx command in a docs code block, and of the examples in `rlx <cmd> --help`,
  composes as an override, and every dotted knob named in backticks exists in some config;
- the flags the docs give `rlx report` / `rlx recipes reproduce` are in their --help;
- `rlx --version` is the latest released version of CHANGELOG.md;
- the results page renders from benchmarks/results/, every table with its provenance.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from rlx import __version__
from rlx.config.overrides import check_overrides
from rlx.config.paths import CONF_DIR, config_groups, group_options
from rlx.config.peer_names import peer_pointer
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import docs_hooks  # noqa: E402
import readme_commands  # noqa: E402

DOCS = REPO / "docs"

# (module, attribute, anchor prefix, page): every name of the registry needs a heading with {#prefix-name}
REGISTRIES = [
    ("rlx.algorithms.advantages", "ESTIMATORS", "estimator", "algorithms/policy-gradient.md"),
    ("rlx.algorithms.advantages", "SCALES", "scale", "algorithms/policy-gradient.md"),
    ("rlx.algorithms.losses", "LOSS_AGGREGATIONS", "agg", "algorithms/policy-gradient.md"),
    ("rlx.algorithms.losses", "RATIO_LEVELS", "ratio", "algorithms/policy-gradient.md"),
    ("rlx.algorithms.kl", "KL_ESTIMATORS", "kl", "algorithms/policy-gradient.md"),
    ("rlx.algorithms.kl", "KL_PLACEMENTS", "kl-in", "algorithms/policy-gradient.md"),
    ("rlx.algorithms.gigpo", "CREDIT", "credit", "algorithms/credit.md"),
    ("rlx.algorithms.preference", "PREFERENCE_LOSSES", "pref", "algorithms/preference.md"),
    ("rlx.tasks", "VERIFIERS", "verifier", "data-and-rewards.md"),
    ("rlx.tasks", "READERS", "reader", "data-and-rewards.md"),
    ("rlx.envs", "ENVIRONMENTS", "env", "agents/index.md"),
    ("rlx.fleet.publishers", "PUBLISHERS", "publisher", "scaling/publishers.md"),
    ("rlx.algorithms.mixture", "MIXING_RULES", "mixture", "algorithms/mixture.md"),
    ("rlx.data.sources", "PROMPT_SOURCES", "source", "extending/sources.md"),
]
HEADING = re.compile(r"^#{1,6} (?P<text>.*?)\s*\{#(?P<anchor>[^}\s]+)\}\s*$", re.MULTILINE)
PLACEHOLDER = re.compile(r"<[^<>\s]*>")
CONFIG_OF = {"train": "train", "eval": "eval", "data": "data_prefs", "sweep": "train"}


def missing_sections(module: str, attribute: str, names, prefix: str, page: str, text: str) -> list[str]:
    """One line per registry name without a heading `... `name` ... {#prefix-name}` on the page."""
    headings = {m["anchor"]: m["text"] for m in HEADING.finditer(text)}
    lines = []
    for name in names:
        anchor = f"{prefix}-{name}"
        if anchor not in headings or f"`{name}`" not in headings[anchor]:
            lines.append(f"{module} {attribute} entry '{name}' has no docs section: add a heading naming `{name}` "
                         f"with {{#{anchor}}} to docs/{page}")
    return lines


@pytest.mark.parametrize("module, attribute, prefix, page", REGISTRIES, ids=[r[1] for r in REGISTRIES])
def test_every_registry_entry_has_a_docs_section(module, attribute, prefix, page):
    names = list(getattr(importlib.import_module(module), attribute))
    assert names, f"{module}.{attribute} is empty"
    missing = missing_sections(module, attribute, names, prefix, page, (DOCS / page).read_text())
    assert not missing, "\n".join(missing)


def test_a_new_registry_entry_without_a_section_fails_naming_the_page():
    text = "### `grpo`: group mean {#estimator-grpo}\n### rloo without its name {#estimator-rloo}\n"
    lines = missing_sections("rlx.algorithms.advantages", "ESTIMATORS", ["grpo", "rloo", "rank"], "estimator",
                             "algorithms/policy-gradient.md", text)
    assert lines == [
        "rlx.algorithms.advantages ESTIMATORS entry 'rloo' has no docs section: add a heading naming `rloo` with "
        "{#estimator-rloo} to docs/algorithms/policy-gradient.md",
        "rlx.algorithms.advantages ESTIMATORS entry 'rank' has no docs section: add a heading naming `rank` with "
        "{#estimator-rank} to docs/algorithms/policy-gradient.md"]


def test_every_algorithm_preset_is_named_on_the_algorithms_pages():
    text = "".join(p.read_text() for p in (DOCS / "algorithms").glob("*.md"))
    missing = [name for name in group_options("algorithm") if f"`{name}`" not in text]
    assert not missing, f"presets without a mention in docs/algorithms/*.md: {missing}"


# ------------------------------------------------------------------------- commands and knobs in the docs


def documented_commands() -> list[tuple[str, str]]:
    """(page, command line) of every `rlx ...` line in a code block (bash or not) of README.md and docs/,
    transcripts of failing commands (`$ rlx ...`) left out: those are checked by readme_commands."""
    found = []
    for page in readme_commands.doc_files(REPO):
        for _lang, body in readme_commands.code_blocks(page):
            for line in readme_commands.command_lines(body):
                for part in line.split(" && "):
                    part = part.strip()
                    if re.match(r"^(\.venv[-\w]*/bin/)?rlx (train|eval|data prefs|sweep)\b", part):
                        found.append((str(page.relative_to(REPO)), re.sub(r"^\.venv[-\w]*/bin/", "", part)))
    return found


def compose_error(config_name: str, overrides: list[str], typed: bool = False) -> str | None:
    """None when the overrides compose (and, typed, pass the typed schema), else the `error:` line `rlx` prints."""
    return _compose_error(config_name, tuple(overrides), typed)


@functools.cache
def _compose_error(config_name: str, overrides: tuple[str, ...], typed: bool = False) -> str | None:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            cfg = check_overrides(list(overrides), config_name)
    except SystemExit:
        return stderr.getvalue().strip() or "exit without a message"
    if typed:  # the typed schema too: types, ranges and choices of every knob (what `rlx` checks next)
        from rlx.config.schema import check_config, drop_train_tuning
        from rlx.errors import UserError

        drop_train_tuning(cfg, config_name)  # as `rlx eval` and `rlx data prefs` do before they check
        try:
            check_config(cfg, config_name)
        except UserError as exc:
            return f"error: {exc}"
    return None


def command_overrides(command: str) -> tuple[str, list[str]] | None:
    """(config name, overrides) of a documented command, placeholders replaced; None for what composes nothing."""
    args = shlex.split(PLACEHOLDER.sub("placeholder", command.replace(" ...", "")))[1:]
    sub = args[0]
    if sub == "data":
        args = args[1:]
    rest = [a for a in args[1:] if a not in ("-m", "--multirun")]
    if any(a.startswith("-") for a in rest):  # --help, --cfg job: checked by readme_commands
        rest = [a for a in rest if "=" in a and not a.startswith("-")]
    if sub == "train" and rest and "=" not in rest[0]:
        rest = [f"recipes={rest[0]}", *rest[1:]]
    if sub == "sweep":
        if not rest or rest[0] == "retest":
            return None
        rest = [f"sweep={rest[0]}", *rest[1:]]
    return CONFIG_OF[sub], rest


def test_every_documented_command_composes():
    commands = documented_commands()
    assert len(commands) > 40, commands  # the README and the pages are read
    failures = []
    for page, command in dict.fromkeys(commands):
        parsed = command_overrides(command)
        if parsed is None:
            continue
        error = compose_error(*parsed, typed=True)
        if error:
            failures.append(f"{page}: `{command}` -> {error}")
    assert not failures, "\n".join(failures)


def test_help_examples_compose_and_name_existing_options():
    """The examples in `rlx train --help` / `rlx eval --help` are commands too."""
    from rlx.cli.help import config_help

    failures = []
    for command in ("train", "eval"):
        text = config_help(command)
        examples = [line.strip().split("  ")[0] for line in text.splitlines()
                    if re.match(rf"\s+rlx {command} ", line) and "=" in line]  # the header's indented examples
        assert examples, f"no examples in rlx {command} --help"
        for example in examples:
            parsed = command_overrides(example)
            error = compose_error(*parsed, typed=True) if parsed else None
            if error:
                failures.append(f"rlx {command} --help example `{example}` -> {error}")
    assert not failures, "\n".join(failures)


def _flat(node, prefix: str, into: set[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "defaults":
                continue
            name = f"{prefix}{key}"
            into.add(name)
            _flat(value, name + ".", into)


def known_keys() -> set[str]:
    """Every dotted key of the primary configs and of every option of every group (the YAML files)."""
    keys: set[str] = set()
    for primary in ("train", "eval", "data_prefs"):
        _flat(yaml.safe_load((CONF_DIR / f"{primary}.yaml").read_text()), "", keys)
    for group in config_groups():
        for option in group_options(group):
            text = (CONF_DIR / group / f"{option}.yaml").read_text()
            if "@package _global_" in text:  # recipes and sweeps set keys of other groups
                _flat(yaml.safe_load(text), "", keys)
            else:
                _flat(yaml.safe_load(text), f"{group}.", keys)
        for part in sorted((CONF_DIR / group / "parts").glob("*.yaml")):  # included by options (`parts/X@_here_`)
            _flat(yaml.safe_load(part.read_text()), f"{group}.", keys)
    return keys


FREE_FORM = ("reward.components.", "env.kwargs.", "data.task_config.", "hydra.", "benchmark.")
FILE_NAME = re.compile(r"\.(json|jsonl|yaml|md|py|png|csv|txt|pt|db)$")  # `metrics.jsonl` is a file, not a knob
KNOB = re.compile(r"`\+?(?P<key>[a-z_]+(?:\.[A-Za-z0-9_]+)+)(?:=[^`]*)?`")


def test_every_knob_named_in_the_docs_exists():
    keys = known_keys()
    roots = {k.split(".")[0] for k in keys} | set(config_groups())
    unknown = []
    for page in readme_commands.doc_files(REPO):
        for match in KNOB.finditer(page.read_text()):
            key = match["key"]
            if key.split(".")[0] not in roots or key in keys or key.startswith(FREE_FORM) or FILE_NAME.search(key) \
                    or peer_pointer(key):  # TRL/verl names of the mapping table
                continue
            unknown.append(f"{page.relative_to(REPO)}: `{key}`")
    assert not unknown, "knobs named in the docs that no config has:\n" + "\n".join(sorted(set(unknown)))


def keys_by_config() -> dict[str, set[str]]:
    """The dotted keys each primary config composes (its own file, and every option of its groups)."""
    out = {}
    for primary in ("train", "eval", "data_prefs"):
        keys: set[str] = set()
        config = yaml.safe_load((CONF_DIR / f"{primary}.yaml").read_text())
        _flat(config, "", keys)
        groups = [next(iter(d)) for d in config.get("defaults", []) if isinstance(d, dict)]
        for group in (g for g in groups if not g.startswith(("override ", "hydra"))):
            for option in group_options(group):
                _flat(yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text()), f"{group}.", keys)
        out[primary] = keys | set(groups)
    return out


@functools.cache
def option_keys(group: str, option: str) -> frozenset[str]:
    keys: set[str] = set()
    _flat(yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text()), f"{group}.", keys)
    return frozenset(keys)


def options_with(group: str, key: str) -> list[str]:
    """The options of a group whose file has the key, then those with a free-form part above it."""
    exact = [o for o in group_options(group) if key in option_keys(group, o)]
    above = [o for o in group_options(group) if o not in exact
             and any(key.startswith(k + ".") for k in option_keys(group, o))]
    return exact + above


def test_inline_overrides_compose():
    """Every `key=value` in backticks in the prose composes, alone or with the option of its group that has it."""
    spans = set()
    for page in readme_commands.doc_files(REPO):
        for match in re.finditer(r"`(\+?[a-z_]+(?:\.[A-Za-z0-9_]+)*=[^`\s]+)`", page.read_text()):
            spans.add((str(page.relative_to(REPO)), PLACEHOLDER.sub("placeholder", match[1])))
    assert len(spans) > 30
    by_config, groups, failures = keys_by_config(), set(config_groups()), []
    for page, text in sorted(spans):
        key, value = text.lstrip("+").split("=", 1)
        if key.startswith("hydra.") or value == "placeholder" or peer_pointer(key) or key == "plugins":
            continue  # plugins= names the user's modules (tests/test_plugins.py runs the plugins page's examples)
        # the config that has the key (train first), then the group option that has it
        names = [n for n in ("train", "eval", "data_prefs")
                 if key in by_config[n] or key.split(".")[0] in by_config[n]] or ["train"]
        group = key.split(".")[0]
        for alternative in value.split("|"):  # `logger=wandb|mlflow` shows several values
            span = text.split("=", 1)[0] + "=" + alternative
            attempts = [[span]] + ([[f"{group}={o}", span] for o in options_with(group, key)] if group in groups
                                   else [])
            if not any(compose_error(name, attempt) is None for name in names for attempt in attempts[:4]):
                failures.append(f"{page}: `{text}` -> {compose_error(names[0], [span])}")
    assert not failures, "\n".join(failures)


def test_every_trl_and_verl_name_of_the_mapping_table_gets_a_pointer():
    """docs/coming-from-trl.md promises that a TRL or verl name stops with a pointer to the rlx setting."""
    rows = [line for line in (DOCS / "coming-from-trl.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| TRL") and line.count("|") == 4]
    assert len(rows) > 15
    names = [name for row in rows for cell in row.strip("|").split("|")[:2] for name in re.findall(r"`([^`=]+)`", cell)]
    silent = [name for name in names if peer_pointer(name) is None and compose_error("train", [f"{name}=1"])]
    assert not silent, f"mapping-table names that neither compose nor get a pointer: {silent}"


def test_report_and_reproduce_flags_in_the_docs_exist():
    help_texts = {
        "report": subprocess.run([sys.executable, "-m", "rlx", "report", "--help"], capture_output=True, text=True,
                                 cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO))).stdout,
        "recipes reproduce": subprocess.run([sys.executable, "-m", "rlx", "recipes", "reproduce", "--help"],
                                            capture_output=True, text=True, cwd=REPO,
                                            env=dict(os.environ, PYTHONPATH=str(REPO))).stdout}
    text = "\n".join(p.read_text() for p in readme_commands.doc_files(REPO)) + (REPO / "Makefile").read_text()
    checked = 0
    for command, help_text in help_texts.items():
        assert "usage:" in help_text, help_text
        for line in re.findall(rf"rlx {command}[^\n`]*", text):
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line):
                checked += 1
                assert re.search(rf"{flag}(?![\w-])", help_text), (  # the whole flag: argparse would take a prefix
                    f"`{line.strip()}` uses {flag}, which `rlx {command} --help` does not list")
    assert checked >= 4


# ------------------------------------------------------------------------------ version and changelog


def latest_release(changelog: str) -> str:
    """The newest `## [X.Y.Z] - date` heading's version (Unreleased skipped)."""
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.MULTILINE)
    assert versions, "CHANGELOG.md has no released version heading `## [X.Y.Z] - YYYY-MM-DD`"
    return versions[0]


def test_version_matches_the_changelog():
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{latest_release(changelog)}]")
    assert latest_release(changelog) == __version__, (
        f"rlx.__version__ is {__version__} but CHANGELOG.md's latest release is {latest_release(changelog)}")
    printed = subprocess.run([sys.executable, "-m", "rlx", "--version"], capture_output=True, text=True, cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert printed.stdout.strip() == f"rlx {__version__}"


def test_latest_release_skips_unreleased():
    text = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2027-01-02\n\n## [0.1.0] - 2026-11-25\n"
    assert latest_release(text) == "0.2.0"


# ------------------------------------------------------------------------------- results and the build


def test_results_page_renders_every_table_with_its_provenance():
    page = docs_hooks.render_results()
    for stem, _ in docs_hooks.table_files():
        assert f"{{#{stem}}}" in page
    assert page.count("*Measured ") + page.count("*Machine: ") >= len(docs_hooks.table_files())
    assert "![" in page and (docs_hooks.RESULTS / "growth_0.5b.png").is_file()


def test_a_table_without_its_date_is_refused_naming_the_file(tmp_path):
    table = {"title": "t", "section": "Development", "machine": "m", "load": "l", "command": "c",
             "columns": ["a"], "rows": [[1]]}
    (tmp_path / "x.json").write_text(json.dumps(table))
    with pytest.raises(docs_hooks.ResultsError, match=r"x\.json: no date"):
        docs_hooks.render_results(tmp_path)


def test_grpo_vs_trl_rows_are_computed_from_the_raw_file(tmp_path, monkeypatch):
    """Raw file: rlx [20 s, 30 tok/s, 2048 MiB], TRL [40 s, 15 tok/s, 1024 MiB]. Hand-derived row:
    tokens/s ratio 30 / 15 = 2.00x; memory 2048 / 1024 = 2.0 GiB against 1.0 GiB, ratio 2.00;
    generation medians: rlx runs [1, 3] and [5] -> per-run medians 2 and 5 -> median 3.5; TRL [7] -> 7.0.
    The quickest step is shown only where more than one step was timed: rlx 2 runs x 1 step (19.00), TRL
    1 run x 1 step (none)."""
    raw = {"setting": "s", "rlx": [20.0, 30.0, 2048.0], "trl": [40.0, 15.0, 1024.0], "floor_s": 5.0,
           "min_step_s": {"rlx": 19.0, "trl": 39.0}, "rounds": 2, "steps": 1, "load": "load average 1.0 (1 min)",
           "runs": {"rlx": [{"generation_times": [1.0, 3.0]}, {"generation_times": [5.0]}],
                    "trl": [{"generation_times": [7.0]}]}}
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    monkeypatch.setattr(docs_hooks, "RESULTS", tmp_path)
    blocks = docs_hooks.render_grpo_vs_trl("t", {"machine": "m", "date": "d", "command": "c",
                                                 "sources": [{"file": "raw.json", "label": "L"}]})
    row = [line for line in blocks[1].splitlines() if line.startswith("| L ")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:8] == ["L", "2 x 1", "20.00 (19.00)", "40.00", "5.0", "2.00x", "2.0 / 1.0 (2.00)", "3.5 / 7.0"]


def test_docs_build_strict(tmp_path):
    """`mkdocs build --strict` (what `make docs` runs): broken links, anchors and missing pages fail."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                             "-d", str(tmp_path / "site")], capture_output=True, text=True, cwd=REPO, timeout=300,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    site = tmp_path / "site"
    assert 'id="estimator-grpo"' in (site / "algorithms" / "policy-gradient.html").read_text()
    assert ('id="default_run"' in (site / "results.html").read_text()
            and (site / "results" / "growth_0.5b.png").is_file())
    assert "group_advantages" in (site / "api.html").read_text()  # mkdocstrings rendered the docstrings
    assert __version__ in (site / "changelog.html").read_text()


def test_no_merge_conflict_markers_are_left_in_the_sources():
    """A merge that kept both sides' lines and git's markers (once found in docs/algorithms/seed-ideas.md)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    marker = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)
    found = [str(path.relative_to(root))
             for folder in ("rlx", "docs", "conf", "tests", "benchmarks", "scripts", "examples")
             for path in (root / folder).rglob("*") if path.suffix in (".py", ".md", ".yaml", ".yml", ".toml", ".txt")
             and marker.search(path.read_text(errors="replace"))]
    found += [name for name in ("README.md", "CHANGELOG.md", "Makefile") if marker.search((root / name).read_text())]
    assert not found, found
