"""Layers that only look down (issue 36, item 6): every import between rlx's folders (and root modules) goes from a
higher layer to a lower one. Imports inside functions count as much as those at the top of a module (a lazy import
is still a dependency), and so do those under `if TYPE_CHECKING:`. An upward import fails here, naming file:line.

The layers, lowest first. A folder may import its own modules and those of any LOWER layer; nothing else:

    errors registry version   the leaves every module may import
    algorithms                pure math (torch, the leaves)
    config                    schemas, overrides and the cross-field rules; learns the names of the registries
                              above it from what they publish (rlx.registry.publish), never by importing them
    runtime                   launch, parallel, storage, checkpoints, the run directory, tracking
    report                    reading run directories: curves, statistics, sweeps
    view                      the local page over run directories (rlx view): reads what report reads
    models                    loading, LoRA, the forward pass
    sandbox tasks rewards     running code; verifiers; reward components
    data                      prompt rows and preference pairs
    engines                   the Generator Protocol and the engines in this process (transformers, vLLM), the
                              records an engine returns
    fleet rollout             side by side, neither imports the other: the server fleet (a Generator over HTTP
                              servers, publishers, the choice of backend) and the producers (records of a step,
                              producers, wrappers, stages), which see only the engines' Protocols; the builder
                              joins them
    envs gateway              text environments; the agent-harness endpoint
    evaluation                benchmarks and held-out evaluation
    loops                     the training loops
    build                     THE builder: settings -> parts
    cli                       the commands, their orchestration included (rlx/cli/training.py)
    __main__                  every `__main__.py`, wherever it sits: an entry point calls a command
    api                       rlx.fit, rlx.evaluate, rlx.register
    __init__                  the package itself (lazy attributes)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlx"

LAYERS = [
    ("errors", "registry", "version"),
    ("algorithms",),
    ("config",),
    ("runtime",),
    ("report",),
    ("view",),
    ("models",),
    ("sandbox",),
    ("tasks",),
    ("rewards",),
    ("data",),
    ("engines",),
    ("fleet", "rollout"),
    ("envs",),
    ("gateway",),
    ("evaluation",),
    ("loops",),
    ("build",),
    ("cli",),
    ("__main__",),
    ("api",),
    ("__init__",),
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}

# Upward imports that remain, each with why it is there and what removes it. The test fails when one of these is
# gone too (take it off the list), so the list only shrinks.
KNOWN_UPWARD = {
    ("rlx/config/rules.py", "rlx.envs"): "check_agent(_sft)_settings build one environment to refuse a bad "
    "env.name/target/kwargs before the model loads; goes when the environment registry's entries declare "
    "their own check (issue 36, item 3)",
    ("rlx/config/rules.py", "rlx.gateway.harness"): "check_agent_settings loads the harness program and its task "
    "files before the model loads; goes with the same change",
}


def allowed() -> dict[str, list[str]]:
    """unit -> the units it may import (every lower layer), the table this test enforces."""
    return {unit: [lower for r in range(rank) for lower in LAYERS[r]] for unit, rank in RANK.items()}


def unit_of_file(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if path.name == "__main__.py":
        return "__main__"
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def unit_of_module(module: str) -> str | None:
    """The unit an absolute module name belongs to (`rlx.engines.hf` -> engines, `rlx.build` -> build, `rlx` ->
    __init__); None outside rlx."""
    parts = module.split(".")
    if parts[0] != "rlx":
        return None
    if len(parts) == 1:
        return "__init__"
    if (ROOT / parts[1]).is_dir() or (ROOT / f"{parts[1]}.py").is_file():
        return "__main__" if parts[-1] == "__main__" else parts[1]
    return "__init__"  # `from rlx import fit`: an attribute of the package


def imported_modules(path: Path, source: str | None = None):
    """(line, absolute module name) of every import in a file, at any depth (functions, if/try blocks)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    rel = path.relative_to(ROOT.parent).with_suffix("").parts
    package = ".".join(rel if path.name == "__init__.py" else rel[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target == "rlx":  # `from rlx import api`: the module named, or the package's attribute
                for alias in node.names:
                    yield node.lineno, f"rlx.{alias.name}"
            else:
                yield node.lineno, target


def upward_imports(files=None) -> list[tuple[str, int, str, str, str]]:
    """(file, line, module, from unit, to unit) of every import of a unit that is not in a lower layer."""
    found = []
    for path in sorted(files or ROOT.rglob("*.py")):
        if "assets" in path.parts:
            continue
        source_unit = unit_of_file(path)
        for line, module in imported_modules(path):
            target = unit_of_module(module)
            if target is None or target == source_unit:
                continue
            if RANK[target] >= RANK[source_unit]:
                found.append((str(path.relative_to(ROOT.parent)), line, module, source_unit, target))
    return found


def test_every_unit_has_a_layer():
    units = {unit_of_file(p) for p in ROOT.rglob("*.py") if "assets" not in p.parts}
    assert units <= set(RANK), ("folders or root modules without a layer in tests/test_layers.py: "
                                f"{sorted(units - set(RANK))}")


def test_imports_only_look_down():
    found = upward_imports()
    new = [f"{file}:{line} imports {module} ({source} -> {target}: {target} is not below {source})"
           for file, line, module, source, target in found if (file, module) not in KNOWN_UPWARD]
    assert not new, "upward imports:\n  " + "\n  ".join(new) + "\nthe allowed imports: tests/test_layers.py LAYERS"
    gone = set(KNOWN_UPWARD) - {(file, module) for file, _, module, _, _ in found}
    assert not gone, f"these upward imports are gone, take them off KNOWN_UPWARD: {sorted(gone)}"


def test_the_reader_counts_imports_inside_functions_and_names_the_line(tmp_path):
    folder = ROOT / "config"
    source = "import os\n\ndef check(cfg):\n    if cfg:\n        from rlx.engines.hf import generate\n"
    lines = list(imported_modules(folder / "probe.py", source))
    assert lines == [(1, "os"), (5, "rlx.engines.hf")]
    assert unit_of_module("rlx.engines.hf") == "engines" and RANK["engines"] > RANK["config"]


def test_config_learns_registry_names_from_what_registries_publish():
    """groups.py reads the upper layers' registries as published: the same objects, so the same names in order."""
    from rlx.config.groups import CUSTOM
    from rlx.data.sources import PROMPT_SOURCES
    from rlx.data.tasks import DATA_SOURCES
    from rlx.envs.registry import CUSTOM as ENV_CUSTOM
    from rlx.envs.registry import ENVIRONMENTS
    from rlx.gateway.tools import TOOL_PARSERS
    from rlx.registry import published
    from rlx.rollout.stages.replay import TRIGGERS
    from rlx.rollout.stages.temperature import TEMPERATURE_SCHEDULES
    from rlx.tasks import VERIFIERS

    assert CUSTOM == ENV_CUSTOM
    for key, registry in [("verifier", VERIFIERS), ("data_source", DATA_SOURCES), ("env", ENVIRONMENTS),
                          ("tool_parser", TOOL_PARSERS), ("replay_trigger", TRIGGERS),
                          ("temperature_schedule", TEMPERATURE_SCHEDULES), ("prompt_source", PROMPT_SOURCES)]:
        assert published(key) is registry, key


def test_the_allowed_table_is_what_the_layers_say():
    table = allowed()
    assert "rollout" in table["loops"] and "loops" not in table["rollout"]
    assert "engines" in table["fleet"] and "engines" in table["rollout"]
    assert "fleet" not in table["rollout"] and "rollout" not in table["fleet"]
    assert table["config"] == ["errors", "registry", "version", "algorithms"]
    assert table["errors"] == []
