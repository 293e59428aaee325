"""A tool-use environment: arithmetic questions answered with the help of a calculator or Python.

One episode: the question is the first observation; each model turn either
  calls a tool      <calc>37*12</calc>            -> observation <result>444</result>
                    <python>print(37*12)</python> -> observation <result>444</result> (rlx's sandbox)
  or answers        <answer>444</answer>          -> reward 1 if right, 0 if wrong; the episode ends.
Tool results are observations, so the rollout appends them with loss mask 0: the model is never
trained to produce them. A malformed call (no tag, an expression the calculator refuses, code that
fails) is an invalid action answered with an error observation, never an exception.
"""

from __future__ import annotations

import ast
import operator
import random
import re

from rlx.envs.registry import ENVIRONMENTS

CALL = re.compile(r"<(calc|python|answer)>(.*?)</\1>", re.DOTALL)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> int:
    """Integer arithmetic (+ - * // % and parentheses) without eval; ValueError on anything else."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            result = _OPERATORS[type(node.op)](left, right)
            if abs(result) > 10**12:
                raise ValueError("number too large")
            return result
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only integers and + - * // % ( ) are allowed")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    return value(tree.body)


@ENVIRONMENTS.register("tool_use")
class ToolUse:
    """Arithmetic with tools: a product of a two-digit and a one-digit number plus a one-digit number
    (a*b+c), too hard for the tiny model alone, easy with the calculator.

    tools: which tools exist ("calc", "python"). Reward 1 for a right <answer>, 0 otherwise.
    Truncated after max_calls turns without an answer. Anchor: the number of tool calls made (the
    question is fixed by the seed), so GiGPO compares the steps at the same stage of the episode."""

    def __init__(self, tools: tuple[str, ...] | list[str] = ("calc",), max_calls: int = 3,
                 python_timeout_s: float = 5.0):
        self.tools, self.max_calls, self.python_timeout_s = tuple(tools), max_calls, python_timeout_s

    def reset(self, *, seed=None, options=None):
        rng = random.Random(seed)
        a, b, c = rng.randint(10, 99), rng.randint(2, 9), rng.randint(1, 9)
        self.expression, self.answer, self.calls = f"{a}*{b}+{c}", a * b + c, 0
        return f"{self.expression}=?", {"anchor": 0}

    def step(self, action: str):
        self.calls += 1
        match = CALL.search(action)
        reward, terminated, valid = 0.0, False, True
        if match is None:
            tags = ", ".join(f"<{t}>...</{t}>" for t in self.tools)
            obs, valid = f"error: call a tool ({tags}) or reply <answer>...</answer>", False
        elif match.group(1) == "answer":
            right = match.group(2).strip() == str(self.answer)
            obs, reward, terminated = ("correct" if right else "wrong"), float(right), True
        elif match.group(1) not in self.tools:
            obs, valid = f"error: no tool {match.group(1)}", False
        else:
            obs, valid = self._call(match.group(1), match.group(2))
        truncated = not terminated and self.calls >= self.max_calls
        info = {"anchor": self.calls, "is_action_valid": valid,
                "metrics": {"success": reward, "tool_calls": float(match is not None and match.group(1) != "answer")}}
        return obs, reward, terminated, truncated, info

    def expert_action(self) -> str:
        """Calculator first, then the answer it gave (demonstrations; not part of the protocol)."""
        return f"<calc>{self.expression}</calc>" if self.calls == 0 else f"<answer>{self.answer}</answer>"

    def random_action(self, rng: random.Random) -> str:
        """A plausible mistake: answering without the tool, off by a little."""
        return f"<answer>{self.answer + rng.choice([-10, -1, 1, 10])}</answer>"

    def _call(self, tool: str, argument: str) -> tuple[str, bool]:
        if tool == "calc":
            try:
                return f"<result>{calculate(argument)}</result>", True
            except ValueError as exc:
                return f"error: {exc}", False
        from rlx.sandbox import run_code

        result = run_code(argument, timeout_s=self.python_timeout_s)
        if not result.passed:
            last = (result.stderr.strip().splitlines() or [result.status])[-1]
            return f"error: {last[:80]}", False
        return f"<result>{result.stdout.strip()[:80]}</result>", True
