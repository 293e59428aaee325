"""rollout=server without vLLM (the fast suite): address checks, the retry policy, answer checks, the whole
generator against a small fake of vLLM's endpoints (this test's own HTTP server on a port the OS picks), and the
guard that takes the server's process group down with the trainer. The real server: tests/test_server_rollout.py
(`make test-vllm`)."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from omegaconf import OmegaConf

from rlx.config.paths import CONF_DIR
from rlx.errors import UserError
from rlx.fleet.client import BadAnswer, Refused, parse_completion, with_retries
from rlx.fleet.process import (
    EngineArgs,
    RolloutServerError,
    ServerProcess,
    check_server_settings,
    is_loopback,
    log_tail,
    lora_rank_slot,
    normalize_urls,
    server_command,
    server_env,
)


def rollout_cfg(**server):
    hf = OmegaConf.load(CONF_DIR / "rollout" / "hf.yaml")
    srv = OmegaConf.load(CONF_DIR / "rollout" / "server.yaml")
    srv.pop("defaults")
    return OmegaConf.merge(hf, srv, {"server": server})


# ------------------------------------------------------------------------------------------------
# addresses
# ------------------------------------------------------------------------------------------------


def test_loopback_only_unless_allowed():
    assert is_loopback("127.0.0.1") and is_loopback("127.3.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("gpu-node-1")
    assert normalize_urls(["http://127.0.0.1:8000/", "http://localhost:8001/v1"], False) == [
        "http://127.0.0.1:8000", "http://localhost:8001"]
    with pytest.raises(UserError, match=r"10\.0\.0\.5:8000 is not on this machine.*allow_remote=true"):
        normalize_urls(["http://10.0.0.5:8000"], False)
    assert normalize_urls(["http://10.0.0.5:8000"], True) == ["http://10.0.0.5:8000"]
    for bad in ("127.0.0.1:8000", "http://127.0.0.1", "ftp://127.0.0.1:21", "http://127.0.0.1:8000/generate"):
        with pytest.raises(UserError, match="write it as http://HOST:PORT"):
            normalize_urls([bad], True)
    with pytest.raises(UserError, match="twice"):
        normalize_urls(["http://127.0.0.1:8000", "http://127.0.0.1:8000/"], False)
    with pytest.raises(UserError, match=r"rollout.server.host=0.0.0.0 .*allow_remote=true"):
        check_server_settings(rollout_cfg(host="0.0.0.0"))
    check_server_settings(rollout_cfg(host="0.0.0.0", allow_remote=True, python=sys.executable))
    if importlib.util.find_spec("vllm") is None:  # the default environment: no vLLM to start a child with
        with pytest.raises(UserError, match="rollout=server starts vLLM's server with this Python, which has no vLLM"):
            check_server_settings(rollout_cfg())
    check_server_settings(rollout_cfg(python=sys.executable), processes=2)  # rank 0 drives the server (async_rules)
    with pytest.raises(UserError, match="rollout.server.python=/no/such/python is not an executable"):
        check_server_settings(rollout_cfg(python="/no/such/python"))


def test_a_remote_bind_stops_rlx_train_before_any_work():
    """The rule runs in check_run (before data and model load), and the schema knows every server knob."""
    from rlx.cli.training import check_run
    from rlx.config.groups import LoraPush
    from rlx.config.overrides import check_overrides
    from rlx.fleet.process import LORA_PUSH

    assert [m.value for m in LoraPush] == list(LORA_PUSH)
    with pytest.raises(UserError, match="rollout.server.host=0.0.0.0"):
        check_run(check_overrides(["rollout=server", "rollout.server.host=0.0.0.0"]))
    with pytest.raises(UserError, match="rollout.server.max_retries=-1 is not valid"):
        check_run(check_overrides(["rollout=server", "rollout.server.max_retries=-1"]))
    with pytest.raises(UserError, match="unknown rollout.server.lora_push 'merge'"):
        check_run(check_overrides(["rollout=server", "rollout.server.lora_push=merge"]))
    check_run(check_overrides(["rollout=server", "rollout.server.urls=[http://127.0.0.1:9]"]))


def test_server_command_and_environment():
    engine = EngineArgs(dtype="float32", gpu_memory_utilization=0.3, max_model_len=256, enforce_eager=True,
                        kv_cache_gib=0.25, max_num_batched_tokens=None)
    command = server_command("/py", "/m", "127.0.0.1", 4321, engine, seed=3, lora_rank=12,
                             extra_args=["--max-num-seqs", 8])
    text = " ".join(command)
    assert command[:3] == ["/py", "-m", "vllm.entrypoints.launchers.api_server.entry"]
    for part in ("--model /m", "--host 127.0.0.1 --port 4321", "--seed 3", "--logprobs-mode processed_logprobs",
                 "--generation-config vllm", "--disable-uvicorn-access-log", "--max-model-len 256", "--enforce-eager",
                 f"--kv-cache-memory-bytes {2**28}", "--enable-lora --max-lora-rank 16", "--max-num-seqs 8"):
        assert part in text, part
    assert "--max-num-batched-tokens" not in text
    assert lora_rank_slot(1) == 1 and lora_rank_slot(8) == 8 and lora_rank_slot(9) == 16
    env = server_env({"PATH": "/bin", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "MASTER_PORT": "1"}, lora=True,
                     extra={"VLLM_CPU_OMP_THREADS_BIND": 1})
    assert env == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
                   "VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in server_env({}, lora=False, extra={})


# ------------------------------------------------------------------------------------------------
# retries and answers
# ------------------------------------------------------------------------------------------------


def test_retries_are_bounded_and_back_off():
    """Two failures then an answer with retries=2: the answer, after sleeps of 0.5 and 1.0 (backoff doubles).
    Three failures: one error naming the count and the last failure."""
    slept, calls = [], []

    def flaky(fail_times):
        def call():
            calls.append(1)
            if len(calls) <= fail_times:
                raise ConnectionRefusedError(f"refused #{len(calls)}")
            return "ok"
        return call

    assert with_retries(flaky(2), retries=2, backoff_s=0.5, what="x", sleep=slept.append) == "ok"
    assert slept == [0.5, 1.0] and len(calls) == 3
    calls.clear()
    with pytest.raises(RolloutServerError, match=r"^a request failed 3 times, last: refused #3$") as info:
        with_retries(flaky(5), retries=2, backoff_s=0.0, what="a request", sleep=slept.append)
    assert info.value.resumable and len(calls) == 3
    calls.clear()
    with pytest.raises(RolloutServerError, match=r"the server exited \(while x\)"):  # a dead child: no retry
        with_retries(flaky(5), retries=2, backoff_s=0.0, what="x", dead=lambda: "the server exited", sleep=slept.append)
    assert len(calls) == 1

    def refused():
        calls.append(1)
        raise Refused("HTTP 400 prompt too long")

    calls.clear()
    with pytest.raises(RolloutServerError, match="refused x: HTTP 400") as info:
        with_retries(refused, retries=2, backoff_s=0.0, what="x", sleep=slept.append)
    assert not info.value.resumable and len(calls) == 1
    assert "resume=" not in info.value.for_run("/r")
    assert RolloutServerError("it died").for_run("/runs/a") == ("it died; the last checkpoint is intact, continue "
                                                                 "with: rlx train resume=/runs/a")


def test_a_connection_broken_mid_answer_is_a_failure_like_any_other():
    """The server dying while it sends an answer (http.client.IncompleteRead, RemoteDisconnected) is retried and,
    when it persists, ends in the one-line RolloutServerError, not a traceback."""
    import http.client

    calls = []

    def broken():
        calls.append(1)
        if len(calls) == 1:
            raise http.client.IncompleteRead(b"", 1021)
        raise http.client.RemoteDisconnected("Remote end closed connection without response")

    with pytest.raises(RolloutServerError, match=r"^x failed 2 times, last: Remote end closed connection"):
        with_retries(broken, retries=1, backoff_s=0.0, what="x", sleep=lambda s: None)
    assert len(calls) == 2


def test_a_failing_batch_stops_asking():
    """After the first failed row, rows not yet sent are cancelled: at most the one already picked up by the
    (single) worker runs besides it, not the whole batch; the first error is the one raised."""
    from rlx.fleet.client import RequestPolicy, ServerClient

    client = ServerClient(["http://127.0.0.1:9"], RequestPolicy(timeout_s=1, retries=0, backoff_s=0, concurrency=1))
    called = []

    def row(i):
        called.append(i)
        time.sleep(0.05)
        if i == 0:
            raise RolloutServerError("row 0 failed")
        return i

    with pytest.raises(RolloutServerError, match="row 0 failed"):
        client.map(row, list(range(10)))
    assert called[0] == 0 and len(called) <= 2, called
    assert client.map(lambda i: i * 2, [1, 2, 3]) == [2, 4, 6]
    client.close()


def test_answer_checks():
    good = {"choices": [{"token_ids": [5, 6, 2], "logprobs": {"token_logprobs": [-0.1, -2.0, 0.0]}}]}
    assert parse_completion(good, max_new_tokens=3, vocab_size=10, stop_ids=[2]) == ([5, 6, 2], [-0.1, -2.0, 0.0], True)
    cut = {"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.1, -2.0]}}]}
    assert parse_completion(cut, max_new_tokens=3, vocab_size=10, stop_ids=[2])[2] is False
    garbage = [
        ({"choices": []}, "no token ids"), ({"error": "x"}, "no token ids"), ("<html>", "no token ids"),
        ({"choices": [{"token_ids": [5, 12], "logprobs": {"token_logprobs": [-1, -1]}}]}, "outside the vocabulary"),
        ({"choices": [{"token_ids": [5, "6"], "logprobs": {"token_logprobs": [-1, -1]}}]}, "outside the vocabulary"),
        ({"choices": [{"token_ids": [5, 6, 7, 8], "logprobs": {"token_logprobs": [-1] * 4}}]}, "budget of 3"),
        ({"choices": [{"token_ids": [2, 6], "logprobs": {"token_logprobs": [-1, -1]}}]}, "stop token in the middle"),
        ({"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1]}}]}, "1 log-probs for 2 tokens"),
        ({"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1, float("nan")]}}]}, "not finite"),
        ({"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1, 0.5]}}]}, "not finite values <= 0"),
    ]
    for answer, match in garbage:
        with pytest.raises(BadAnswer, match=match):
            parse_completion(answer, max_new_tokens=3, vocab_size=10, stop_ids=[2])


# ------------------------------------------------------------------------------------------------
# the generator against a fake of vLLM's endpoints
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from rlx.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")


def build(urls, model, tok, tmp_path, quantize="none", **server):
    from rlx.fleet.backends import build_generator as build_engine

    settings = dict(urls=urls, work_dir=str(tmp_path / "work"), request_timeout_s=5, max_retries=2, retry_backoff_s=0.0,
                    invariance_probe_rows=0)  # the probe's extra request: tests/test_server_fleet.py
    settings.update(server)
    return build_engine(OmegaConf.merge(rollout_cfg(**settings), {"quantize": quantize}), model, tok, 0)


def test_generator_requests_rows_by_seed_and_spreads_prompts_over_servers(fakes, tiny, tmp_path):
    """Each row is one token-id request with its own seed; the G rows of a prompt go to one server; ids and
    log-probs come back as the server sent them, in row order."""
    model, tok = tiny
    a, b = fakes(), fakes()
    gen = build([a.url, b.url], model, tok, tmp_path)
    prompts = [[1, 40, 41], [1, 42], [1, 43, 44, 45]]
    seeds = [11, 12, 13, 14, 15, 16]
    out = gen.generate_ids(prompts, max_new_tokens=5, seeds=seeds, samples_per_prompt=2)
    assert out.ids == [[3 + s, 4 + s, 2] for s in seeds] and out.stopped == [True] * 6
    assert out.logprobs == [[-0.25] * 3] * 6
    sent = {fake.url: [body for path, body in fake.requests if path == "/v1/completions"] for fake in (a, b)}
    assert sorted((body["prompt"], body["seed"]) for body in sent[a.url] + sent[b.url]) == [
        ([1, 40, 41], 11), ([1, 40, 41], 12), ([1, 42], 13), ([1, 42], 14), ([1, 43, 44, 45], 15),
        ([1, 43, 44, 45], 16)]
    for prompt in prompts:  # a prompt's rows on one server (which one: by load, see test_fleet_*)
        assert sum(any(body["prompt"] == prompt for body in sent[url]) for url in sent) == 1
    body = (sent[b.url] or sent[a.url])[0]
    assert body["model"] == "fake-model" and body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["stop_token_ids"] == [2] and body["max_tokens"] == 5 and body["temperature"] == 1.0
    assert body["top_k"] == -1 and body["top_p"] == 1.0
    short = gen.generate_ids([[1, 40]], max_new_tokens=2, seeds=[11])  # the budget ran out: not stopped
    assert short.ids == [[14, 15]] and short.stopped == [False]
    greedy = gen.generate_ids([[1, 40]], max_new_tokens=4, seeds=[99], greedy=True)
    assert greedy.ids == [[7, 2]] and a.requests[-1][1]["seed"] is None and a.requests[-1][1]["temperature"] == 0
    gen.close()


def test_publish_writes_untied_weights_then_reloads_resets_and_stamps(fakes, tiny, tmp_path):
    """The tiny model ties its head to its embedding; the served checkpoint has both, equal, and says untied.
    A publish after an update writes the new weights, then on every server: reload from that folder, prefix
    cache reset, version stamp, checked at /weight_info; the step's metrics carry the timings and version."""
    from safetensors.torch import load_file

    model, tok = tiny
    a, b = fakes(), fakes()
    gen = build([a.url, b.url], model, tok, tmp_path)
    served = tmp_path / "work" / "model"
    config = json.loads((served / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and model.config.tie_word_embeddings
    weights = load_file(served / "model.safetensors")
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    assert set(weights) == {n for n, _ in model.named_parameters()} | {"lm_head.weight"}
    assert gen.version == 0 and a.version == b.version == "0"
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)  # an "update"
    try:
        a.requests.clear()
        gen.sync_weights(model, version=7)
        weights = load_file(served / "model.safetensors")
        assert torch.equal(weights["lm_head.weight"], model.model.embed_tokens.weight)  # the head follows the update
        assert a.paths() == ["/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/weight_info"]
        assert a.requests[0][1] == {"method": "reload_weights", "kwargs": {"weights_path": str(served)}}
        assert a.version == b.version == "7" and gen.version == 7
        metrics = gen.step_metrics()
        assert metrics["rollout/policy_version"] == 7 and metrics["rollout/server_retries"] == 0
        assert metrics["perf/weight_sync_s"] >= metrics["perf/weight_write_s"] > 0
        gen.sync_weights(model)  # no version given: the next one
        assert a.version == "8"
    finally:
        with torch.no_grad():
            model.model.embed_tokens.weight.sub_(1.0)
        gen.close()


def test_lora_policy_serves_its_base_and_pushes_the_adapter(fakes, tiny, tmp_path):
    import copy

    from safetensors.torch import load_file

    from rlx.models.lora import apply_lora

    model, tok = tiny
    policy = apply_lora(copy.deepcopy(model), rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)  # a trained adapter
    fake = fakes()
    gen = build([fake.url], policy, tok, tmp_path)
    base = load_file(tmp_path / "work" / "model" / "model.safetensors")
    q = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(base[q], model.get_parameter(q))  # the base, not the merged weights
    loads = [body for path, body in fake.requests if path == "/v1/load_lora_adapter"]
    assert loads == [{"lora_name": "rlx-policy", "lora_path": str(tmp_path / "work" / "adapters" / "v000000"),
                      "load_inplace": True}]
    assert (tmp_path / "work" / "adapters" / "v000000" / "adapter_config.json").is_file()
    for version in (1, 2, 3):
        gen.sync_weights(policy, version=version)
    assert sorted(p.name for p in (tmp_path / "work" / "adapters").iterdir()) == ["v000002", "v000003"]
    assert "/collective_rpc" not in fake.paths() and fake.version == "3"
    gen.generate_ids([[1, 40]], max_new_tokens=3, seeds=[1])
    assert fake.requests[-1][1]["model"] == "rlx-policy"  # requests name the adapter
    gen.close()
    merged = build([fake.url], policy, tok, tmp_path / "m", lora_push="merged")
    sent = load_file(tmp_path / "m" / "work" / "model" / "model.safetensors")
    assert not torch.allclose(sent[q], model.get_parameter(q))  # lora_push=merged: W + BA
    merged.close()


def test_int8_serves_and_publishes_the_int8_copy_through_the_worker_extension(fakes, tiny, tmp_path):
    """rollout.quantize=int8: the served checkpoint is compressed-tensors W8A8 (int8 projections + per-channel scales,
    the head float) and each publish writes the int8 copy of the new weights; before each reload the server's worker
    extension keeps the int8 kernels' scales (vllm-cpu's reload would free them). A server without the extension,
    or that serves no int8 layers, is refused at start with one line; other publishers are refused."""
    from safetensors.torch import load_file

    from rlx.engines.vllm_quant import INT8_WORKER, W8A8_CONFIG, Int8Worker, int8_channels
    from rlx.fleet.publishers import PUBLISHERS, Int8FilePublisher, quantized_publisher

    model, tok = tiny
    assert Int8FilePublisher.server_args == ("--worker-extension-cls", INT8_WORKER)
    module, _, name = INT8_WORKER.rpartition(".")
    assert getattr(importlib.import_module(module), name) is Int8Worker  # the name vLLM resolves in the server
    with pytest.raises(UserError, match="set rollout.server.publisher=file"):
        quantized_publisher(PUBLISHERS["lora"], "int8")
    for layers, match in ((None, "start it with --worker-extension-cls rlx.engines"), (0, "serves no int8 layers")):
        with pytest.raises(UserError, match=match):
            build([fakes(int8_layers=layers).url], model, tok, tmp_path / str(layers), quantize="int8")
    fake = fakes(int8_layers=4)
    gen = build([fake.url], model, tok, tmp_path, quantize="int8")
    served = tmp_path / "work" / "model"
    assert json.loads((served / "config.json").read_text())["quantization_config"] == W8A8_CONFIG
    q = "model.layers.0.mlp.down_proj.weight"
    weights = load_file(served / "model.safetensors")
    assert weights[q].dtype == torch.int8 and weights["lm_head.weight"].dtype == torch.float32
    assert torch.equal(weights[f"{q}_scale"], int8_channels(model.get_parameter(q))[1])
    saved = model.get_parameter(q).detach().clone()
    try:
        with torch.no_grad():
            model.get_parameter(q).mul_(3.0)  # an "update"
        fake.requests.clear()
        gen.sync_weights(model, version=1)
        assert [body["method"] for path, body in fake.requests if path == "/collective_rpc"] == [
            "rlx_keep_int8_scales", "reload_weights"]
        weights = load_file(served / "model.safetensors")
        assert torch.equal(weights[q], int8_channels(model.get_parameter(q))[0])
        assert torch.equal(weights[f"{q}_scale"], int8_channels(model.get_parameter(q))[1])
    finally:
        with torch.no_grad():
            model.get_parameter(q).copy_(saved)
        gen.close()


def test_transient_failures_are_retried_and_counted(fakes, tiny, tmp_path):
    model, tok = tiny
    fake = fakes(mode="fail_first", failures=2)
    gen = build([fake.url], model, tok, tmp_path)
    out = gen.generate_ids([[1, 40]], max_new_tokens=4, seeds=[5])
    assert out.ids == [[8, 9, 2]] and gen.step_metrics()["rollout/server_retries"] == 2
    gen.close()


@pytest.mark.parametrize("mode,match", [("garbage", r"token ids outside the vocabulary"),
                                        ("hang", r"timed out 2 times")])
def test_garbage_or_a_hang_ends_in_one_error_within_the_retry_budget(fakes, tiny, tmp_path, mode, match):
    """A server that answers nonsense, or does not answer within request_timeout_s, fails the request after
    1 + max_retries attempts: one RolloutServerError (resumable), in about attempts x timeout."""
    model, tok = tiny
    fake = fakes(mode=mode, hang_s=3.0)
    gen = build([fake.url], model, tok, tmp_path, request_timeout_s=0.5, max_retries=1)
    began = time.monotonic()
    with pytest.raises(RolloutServerError, match=match) as info:
        gen.generate_ids([[1, 40]], max_new_tokens=4, seeds=[5])
    assert time.monotonic() - began < 3.0 and info.value.resumable
    assert sum(p == "/v1/completions" for p in fake.paths()) == 2
    gen.close()


def test_stale_version_stamp_is_garbage(fakes, tiny, tmp_path):
    """A server whose /weight_info does not report the version just set fails the publish."""
    model, tok = tiny
    fake = fakes()
    gen = build([fake.url], model, tok, tmp_path, max_retries=0)
    original = fake.http.RequestHandlerClass.do_GET

    def stuck(handler):
        if handler.path == "/weight_info":
            return handler._send(200, {"weight_version": "0"})
        return original(handler)

    fake.http.RequestHandlerClass.do_GET = stuck
    with pytest.raises(RolloutServerError, match="not version 1"):
        gen.sync_weights(model, version=1)
    gen.close()


# ------------------------------------------------------------------------------------------------
# the child process and its guard (a fake server: an HTTP process with a grandchild, as vLLM has)
# ------------------------------------------------------------------------------------------------

FAKE_SERVER = textwrap.dedent("""
    import subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, mode = int(sys.argv[1]), sys.argv[2]
    print("fake server starting", flush=True)
    if mode == "die":
        print("RuntimeError: no memory for the KV cache", flush=True)
        sys.exit(3)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # an engine core
    print(f"grandchild {grandchild.pid}", flush=True)
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def fake_process(tmp_path, mode="serve", cleanup_dir=None):
    from rlx.fleet.process import free_port

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    port = free_port()
    return ServerProcess([sys.executable, str(script), str(port), mode], dict(os.environ), tmp_path / "server.log",
                         f"http://127.0.0.1:{port}", grace_s=2.0, cleanup_dir=cleanup_dir)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_gone(pgid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.1)
    return False


def test_child_stops_with_its_whole_group(tmp_path):
    """SIGTERM to the guard (what the kernel sends it when the trainer dies) ends the server and its grandchild
    on the guard's own; stop() (close, atexit) does it again from the trainer's side, idempotently."""
    for how in ("guard", "stop"):
        process = fake_process(tmp_path)
        try:
            assert process.start(timeout_s=30) > 0
            pgid = process.guard.pid
            assert group_alive(pgid) and process.exit_note() is None
            time.sleep(0.3)
            assert "grandchild" in (tmp_path / "server.log").read_text()
            if how == "guard":
                process.guard.send_signal(signal.SIGTERM)
                process.guard.wait(10)  # reaped here, as the trainer's exit would (a zombie still counts in the group)
            else:
                process.stop()
            assert wait_gone(pgid, 5.0), how
            assert (tmp_path / "server.log").is_file()  # no cleanup_dir given; the trainer is alive anyway
        finally:
            process.stop()
        process.stop()  # idempotent


def test_a_server_killed_while_running_is_noticed(tmp_path):
    """exit_note (what a failed request reports instead of retrying) tells how the server ended and quotes it."""
    process = fake_process(tmp_path)
    process.start(timeout_s=30)
    os.killpg(process.guard.pid, signal.SIGKILL)
    process.guard.wait(10)
    note = process.exit_note()
    assert note.startswith("the rollout server was killed (signal 9); its last log lines: fake server starting")
    assert "\n" not in note
    process.stop()


def test_a_server_dying_at_start_is_one_line_quoting_its_log(tmp_path):
    process = fake_process(tmp_path, mode="die")
    with pytest.raises(RolloutServerError,
                       match=r"exited with code 3 during start-up; its last log lines: "
                             r".*no memory for the KV cache") as info:
        process.start(timeout_s=30)
    assert "\n" not in str(info.value) and not info.value.resumable
    assert log_tail(tmp_path / "nothing.log") == "(no log)"
    (tmp_path / "access.log").write_text('ValueError: bad\n'
                                         'INFO:     127.0.0.1:4 - "POST /v1/completions HTTP/1.1" 200 OK\n\n')
    assert log_tail(tmp_path / "access.log") == "ValueError: bad"  # request lines say nothing about a failure


TRAINER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from test_server_unit import fake_process
    from pathlib import Path
    process = fake_process(Path({tmp!r}), cleanup_dir=Path({tmp!r}) / "served")
    process.start(timeout_s=30)
    print(process.guard.pid, flush=True)
    time.sleep(600)
""")


def test_no_orphan_after_the_trainer_is_killed_with_sigkill(tmp_path):
    """kill -9 of the process that started the server: no atexit, no handler runs; the guard's death signal
    (PR_SET_PDEATHSIG) takes the server and its grandchild down (without the guard the grandchild survives),
    and the guard removes the temporary folder it was given."""
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "model.safetensors").write_text("weights")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(tests=os.path.dirname(__file__), tmp=str(tmp_path)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pgid = int(trainer.stdout.readline())
        time.sleep(0.5)
        log = (tmp_path / "server.log").read_text()
        grandchild = int(log.split("grandchild ")[1].split()[0])
        assert group_alive(pgid) and os.getpgid(grandchild) == pgid
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        assert wait_gone(pgid), "the server's process group outlived the trainer"
        assert not (tmp_path / "served").exists()
    finally:
        trainer.kill()
        trainer.wait()
