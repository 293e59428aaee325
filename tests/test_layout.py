"""Import direction, checked on the source (issue 15): no cycles between rlx's modules, no training loop
importing another loop, the algorithm math importing only torch and the standard library, and evaluation
independent of the training loops. A new import that breaks the layout fails here, naming the file."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rlx"
LOOP_INFRASTRUCTURE = {"rlx.loops", "rlx.loops.common", "rlx.loops.micro_batches", "rlx.loops.credit"}  # shared by the loops; not loops


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool = False, source: str | None = None) -> set[str]:
    """Absolute module names imported by a file (relative imports resolved); with top_level_only, only
    the imports that run when the module is imported (not those inside functions)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
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


def internal_graph(top_level_only: bool) -> dict[str, set[str]]:
    modules = rlx_modules()
    return {name: {m for m in imports(path, top_level_only) if m in modules and m != name}
            for name, path in modules.items()}


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


def _package_parents(graph):
    """A package's __init__ importing its own submodule is not a cycle of the layout: drop those edges."""
    return {n: {m for m in deps if not m.startswith(n + ".")} for n, deps in graph.items()}


def test_no_import_cycle_between_modules():
    cycle = find_cycle(_package_parents(internal_graph(top_level_only=True)))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def loops() -> dict[str, Path]:
    return {n: p for n, p in rlx_modules().items() if n.startswith("rlx.loops") and n not in LOOP_INFRASTRUCTURE}


def test_no_loop_imports_another_loop():
    names = set(loops())
    bad = {name: sorted(m for m in imports(path) if m in names and m != name) for name, path in loops().items()}
    assert {k: v for k, v in bad.items() if v} == {}
    assert "rlx.loops.policy_gradient" in names and "rlx.loops.ppo" in names  # the check sees the loops


def test_algorithms_import_only_torch_and_the_standard_library():
    allowed_roots = {"torch", "rlx", "__future__"} | set(sys.stdlib_module_names)
    for path in (ROOT / "algorithms").glob("*.py"):
        for name in imports(path):
            root = name.split(".")[0]
            assert root in allowed_roots, f"{path.name} imports {name}"
            assert root != "rlx" or name.startswith("rlx.algorithms"), f"{path.name} imports {name}"


def test_evaluation_does_not_import_training_loops():
    for name, path in rlx_modules().items():
        if name.startswith("rlx.evaluation"):
            assert not [m for m in imports(path) if m.startswith("rlx.loops")], path


@pytest.mark.parametrize("source,expected", [
    ("from rlx.loops.policy_gradient import x\n", {"rlx.loops.policy_gradient", "rlx.loops.policy_gradient.x"}),
    ("from . import kl\n", {"rlx.algorithms", "rlx.algorithms.kl"}),
    ("def f():\n    import numpy\n", {"numpy"}),
])
def test_the_import_reader_resolves_what_it_must(source, expected):
    assert imports(ROOT / "algorithms" / "_layout_probe.py", source=source) == expected


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
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in CONFIG_ADAPTERS | entry_points:
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
