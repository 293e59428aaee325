"""Caps that keep the code readable (issue 50, item 6), measured on the source with `ast` alone:

- a function (methods included) takes at most 8 parameters: positional-only, positional and keyword-only all count;
  `self`/`cls` and `*args` do not; a `**kwargs` counts as one, except a trailing `**_` (swallowed, never read);
- a function is at most 80 lines long; a training loop (`train_*` in rlx/loops/) at most 150;
- a module is at most 500 lines long.

Over a cap: group parameters into a settings dataclass, split the function or the module. The same measures are
in ../shared/tools/contract_check.py (which does not count `**kwargs`).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlx"

MAX_PARAMS = 8
MAX_FUNCTION_LINES = 80
MAX_LOOP_LINES = 150
MAX_MODULE_LINES = 500


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The parameters a function counts against MAX_PARAMS, in order."""
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
    if args.kwarg is not None and args.kwarg.arg != "_":
        names.append(f"**{args.kwarg.arg}")
    return names


def function_cap(name: str, rel: str) -> int:
    """The most lines a function may take: training loops (`train_*` under loops/) get more."""
    in_loops = rel.startswith("loops/") or "/loops/" in rel
    return MAX_LOOP_LINES if in_loops and name.startswith("train_") else MAX_FUNCTION_LINES


def offenders(source: str, rel: str) -> list[str]:
    """One line per cap a module's source breaks; `rel` is its path under rlx/ (e.g. `loops/grpo.py`)."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"rlx/{rel}: module of {lines} lines (cap {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source, filename=rel)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = parameters(node)
        if len(params) > MAX_PARAMS:
            found.append(f"rlx/{rel}:{node.lineno} {node.name}: {len(params)} parameters (cap {MAX_PARAMS})")
        length = node.end_lineno - node.lineno + 1
        cap = function_cap(node.name, rel)
        if length > cap:
            found.append(f"rlx/{rel}:{node.lineno} {node.name}: {length} lines (cap {cap})")
    return found


def test_every_module_under_rlx_keeps_the_caps():
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 50, "the walk found too few modules: is ROOT right?"
    found = [o for path in files
             for o in offenders(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]
    assert not found, "over the caps (tests/test_caps.py says how to fix):\n  " + "\n  ".join(found)


def function(params: str, body_lines: int = 1, name: str = "f") -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    return f"def {name}({params}):\n{body}"


def test_nine_parameters_fail_eight_pass():
    eight = ", ".join(f"a{i}" for i in range(8))
    assert offenders(function(eight), "m.py") == []
    assert offenders(function(eight + ", a8"), "m.py") == ["rlx/m.py:1 f: 9 parameters (cap 8)"]


def test_positional_only_and_keyword_only_count_self_and_args_do_not():
    src = "class C:\n" + textwrap.indent(function("self, a, b, /, c, d, *args, e, f, g, h, i"), "    ")
    assert offenders(src, "m.py") == ["rlx/m.py:2 f: 9 parameters (cap 8)"]
    cls = "class C:\n    @classmethod\n" + textwrap.indent(function("cls, a, b, c, d, *args, e, f, g, h"), "    ")
    assert offenders(cls, "m.py") == []


def test_kwargs_counts_but_a_trailing_underscore_does_not():
    eight = ", ".join(f"a{i}" for i in range(8))
    assert offenders(function(eight + ", **_"), "m.py") == []
    assert offenders(function(eight + ", **kwargs"), "m.py") == ["rlx/m.py:1 f: 9 parameters (cap 8)"]
    assert offenders("async " + function(eight + ", **kw"), "m.py") == ["rlx/m.py:1 f: 9 parameters (cap 8)"]


def test_a_function_of_81_lines_fails():
    assert offenders(function("", body_lines=79), "m.py") == []  # def line + 79 = 80
    assert offenders(function("", body_lines=80), "m.py") == ["rlx/m.py:1 f: 81 lines (cap 80)"]
    nested = "def outer():\n" + textwrap.indent(function("", body_lines=80, name="inner"), "    ")
    assert "rlx/m.py:2 inner: 81 lines (cap 80)" in offenders(nested, "m.py")


def test_training_loops_in_loops_get_150_lines():
    assert offenders(function("", body_lines=149, name="train_x"), "loops/x.py") == []
    assert offenders(function("", body_lines=150, name="train_x"), "loops/x.py") == [
        "rlx/loops/x.py:1 train_x: 151 lines (cap 150)"]
    # neither another name in loops/ nor a train_* elsewhere
    assert offenders(function("", body_lines=100, name="step"), "loops/x.py") == [
        "rlx/loops/x.py:1 step: 101 lines (cap 80)"]
    assert offenders(function("", body_lines=100, name="train_x"), "rollout/x.py") == [
        "rlx/rollout/x.py:1 train_x: 101 lines (cap 80)"]


def test_a_module_of_501_lines_fails():
    assert offenders("x = 1\n" * 500, "m.py") == []
    assert offenders("x = 1\n" * 501, "m.py") == ["rlx/m.py: module of 501 lines (cap 500)"]
