"""Chat messages as the gateway reads, compares and renders them.

normalize_messages: the request's messages as plain dicts (role, content text, tool_calls, tool_call_id,
    name); content given as a list of text parts is joined; anything else is a RequestError (HTTP 400).
same_message: is a message the harness sent back the assistant message the gateway returned? Lenient
    where clients differ (null vs "" content, extra null fields, call ids, argument JSON spacing), or
    the raw sampled text given as content.
ChatRenderer: token ids of a first prompt (the chat template, tools included) and of the messages that
    follow a sampled assistant turn (what the template puts after the sampled stop token, then the new
    messages, then the generation prompt), read off two renderings of the conversation that differ only
    in the new messages. Sampled ids are never rendered: the session keeps them as they were drawn.
"""

from __future__ import annotations

import json

ROLES = ("system", "developer", "user", "assistant", "tool")
_PLACEHOLDER = "\x01A\x01"


class RequestError(ValueError):
    """A request the gateway refuses (HTTP status, OpenAI error code, one-line message)."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class NotText(RequestError):
    """A message content (an observation the harness shows the model) that is not text: HTTP 400 to the client,
    and under env=harness the run stops with one line (rlx/gateway/harness.py)."""

    def __init__(self, message: str):
        super().__init__(message, param="messages")


def _text(content, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise NotText(f"{where}: content part of type {kind!r} is not supported (text only)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    shown = repr(content)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise NotText(f"{where}: content is a {type(content).__name__} ({shown}), not text; it must be a string or a list "
                  f"of text parts")


def _tool_calls(calls, where: str) -> list[dict]:
    out = []
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}: each tool call needs function.name", param="messages")
        arguments = function.get("arguments", "{}")
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": function["name"],
                                 "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    return out


def normalize_messages(messages, system_prompt: str | None = None) -> list[dict]:
    """Plain dicts with the keys that matter for rendering; system_prompt is put first when the
    conversation does not open with a system message."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise RequestError(f"messages[{i}]: role {role!r} is not one of {', '.join(ROLES)}", param="messages")
        msg = {"role": m["role"], "content": _text(m.get("content"), f"messages[{i}]")}
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"messages[{i}]")
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = str(m[key])
        out.append(msg)
    if system_prompt and out[0]["role"] not in ("system", "developer"):
        out.insert(0, {"role": "system", "content": system_prompt})
    return out


def _arguments(text: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def _comparable(m: dict) -> tuple:
    calls = tuple((c["function"]["name"], json.dumps(_arguments(c["function"]["arguments"]), sort_keys=True))
                  for c in m.get("tool_calls") or [])
    return m["role"], m.get("content") or "", calls, m.get("tool_call_id"), m.get("name")


def same_message(sent: dict, expected: dict, raw_text: str | None = None) -> bool:
    """sent == expected up to null/"" content, call ids and argument spacing; for an assistant message
    the gateway returned, also its raw sampled text as plain content (a harness that keeps the text)."""
    a, b = _comparable(sent), _comparable(expected)
    if a[:3] == b[:3] and (a[3:] == b[3:] or sent["role"] == "assistant"):
        return True
    return (raw_text is not None and sent["role"] == "assistant" and not sent.get("tool_calls")
            and (sent.get("content") or "").strip() == raw_text.strip())


def same_tools(a: list | None, b: list | None) -> bool:
    return json.dumps(a or [], sort_keys=True) == json.dumps(b or [], sort_keys=True)


def for_template(messages: list[dict]) -> list[dict]:
    """Copies a chat template can read: null content as "", tool-call arguments as objects (templates
    write them with `| tojson`; a JSON string would be quoted twice)."""
    out = []
    for m in messages:
        m = dict(m, content=m.get("content") or "")
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


class ChatRenderer:
    """Chat template rendering for one tokenizer (or a template given in place of the tokenizer's own)."""

    def __init__(self, tokenizer, chat_template: str | None = None, stop_text: str | None = None):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        if not (chat_template or getattr(tokenizer, "chat_template", None)):
            raise ValueError("the tokenizer has no chat template: give one (env.chat_template=FILE) or call "
                             "/v1/completions")
        self.stop_text = tokenizer.eos_token if stop_text is None else stop_text

    def render(self, messages: list[dict], tools: list | None, generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(for_template(messages), tools=tools or None, tokenize=False,
                                                      add_generation_prompt=generation_prompt,
                                                      chat_template=self.chat_template)
        except Exception as exc:  # the template's own checks (role order, missing fields) refuse the conversation
            raise RequestError(f"the chat template cannot render these messages: {type(exc).__name__}: {exc}",
                               param="messages") from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict], tools: list | None) -> list[int]:
        return self.encode(self.render(messages, tools, True))

    def continuation_ids(self, history: list[dict], new: list[dict], tools: list | None) -> list[int] | None:
        """Ids that follow a sampled assistant turn (history[-1], closed by the sampled stop token): the
        rest of the template's closing of that turn, the new messages, the generation prompt. None when
        the template rewrites earlier turns once the new messages are added (the session forks then)."""
        head = history[:-1] + [{"role": "assistant", "content": _PLACEHOLDER}]
        closed = self.render(head, tools, False)
        after = closed[closed.rindex(_PLACEHOLDER) + len(_PLACEHOLDER):]
        closing = after[len(self.stop_text):] if self.stop_text and after.startswith(self.stop_text) else after
        base = self.render(history, tools, False)
        full = self.render(history + new, tools, True)
        if not full.startswith(base):
            return None
        return self.encode(closing + full[len(base):])
