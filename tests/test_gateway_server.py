"""The gateway as a server, with a scripted generator (no model): micro-batching by count and by wait time,
the OpenAI wire protocol through the real `openai` client, auth refusals, loopback-only binding, clean stop."""

import json
import logging
import socket
import threading
import time

import httpx2 as httpx
import openai
import pytest
from openai import OpenAI

from rlx.gateway.batcher import MicroBatcher
from rlx.gateway.server import Gateway, GatewayError, GatewaySettings
from tests.gateway_fixtures import CALCULATOR, ScriptedGenerator, encode, tiny_tokenizer

EOS = 2


# ------------------------------------------------------------------ micro-batching


def _batcher(generator, **knobs):
    return MicroBatcher(generator, **knobs).start()


def test_a_batch_leaves_as_soon_as_it_holds_max_batch_requests():
    gen = ScriptedGenerator(lambda context, seed: "x")
    batcher = _batcher(gen, max_batch=3, max_wait_s=30.0)
    try:
        start = time.monotonic()
        futures = [batcher.submit([1, 2], seed, 4) for seed in range(3)]
        [f.result(timeout=10) for f in futures]
        assert time.monotonic() - start < 5  # not the 30 s wait
        assert batcher.batches == [3] and gen.calls[0]["seeds"] == [0, 1, 2]
    finally:
        batcher.stop()


def test_a_batch_waits_max_wait_for_batch_mates_then_leaves():
    gen = ScriptedGenerator(lambda context, seed: "x")
    batcher = _batcher(gen, max_batch=100, max_wait_s=0.4)
    try:
        start = time.monotonic()
        first = batcher.submit([1], 0, 4)
        time.sleep(0.1)
        second = batcher.submit([1], 1, 4)  # arrives within the wait: same batch
        first.result(timeout=10), second.result(timeout=10)
        took = time.monotonic() - start
        assert 0.35 <= took < 5 and batcher.batches == [2]
        batcher.submit([1], 2, 4).result(timeout=10)
        assert batcher.batches == [2, 1]
    finally:
        batcher.stop()


def test_a_batch_leaves_at_once_when_every_live_session_waits():
    gen = ScriptedGenerator(lambda context, seed: "x")
    batcher = _batcher(gen, max_batch=100, max_wait_s=30.0, waiting_for=lambda: 2)
    try:
        start = time.monotonic()
        futures = [batcher.submit([1], seed, 4) for seed in range(2)]
        [f.result(timeout=10) for f in futures]
        assert time.monotonic() - start < 5 and batcher.batches == [2]
    finally:
        batcher.stop()


def test_each_row_keeps_its_seed_and_is_cut_to_its_own_budget():
    """Budgets 2 and 5 in one batch: the batch asks for 5 tokens; row 0 is cut to 2 (not stopped)."""
    gen = ScriptedGenerator(lambda context, seed: [10 + seed, 20, 30, EOS])
    batcher = _batcher(gen, max_batch=2, max_wait_s=30.0, version=lambda: 4)
    try:
        short, long = batcher.submit([1], 1, 2), batcher.submit([1], 2, 5)
        a, b = short.result(timeout=10), long.result(timeout=10)
        assert gen.calls[0]["max_new_tokens"] == 5
        assert (a.ids, a.stopped) == ([11, 20], False) and (b.ids, b.stopped) == ([12, 20, 30, EOS], True)
        assert a.logprobs == [-0.5, -0.5] and a.version == b.version == 4
        assert gen.threads == {"rlx-gateway-batcher"}  # the model is only touched by the worker thread
    finally:
        batcher.stop()


def test_a_generator_failure_reaches_every_caller_of_the_batch():
    batcher = _batcher(ScriptedGenerator(lambda c, s: "x", fail=True), max_batch=2, max_wait_s=30.0)
    try:
        futures = [batcher.submit([1], seed, 4) for seed in range(2)]
        for f in futures:
            with pytest.raises(RuntimeError, match="the model broke"):
                f.result(timeout=10)
    finally:
        batcher.stop()


# ------------------------------------------------------------------ the server


@pytest.fixture
def served():
    """A started gateway on a scripted generator that answers "L" (or a tool call when the prompt mentions one)."""
    def reply(context, seed):
        text = tiny_tokenizer().decode(context)
        if "TOOL" in text:
            return '<tool_call>\n{"name": "calc", "arguments": {"expression": "1+2"}}\n</tool_call>'
        if "BROKEN" in text:
            return '<tool_call>\n{"name": "calc", "arguments": {</tool_call>'
        return "L R"

    gen = ScriptedGenerator(reply)
    with Gateway(gen, tiny_tokenizer(),
                 GatewaySettings(max_new_tokens=128, max_total_tokens=400, max_wait_ms=1)) as gateway:
        gateway.open_session("s1", 11)
        yield gateway, gen


def client(gateway, sid="s1", key=None):
    return OpenAI(base_url=gateway.base_url(sid), api_key=key or gateway.token, max_retries=0)


def test_chat_completion_shape_and_any_model_name(served):
    gateway, gen = served
    out = client(gateway).chat.completions.create(model="gpt-4o-whatever", messages=[{"role": "user", "content": "hi"}],
                                                  logprobs=True)
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.model == "gpt-4o-whatever"
    assert choice.message.role == "assistant" and choice.message.content == "L R" and choice.finish_reason == "stop"
    assert (out.usage.completion_tokens == len(encode("L R")) + 1
            and len(choice.logprobs.content) == out.usage.completion_tokens)
    assert [m.id for m in client(gateway).models.list().data] == ["rlx"]
    assert gateway.sessions["s1"].calls[0].text == "L R"


def test_tool_calls_are_parsed_and_tool_results_accepted(served):
    gateway, _ = served
    c = client(gateway)
    messages = [{"role": "user", "content": "TOOL 1+2?"}]
    out = c.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR])
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls" and message.content is None
    assert message.tool_calls[0].function.name == "calc" and message.tool_calls[0].id == "call_0_0"
    messages += [message, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "3"}]
    c.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR])
    assert gateway.sessions["s1"].forks == 0 and len(gateway.sessions["s1"].rows) == 1
    broken = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "BROKEN"}], tools=[CALCULATOR])
    assert broken.choices[0].message.tool_calls is None and broken.choices[0].finish_reason == "stop"
    assert broken.choices[0].message.content.startswith("<tool_call>")


def test_stream_and_completions_and_stop_strings(served):
    gateway, _ = served
    c = client(gateway)
    chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "L R"
    assert chunks[-1].usage.completion_tokens == len(encode("L R")) + 1
    cut = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}], stop=[" R"])
    assert cut.choices[0].message.content == "L" and cut.choices[0].finish_reason == "stop"
    text = c.completions.create(model="m", prompt="Q:", max_tokens=2)
    assert (text.choices[0].text == tiny_tokenizer().decode(encode("L R")[:2])
            and text.choices[0].finish_reason == "length")


def test_the_session_can_ride_in_the_api_key(served):
    gateway, _ = served
    OpenAI(base_url=gateway.base_url(), api_key=f"{gateway.token}.s1", max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
    assert len(gateway.sessions["s1"].calls) == 1


def test_requests_the_gateway_refuses(served):
    gateway, _ = served
    c = client(gateway)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2)
    with pytest.raises(openai.BadRequestError, match="role"):
        c.chat.completions.create(model="m", messages=[{"role": "robot", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        client(gateway, sid="nobody").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    gateway.close_session("s1")
    with pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 410


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}])
@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                                         ("POST", "/sessions/s1/v1/chat/completions"), ("POST", "/v1/completions")])
def test_no_token_or_a_wrong_one_gets_401(served, headers, method, path):
    gateway, gen = served
    response = httpx.request(method, gateway.url + path, headers=headers,
                             json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "x"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert gen.calls == []
    assert httpx.get(gateway.url + "/health").status_code == 200  # liveness needs no token
    with pytest.raises(openai.AuthenticationError):
        client(gateway, key="not-the-token").models.list()


def test_rlx_sampling_settings_win_and_a_difference_is_logged_once(served, caplog):
    gateway, gen = served
    c = client(gateway)
    with caplog.at_level(logging.WARNING, logger="rlx"):
        for _ in range(2):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.2,
                                      max_tokens=500)
    lines = [r.getMessage() for r in caplog.records]
    assert (sum("temperature=0.2" in line for line in lines) == 1
            and sum("max_tokens=500" in line for line in lines) == 1)
    assert all(call["max_new_tokens"] <= 128 for call in gen.calls)  # the cap wins


def test_binding_is_loopback_only_unless_allowed_and_the_port_comes_from_the_os():
    gen = ScriptedGenerator(lambda c, s: "x")
    with pytest.raises(GatewayError, match="not a loopback address"):
        Gateway(gen, tiny_tokenizer(), host="0.0.0.0")
    Gateway(gen, tiny_tokenizer(), host="0.0.0.0", allow_remote=True)  # explicit: accepted
    with Gateway(gen, tiny_tokenizer()) as gateway:
        assert gateway.host == "127.0.0.1" and gateway.port > 0 and len(gateway.token) == 32


def test_stop_closes_the_port_and_the_threads_on_exit_and_on_error():
    gen = ScriptedGenerator(lambda c, s: "x")
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(KeyboardInterrupt):
        with Gateway(gen, tiny_tokenizer()) as gateway:
            port = gateway.port
            raise KeyboardInterrupt
    time.sleep(0.2)
    assert {t.name for t in threading.enumerate()} - before == set()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_the_gateway_command_serves_a_model_prints_its_url_and_token_and_stops_on_sigterm(tmp_path):
    """`rlx gateway model.path=builtin:tiny_agent`: a real client call through the printed base_url and api_key is
    recorded in its session; SIGTERM stops it (exit 0) and --record writes the session's token rows."""
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO

    record = tmp_path / "sessions.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    process = subprocess.Popen([sys.executable, "-m", "rlx", "gateway", "model.path=builtin:tiny_agent",
                                "env.max_new_tokens=4", "hardware.num_threads=1", "--record", str(record)],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = {}
        while "api_key:" not in lines:
            line = process.stdout.readline()
            assert line, process.stderr.read()[-2000:]
            key, _, value = line.partition(" ")
            lines[key] = value.split()[0] if value.split() else ""
        base = lines["base_url:"].removesuffix("/v1")
        OpenAI(base_url=f"{base}/sessions/mine/v1", api_key=lines["api_key:"], max_retries=0).chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "..A.KD no key"}])
        assert httpx.get(f"{base}/v1/models").status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0
    (session,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert session["session"] == "mine" and session["calls"] == 1 and sum(session["rows"][0]["loss_mask"]) >= 1
