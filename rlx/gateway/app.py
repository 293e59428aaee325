"""The OpenAI-compatible routes (FastAPI), each under /v1 and /sessions/{sid}/v1:

    POST chat/completions   messages (+ tools) -> one choice; tool calls parsed (tools.py); stream=true
                            sends the finished reply as server-sent events (one content chunk)
    POST completions        prompt (text or token ids) -> one choice
    GET  models             the served model (a request's `model` is accepted whatever it names)
    GET  /health            no token needed; everything else answers 401 without the run's token

Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for a request the
gateway refuses (n > 1, a bad message, a session past its limits), 401, 404 (unknown session), 410 (a
closed session), 500 when generation failed. Sampling settings in a request are not applied (rlx's
rollout settings are: server.py note_sampling); max_tokens / max_completion_tokens can lower the cap.
`stop` strings end the reply where they first appear (the ids up to there are kept; the turn is closed
with the stop token, not trained, when a later call extends it).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rlx.gateway.chat import NotText, RequestError, normalize_messages
from rlx.gateway.tools import openai_tool_calls, parse_tool_calls


def _error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    kind = {401: "authentication_error",
            404: "not_found_error"}.get(status, "invalid_request_error" if status < 500 else "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


def _int_or_none(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{key} must be a positive integer, got {value!r}", param=key)
    return value


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop must be a string or a list of strings", param="stop")
    return [s for s in stops if s]


def _cut_at_stop(tokenizer, ids: list[int], stops: list[str]) -> tuple[list[int], str | None]:
    """(ids up to the token that completes the first stop string, text before that string), or (ids, None)."""
    if stops:
        for k in range(1, len(ids) + 1):
            text = tokenizer.decode(ids[:k], skip_special_tokens=True)
            hits = [text.index(s) for s in stops if s in text]
            if hits:
                return ids[:k], text[: min(hits)]
    return ids, None


async def _generate(gateway, session, pending, stops: list[str]):
    """Sample one call, cut at a stop string, return (ids, logprobs, stopped, text, finish, version)."""
    try:
        sampled = await asyncio.wrap_future(gateway.batcher.submit(pending.context, pending.seed, pending.budget))
    except RequestError:
        session.release(pending)
        raise
    except Exception as exc:  # the model (or the batcher) failed: a 500 the client may retry
        session.release(pending)
        raise RequestError(f"generation failed: {type(exc).__name__}: {exc}", status=500,
                           code="generation_failed") from None
    ids, cut_text = _cut_at_stop(gateway.tokenizer, sampled.ids, stops)
    stopped = sampled.stopped and cut_text is None
    text = cut_text if cut_text is not None else gateway.tokenizer.decode(ids, skip_special_tokens=True)
    finish = "stop" if stopped or cut_text is not None else "length"
    logprobs = sampled.logprobs[: len(ids)] if sampled.logprobs is not None else None
    return ids, logprobs, stopped, text, finish, sampled.version


def _token_logprobs(tokenizer, ids, logprobs) -> list[dict] | None:
    if logprobs is None:
        return None
    out = []
    for token_id, lp in zip(ids, logprobs):
        token = tokenizer.decode([token_id])
        out.append({"token": token, "logprob": lp, "bytes": list(token.encode("utf-8")), "top_logprobs": []})
    return out


def build_app(gateway) -> FastAPI:
    app = FastAPI(title="rlx gateway", docs_url=None, redoc_url=None, openapi_url=None)

    def authenticate(request: Request) -> str | None:
        """The session named by the API key (TOKEN.SID), if any; RequestError 401 without the run's token."""
        key = _bearer(request)
        token, _, key_sid = (key or "").partition(".")
        if not key or not secrets.compare_digest(token.encode(), gateway.token.encode()):
            raise RequestError("missing or wrong API key: use the gateway's token (printed at start, or given to the "
                               "harness as api_key)", status=401, code="invalid_api_key")
        return key_sid or None

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError):
        return _error(exc.status, str(exc), exc.code, exc.param)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):
        return _error(500, f"generation failed: {type(exc).__name__}: {exc}", "generation_failed")

    async def body_of(request: Request) -> dict:
        authenticate(request)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if body.get("n", 1) != 1:
            raise RequestError("n must be 1 (call again for more samples: each call is its own turn)", param="n")
        gateway.note_sampling(body)
        return body

    def session_of(request: Request, sid: str | None):
        return gateway.session(sid or authenticate(request))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    async def models(request: Request):
        authenticate(request)
        return {"object": "list", "data": [{"id": gateway.settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "rlx"}]}

    async def chat(request: Request, sid: str | None = None):
        body = await body_of(request)
        return await _chat(gateway, body, session_of(request, sid))

    async def completions(request: Request, sid: str | None = None):
        body = await body_of(request)
        return await _completions(gateway, body, session_of(request, sid))

    for prefix in ("/v1", "/sessions/{sid}/v1"):
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])
        app.add_api_route(f"{prefix}/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
    return app


async def _chat(gateway, body: dict, session):
    """/chat/completions: one turn of `session` from the request body (messages, tools, sampling), the reply as
    a chat.completion (or its event stream with stream=true)."""
    try:
        messages = normalize_messages(body.get("messages"), gateway.settings.system_prompt)
    except NotText as exc:
        session.not_text = session.not_text or str(exc)  # the harness's mistake: its run stops after the batch
        raise
    tools = body.get("tools") or None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools must be a list of tool objects", param="tools")
    if body.get("tool_choice") == "none":
        tools_for_parsing = None  # the harness asked for no tool call: the reply stays text
    else:
        tools_for_parsing = tools
    max_tokens = _int_or_none(body, "max_completion_tokens") or _int_or_none(body, "max_tokens")
    stops = _stops(body)
    pending = session.prepare_chat(messages, tools, gateway.chat_renderer(), max_tokens)
    ids, logprobs, stopped, text, finish, version = await _generate(gateway, session, pending, stops)
    parsed = parse_tool_calls(gateway.settings.tool_parser, text, tools_for_parsing)
    calls = openai_tool_calls(parsed.tool_calls, f"call_{pending.index}")
    reply = {"role": "assistant", "content": parsed.content if calls else text}
    if calls:
        reply["tool_calls"], finish = calls, "tool_calls"
    session.record(pending, ids, logprobs, stopped, text, normalize_messages([reply])[0], finish, version)
    choice = {"index": 0, "message": reply, "finish_reason": finish,
              "logprobs": {"content": _token_logprobs(gateway.tokenizer, ids, logprobs)} if body.get("logprobs")
              else None}
    usage = {"prompt_tokens": len(pending.context), "completion_tokens": len(ids),
             "total_tokens": len(pending.context) + len(ids)}
    ident, model = f"chatcmpl-{session.sid}-{pending.index}", body.get("model") or gateway.settings.model_name
    if body.get("stream"):
        return StreamingResponse(_chat_events(ident, model, reply, finish, usage, body), media_type="text/event-stream")
    return JSONResponse({"id": ident, "object": "chat.completion", "created": int(time.time()), "model": model,
                         "choices": [choice], "usage": usage})


async def _completions(gateway, body: dict, session):
    """/completions: one turn of `session` from a text prompt or token ids, the reply as a text_completion (or its
    event stream with stream=true)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    valid_ids = (isinstance(prompt, list) and prompt
                 and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))
    if not (isinstance(prompt, str) and prompt) and not valid_ids:
        if not isinstance(prompt, (str, list)):  # the observation itself is not text: the harness's run stops
            session.not_text = session.not_text or f"prompt is a {type(prompt).__name__}, not text"
        raise RequestError("prompt must be a non-empty string or a list of token ids (one prompt per call)",
                           param="prompt")
    if body.get("echo"):
        raise RequestError("echo is not supported", param="echo")
    max_tokens = _int_or_none(body, "max_tokens")
    encode = lambda text: gateway.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    pending = session.prepare_text(prompt, encode, max_tokens)
    ids, logprobs, stopped, text, finish, version = await _generate(gateway, session, pending, _stops(body))
    session.record(pending, ids, logprobs, stopped, text, None, finish, version)
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if body.get("logprobs") is not None and logprobs is not None:
        tokens = [gateway.tokenizer.decode([t]) for t in ids]
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None,
                              "text_offset": [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]}
    usage = {"prompt_tokens": len(pending.context), "completion_tokens": len(ids),
             "total_tokens": len(pending.context) + len(ids)}
    ident, model = f"cmpl-{session.sid}-{pending.index}", body.get("model") or gateway.settings.model_name
    if body.get("stream"):
        return StreamingResponse(_text_events(ident, model, choice), media_type="text/event-stream")
    return JSONResponse({"id": ident, "object": "text_completion", "created": int(time.time()), "model": model,
                         "choices": [choice], "usage": usage})


def _sse(payload) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _chat_events(ident: str, model: str, reply: dict, finish: str, usage: dict, body: dict):
    head = {"id": ident, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    delta = {"role": "assistant", "content": reply.get("content")}
    if reply.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(reply["tool_calls"])]
    yield _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    yield _sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _sse({**head, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


async def _text_events(ident: str, model: str, choice: dict):
    head = {"id": ident, "object": "text_completion", "created": int(time.time()), "model": model}
    yield _sse({**head, "choices": [{**choice, "finish_reason": None}]})
    yield _sse({**head, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"],
                                     "logprobs": None}]})
    yield "data: [DONE]\n\n"
