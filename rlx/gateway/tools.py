"""Tool calls in a completion's text -> OpenAI `tool_calls`, by a small registry of parsers.

A parser reads the text the model sampled (special tokens removed) and the `tools` the request declared,
and returns the assistant message's `content` and its `tool_calls`. A call it cannot read (broken JSON,
no name, an unclosed tag) leaves the whole text as plain content and no tool call: the harness sees what
the model wrote, never an error. Parsing changes only the message the harness gets back: the session
keeps the sampled token ids (sessions.py), so a call that renders back differently through the chat
template still trains on exactly what was sampled.

    hermes  <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call (Hermes 2 Pro,
            Qwen 2.5 / Qwen 3 chat templates); the content is the text before the first block.
    tags    <NAME>argument</NAME> for each declared tool NAME that has exactly one parameter (the built-in
            tiny agent's own format: <calc>37*12</calc>, rlx/envs/tools.py); content: the text before it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from rlx.registry import publish


@dataclass
class ParsedMessage:
    content: str | None                                    # None when the message is only tool calls
    tool_calls: list[dict] = field(default_factory=list)   # [{"name": str, "arguments": dict}], ids added later


TOOL_PARSERS: dict[str, Callable[[str, list[dict]], ParsedMessage]] = publish("tool_parser", {})


def register(name: str):
    """@register("name") adds a parser fn(text, tools) -> ParsedMessage to TOOL_PARSERS."""

    def add(fn):
        TOOL_PARSERS[name] = fn
        return fn

    return add


def _plain(text: str) -> ParsedMessage:
    return ParsedMessage(content=text, tool_calls=[])


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@register("hermes")
def hermes(text: str, tools: list[dict]) -> ParsedMessage:
    """Every <tool_call>{json}</tool_call> block; the JSON holds "name" (a string) and "arguments" (an
    object, or a string holding one). Anything else between or after the blocks except whitespace, a
    second <tool_call> without its end tag, or one block that does not parse: plain content."""
    start = text.find("<tool_call>")
    if start < 0:
        return _plain(text)
    calls, end = [], start
    for match in _HERMES_BLOCK.finditer(text, start):
        if text[end:match.start()].strip():
            return _plain(text)
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            return _plain(text)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
            return _plain(text)
        arguments = body.get("arguments", body.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return _plain(text)
        if not isinstance(arguments, dict):
            return _plain(text)
        calls.append({"name": body["name"], "arguments": arguments})
        end = match.end()
    if not calls or text[end:].strip():  # an unclosed block, or text after the last call
        return _plain(text)
    return ParsedMessage(content=text[:start].rstrip() or None, tool_calls=calls)


def _one_parameter(tool: dict) -> tuple[str, str] | None:
    """(tool name, its only parameter) of a function tool with exactly one parameter, else None."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    properties = (function.get("parameters") or {}).get("properties") or {}
    return (function["name"], next(iter(properties))) if len(properties) == 1 else None


@register("tags")
def tags(text: str, tools: list[dict]) -> ParsedMessage:
    """<NAME>argument</NAME> for a declared one-parameter tool NAME -> {"name": NAME, "arguments":
    {param: argument}}; every such tag in the text is a call. Undeclared tags are plain text."""
    declared = dict(filter(None, map(_one_parameter, tools)))
    if not declared:
        return _plain(text)
    names = "|".join(re.escape(n) for n in declared)
    calls, first = [], None
    for match in re.finditer(rf"<({names})>(.*?)</\1>", text, re.DOTALL):
        first = match.start() if first is None else first
        calls.append({"name": match.group(1), "arguments": {declared[match.group(1)]: match.group(2)}})
    if not calls:
        return _plain(text)
    return ParsedMessage(content=text[:first].rstrip() or None, tool_calls=calls)


def parse_tool_calls(parser: str | None, text: str, tools: list[dict] | None) -> ParsedMessage:
    """The message for `text`: parsed by TOOL_PARSERS[parser] when the request declared tools, else plain.
    A parser that raises is treated as finding no call (the text comes back as content)."""
    if not parser or not tools:
        return _plain(text)
    try:
        return TOOL_PARSERS[parser](text, tools)
    except Exception:  # a parser's bug must not turn a model's reply into a failed request
        return _plain(text)


def openai_tool_calls(calls: list[dict], id_prefix: str) -> list[dict]:
    """OpenAI's wire shape: [{"id", "type": "function", "function": {"name", "arguments": JSON text}}]."""
    return [{"id": f"{id_prefix}_{k}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for k, c in enumerate(calls)]
