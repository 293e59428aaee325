"""One harness episode = one session: its model calls kept as token rows, token-in/token-out across turns.

A row is one token sequence the trainer can read as an episode: a first prompt rendered by the chat
template, then each call's sampled ids exactly as drawn (loss mask 1, sampler log-probs) and, between
calls, the ids of the messages the harness added (loss mask 0). A call EXTENDS a row when its messages are
the row's messages (the previous call's messages plus the assistant message the gateway returned, compared
leniently: chat.same_message) followed by new ones: the row gets what the template puts after the sampled
stop token, the new messages and the generation prompt (chat.ChatRenderer.continuation_ids), and nothing
the model sampled is decoded and encoded again. Otherwise the harness rewrote or trimmed its history (or
changed its tools, or called again with the same messages) and the session FORKS a new row: it copies the
longest prefix of an existing row that ends right after a sampled assistant turn whose messages still
match (those ids, sampled once, are context in the copy: loss mask 0, so no token is trained twice) and
renders the rest; with no such prefix the new row is rendered from scratch. Forks are counted.

/v1/completions calls extend a row when the prompt starts with the row's text (prompt + completions so
far; the rest of the prompt is encoded and appended) or, for a prompt of token ids, with the row's ids.

Limits, per session: max_turns calls, max_new_tokens per call, max_total_tokens per row (prompt included).
A call past a limit is refused (RequestError 400) and the session is marked `cut` (a truncated episode).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from rlx.gateway.chat import ChatRenderer, RequestError, same_message, same_tools

log = logging.getLogger("rlx")
# call t of the session with sample seed s samples with seed s * TURN_STRIDE + t (as rollout/env.py)
TURN_STRIDE = 1000003


@dataclass
class Limits:
    max_turns: int            # model calls per session
    max_new_tokens: int       # sampled tokens per call (a request's max_tokens can only lower it)
    max_total_tokens: int     # tokens of a row, prompt included (the model's context)


@dataclass
class Boundary:
    """The end of an assistant turn in a row: where a later call can extend or a fork can copy from."""

    messages: int             # messages up to and including that assistant message
    offset: int               # len(row.ids) just after its sampled ids
    stopped: bool             # the sampled ids end with a stop token (else the continuation adds one)
    raw: str                  # the sampled text (a harness may send it back as plain content)


@dataclass
class Row:
    prompt_ids: list[int]
    kind: str = "chat"                                   # chat | text (/v1/completions)
    ids: list[int] = field(default_factory=list)         # everything after prompt_ids
    loss_mask: list[int] = field(default_factory=list)   # 1 on ids sampled in this row, else 0
    logprobs: list[float] = field(default_factory=list)  # sampler log-prob (0.0 where loss_mask is 0)
    messages: list[dict] = field(default_factory=list)   # chat: the conversation held, ending with the reply returned
    tools: list | None = None
    boundaries: list[Boundary] = field(default_factory=list)
    text: str | None = None                              # text rows with a string prompt: prompt + completions so far
    busy: bool = False                                   # a call on this row is being generated

    def append(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.loss_mask += [int(sampled)] * len(ids)
        self.logprobs += list(logprobs) if sampled and logprobs is not None else [0.0] * len(ids)

    def matches(self, messages: list[dict], count: int) -> bool:
        """The first `count` messages of the request are this row's first `count` messages."""
        if count > len(self.messages) or count > len(messages):
            return False
        raw = {b.messages - 1: b.raw for b in self.boundaries}
        return all(same_message(messages[i], self.messages[i], raw.get(i)) for i in range(count))


@dataclass
class Call:
    """One model call of a session."""

    index: int
    row: int                  # the row it was sampled in (index into Session.rows)
    span: tuple[int, int]     # [start, end) of its sampled ids in that row's `ids`
    version: int              # Gateway.version when it was sampled
    finish_reason: str        # stop | length | tool_calls
    text: str                 # the sampled text (special tokens removed)
    observation: str          # what the harness showed the model for this call (the new messages' text)


@dataclass
class Pending:
    """A call prepared and waiting for its tokens."""

    row: Row
    new_row: bool
    prefix: list[int]         # ids appended before the sampled ones (loss mask 0)
    context: list[int]        # the whole input of the model
    budget: int
    seed: int
    index: int
    messages: list[dict] | None
    prompt_text: str | None
    observation: str


class Session:
    def __init__(self, sid: str, sample_seed: int, limits: Limits, stop_id: int | None):
        self.sid, self.sample_seed, self.limits, self.stop_id = sid, sample_seed, limits, stop_id
        self.rows: list[Row] = []
        self.calls: list[Call] = []
        self.started = 0          # calls prepared (their index), including failed ones
        self.forks = 0
        self.fork_reasons: list[str] = []
        self.cut: str | None = None   # the limit that refused a call
        self.not_text: str | None = None  # the first refusal of a message content that is not text (gateway/app.py)
        self.closed = False
        self.lock = threading.Lock()

    # ---------------------------------------------------------------- chat
    def prepare_chat(self, messages: list[dict], tools: list | None, renderer: ChatRenderer,
                     max_tokens: int | None = None) -> Pending:
        if messages[-1]["role"] == "assistant":
            raise RequestError("the last message is an assistant message; end with a user or tool message",
                               param="messages")
        with self.lock:
            self._check_open()
            row, prefix, new_row = self._chat_row(messages, tools, renderer)
            observation = "\n".join(m.get("content") or "" for m in messages[len(row.messages):] if m["role"]
                                    != "assistant")
            return self._pending(row, new_row, prefix, max_tokens, messages=messages, observation=observation)

    def _chat_row(self, messages, tools, renderer) -> tuple[Row, list[int], bool]:
        chat = [r for r in self.rows if r.kind == "chat" and same_tools(r.tools, tools)]
        follows = [r for r in chat if len(r.messages) < len(messages) and r.matches(messages, len(r.messages))]
        extendable = [r for r in follows if not r.busy]
        if extendable:
            row = max(reversed(extendable), key=lambda r: len(r.messages))  # the longest; the latest among equals
            prefix = self._continuation(row.boundaries[-1], messages, tools, renderer)
            if prefix is not None:
                return row, prefix, False
            reason = "the chat template rewrites earlier turns"
        elif not self.rows:
            reason = None  # the first call: not a fork
        elif not chat:
            reason = "tools changed"
        elif follows:
            reason = "a second call on a conversation whose reply is still being generated"
        else:
            reason = "history rewritten, trimmed or repeated"
        row = self._fork(chat, messages, tools, renderer)
        if reason:
            self.forks += 1
            self.fork_reasons.append(reason)
            log.debug("gateway session %s forks row %d: %s", self.sid, len(self.rows), reason)
        return row, [], True

    def _continuation(self, boundary: Boundary, messages, tools, renderer) -> list[int] | None:
        count = boundary.messages
        ids = renderer.continuation_ids(messages[:count], messages[count:], tools)
        if ids is None:
            return None
        close = [] if boundary.stopped or self.stop_id is None else [self.stop_id]  # a cut turn still ends
        return close + ids

    def _fork(self, chat: list[Row], messages, tools, renderer) -> Row:
        """A new row: the deepest matching prefix of an existing row that ends after a sampled turn,
        copied as context, then the rest of the messages; or the whole conversation rendered."""
        best = None
        for row in chat:
            for b in row.boundaries:
                if b.messages < len(messages) and (best is None or b.messages > best[1].messages) \
                        and row.matches(messages, b.messages):
                    best = (row, b)
        if best is not None:
            parent, b = best
            prefix = self._continuation(b, messages, tools, renderer)
            if prefix is not None:
                row = Row(prompt_ids=list(parent.prompt_ids), tools=tools,
                          boundaries=[x for x in parent.boundaries if x.offset <= b.offset],
                          messages=messages[:b.messages])
                row.append(parent.ids[:b.offset], sampled=False)
                row.append(prefix, sampled=False)
                return row
        return Row(prompt_ids=renderer.prompt_ids(messages, tools), tools=tools)

    # ---------------------------------------------------------------- text
    def prepare_text(self, prompt: str | list[int], encode, max_tokens: int | None = None) -> Pending:
        with self.lock:
            self._check_open()
            for row in reversed(self.rows):
                if row.kind != "text" or row.busy:
                    continue
                if isinstance(prompt, str) and row.text is not None and prompt.startswith(row.text):
                    rest = prompt[len(row.text):]
                    return self._pending(row, False, encode(rest) if rest else [], max_tokens, prompt_text=prompt,
                                         observation=rest)
                whole = row.prompt_ids + row.ids
                if isinstance(prompt, list) and row.text is None and prompt[:len(whole)] == whole:
                    return self._pending(row, False, prompt[len(whole):], max_tokens, observation="")
            if self.rows:
                self.forks += 1
                self.fork_reasons.append("prompt rewritten")
            ids = encode(prompt) if isinstance(prompt, str) else list(prompt)
            row = Row(prompt_ids=ids, kind="text", text=prompt if isinstance(prompt, str) else None)
            return self._pending(row, True, [], max_tokens, prompt_text=prompt if isinstance(prompt, str) else None,
                                 observation=prompt if isinstance(prompt, str) else "")

    # ---------------------------------------------------------------- both
    def _check_open(self) -> None:
        if self.closed:
            raise RequestError(f"session {self.sid} is closed (its episode ended or timed out)", status=410,
                               code="session_closed")
        if self.started >= self.limits.max_turns:
            self.cut = "max_turns"
            raise RequestError(f"session {self.sid} made its {self.limits.max_turns} calls (env.max_turns)",
                               code="max_turns_exceeded")

    def _pending(self, row: Row, new_row: bool, prefix: list[int], max_tokens: int | None, *, messages=None,
                 prompt_text=None, observation="") -> Pending:
        context = row.prompt_ids + row.ids + prefix
        room = self.limits.max_total_tokens - len(context)
        if room < 1:
            self.cut = "max_total_tokens"
            raise RequestError(f"the conversation is {len(context)} tokens; env.max_total_tokens="
                               f"{self.limits.max_total_tokens} leaves no room for a reply",
                               code="context_length_exceeded")
        budget = min(self.limits.max_new_tokens, room, max_tokens or self.limits.max_new_tokens)
        index = self.started
        self.started += 1
        row.busy = not new_row
        return Pending(row, new_row, prefix, context, budget, self.sample_seed * TURN_STRIDE + index, index, messages,
                       prompt_text, observation)

    def record(self, pending: Pending, ids: list[int], logprobs: list[float] | None, stopped: bool, text: str,
               reply: dict | None, finish_reason: str, version: int) -> None:
        """Keep a finished call: the prefix (loss mask 0), the sampled ids (loss mask 1), the reply."""
        with self.lock:
            row = pending.row
            row.busy = False
            if self.closed:  # the episode ended (timeout) while this call was generating: nothing to train
                return
            if pending.new_row:
                self.rows.append(row)
            row.append(pending.prefix, sampled=False)
            start = len(row.ids)
            row.append(ids, sampled=True, logprobs=logprobs if logprobs is not None else [0.0] * len(ids))
            if reply is not None:
                row.messages = pending.messages + [reply]
                row.boundaries.append(Boundary(len(row.messages), len(row.ids), stopped, text))
            elif pending.prompt_text is not None:
                row.text = pending.prompt_text + text
            self.calls.append(Call(pending.index, self.rows.index(row), (start, len(row.ids)), version, finish_reason,
                                   text, pending.observation))

    def release(self, pending: Pending) -> None:
        """A call that failed: its row is free again, nothing recorded."""
        with self.lock:
            pending.row.busy = False
