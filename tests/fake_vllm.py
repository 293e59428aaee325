"""A small fake of vLLM's OpenAI server as rlx uses it, for the fast suite: on a port the OS picks (or the one
given), in a thread of the test (`FakeVLLM(...)`) or as a process that stands in for `python -m
vllm.entrypoints.openai.api_server` (`python tests/fake_vllm.py --host H --port P ...`; the fake "python" that
rollout.server.python names in the fleet tests).

A completion is a function of the request's seed: [3 + seed % 40, 4 + seed % 40, stop] with log-probs -0.25
each (greedy: [7, stop]), so any server of a fleet draws the same tokens.
mode: ok | garbage (completions answer nonsense) | hang (completions never answer in time) | fail_first (the
first `failures` completion requests get HTTP 500) | variant (batch-variant kernels: a completion answered while
another is in flight draws its first token one higher). slow_s: each completion waits that long (load to route by).
versioned: the draw depends on the weight version the fake was stamped with (its seed moved by 7919 per version),
so a row drawn by a server of the wrong version differs. tail (> 0): a completion's length before the stop is
1 + (seed // 3) % tail tokens (a long tail of lengths for rounds); per_token_s: each token it answers adds that
long (decoding time). int8_layers: what rlx's int8 worker extension answers (rlx.engines.vllm_quant.Int8Worker;
None: the fake has no such extension, its /collective_rpc answers nothing).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion_ids(seed: int | None, tail: int = 0) -> list[int]:
    if seed is None:
        return [7]
    if tail:
        return [3 + (seed + k) % 40 for k in range(1 + (seed // 3) % tail)]
    return [3 + seed % 40, 4 + seed % 40]


class FakeVLLM:
    def __init__(self, mode="ok", failures=0, hang_s=5.0, slow_s=0.0, port=0, host="127.0.0.1", versioned=False,
                 tail=0, per_token_s=0.0, int8_layers=None):
        self.mode, self.failures, self.hang_s, self.slow_s = mode, failures, hang_s, slow_s
        self.int8_layers = int8_layers
        self.versioned, self.tail, self.per_token_s = versioned, tail, per_token_s
        self.requests, self.version, self.lock = [], None, threading.Lock()
        self.in_flight = self.most_in_flight = 0
        self.host, self.http = host, None
        self.start(port)

    def start(self, port=0):
        """Serve (again) on `port` (0: one the OS picks); a restarted fake has no weight version."""
        self.version = None
        self.http = _Server((self.host, port), _handler(self))
        self.port = self.http.server_address[1]
        self.url = f"http://{self.host}:{self.port}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def paths(self):
        return [p for p, _ in self.requests]

    def completions(self):
        return [body for path, body in self.requests if path == "/v1/completions"]

    def close(self):
        """Stop answering: the port refuses connections until start(port) again."""
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
            self.http = None


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the listen backlog (the standard library's 5 reset rlx's 32 concurrent requests;
    daemon_threads = True     # vLLM's server keeps 2048)


def _handler(fake: FakeVLLM):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, payload):
            raw = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            with fake.lock:
                fake.requests.append((self.path, None))
            if self.path == "/v1/models":
                self._send(200, {"data": [{"id": "fake-model"}]})
            elif self.path == "/weight_info":
                self._send(200, {"weight_version": fake.version})
            else:
                self._send(200, "")  # /health

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            with fake.lock:
                fake.requests.append((self.path, body))
                completions = sum(p == "/v1/completions" for p, _ in fake.requests)
            if self.path == "/v1/completions":
                return self._complete(body, completions)
            if self.path == "/update_weight_version":
                fake.version = body["new_version"]
                return self._send(200, {"success": True})
            if self.path == "/reset_prefix_cache":
                return self._send(200, {"success": True})
            if self.path == "/v1/load_lora_adapter":
                return self._send(200, "Success: LoRA adapter added")
            if body.get("method") == "rlx_keep_int8_scales" and fake.int8_layers is not None:
                return self._send(200, {"results": [{"int8_layers": fake.int8_layers}]})
            self._send(200, "")  # /collective_rpc

        def _complete(self, body, completions):
            with fake.lock:
                fake.in_flight += 1
                fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                crowded = fake.in_flight > 1
            try:
                time.sleep(fake.slow_s)
                crowded = crowded or fake.in_flight > 1
                code, payload = _answer(fake, body, completions, crowded)
            finally:
                with fake.lock:  # before the answer goes out: the client may send its next request at once
                    fake.in_flight -= 1
            return self._send(code, payload)

    return Handler


def _answer(fake: FakeVLLM, body: dict, completions: int, crowded: bool) -> tuple[int, object]:
    """(HTTP code, payload) of a completion request, as the fake's mode says."""
    if fake.mode == "hang":
        time.sleep(fake.hang_s)
    if fake.mode == "garbage":
        return 200, {"choices": [{"token_ids": [9999], "logprobs": {"token_logprobs": [-1.0]}}]}
    if fake.mode == "fail_first" and completions <= fake.failures:
        return 500, "engine hiccup"
    if body.get("prompt_logprobs") is not None:
        positions = [None] + [{str(t): {"logprob": -0.5}} for t in body["prompt"][1:]]
        return 200, {"choices": [{"prompt_logprobs": positions, "token_ids": [7]}]}
    seed = body["seed"]
    if fake.versioned and seed is not None:
        seed += 7919 * int(fake.version or 0)
    ids = completion_ids(seed, fake.tail)
    if fake.mode == "variant" and crowded:
        ids = [ids[0] + 1, *ids[1:]]
    ids = (ids + body["stop_token_ids"][:1])[: body["max_tokens"]]
    time.sleep(fake.per_token_s * len(ids))
    return 200, {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.25] * len(ids)}}]}


def main(argv: list[str]) -> None:
    """As a child server: `fake_vllm.py [-m MODULE] --host H --port P [other vLLM flags, ignored]`."""
    args = dict(zip(argv, argv[1:]))
    FakeVLLM(host=args.get("--host", "127.0.0.1"), port=int(args["--port"]), slow_s=0.0)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
