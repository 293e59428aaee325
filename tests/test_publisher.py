"""Weight publishers (rlx/fleet/publishers.py) and the gloo twin of the NCCL push (rlx/fleet/weight_stream.py).

The gloo tests run a real receiver process (tests/publisher_worker.py) that joins the trainer's process group on
127.0.0.1 at a port the OS picked, applies every version into a model it holds (other weights to begin with) and
writes what it holds after each version; the test compares that with the trainer's weights bit for bit. The
nccl and ipc publishers need CUDA and vLLM: only their refusal is tested here.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlx.errors import RolloutServerError, UserError
from rlx.fleet.process import check_publisher
from rlx.fleet.publishers import PUBLISHERS, publisher_name
from rlx.fleet.weight_stream import WeightSender, full_parameters, manifest_of

sys.path.insert(0, str(Path(__file__).parent))
from publisher_worker import make_model  # noqa: E402

WORKER = str(Path(__file__).parent / "publisher_worker.py")


def test_registry_names_and_the_auto_choice_keep_lora_push():
    own = [name for name in PUBLISHERS if PUBLISHERS[name].__module__.startswith("rlx.")]  # a plugin may add more
    assert own == ["file", "lora", "gloo", "nccl", "ipc"]
    assert publisher_name("auto", "adapter", peft=True) == "lora"
    assert publisher_name("auto", "merged", peft=True) == "file"  # the old lora_push=merged
    assert publisher_name("auto", "adapter", peft=False) == "file"
    assert publisher_name("file", "adapter", peft=True) == "file"
    with pytest.raises(UserError, match="publisher=lora pushes a LoRA adapter"):
        publisher_name("lora", "adapter", peft=False)
    assert PUBLISHERS["lora"].adapter and not PUBLISHERS["file"].adapter
    assert PUBLISHERS["nccl"].server_args == ("--weight-transfer-config", '{"backend": "nccl"}')
    assert PUBLISHERS["ipc"].server_env == {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def test_cuda_publishers_refuse_without_cuda_or_vllm_and_gloo_refuses_a_server():
    from rlx.cli.training import check_run
    from rlx.config.overrides import check_overrides

    for name in ("nccl", "ipc"):
        with pytest.raises(UserError, match=f"publisher={name} uses vLLM's CUDA weight-transfer engine, and torch "
                                            "sees no CUDA device"):
            check_publisher(name, has_cuda=False)
        with pytest.raises(UserError, match="whose Python has no vLLM"):
            check_publisher(name, has_cuda=True, has_vllm=False)
        check_publisher(name, has_cuda=True, has_vllm=True)
    with pytest.raises(UserError, match="publisher=gloo is the CPU twin"):
        check_publisher("gloo")
    check_publisher("file"), check_publisher("auto"), check_publisher("lora")
    urls = "rollout.server.urls=[http://127.0.0.1:9]"
    if not torch.cuda.is_available():  # through the config rules (exit 2), before any model is loaded
        with pytest.raises(UserError, match="publisher=nccl"):
            check_run(check_overrides(["rollout=server", urls, "rollout.server.publisher=nccl"]))
    with pytest.raises(UserError, match="unknown rollout.server.publisher 'shm'"):
        check_run(check_overrides(["rollout=server", urls, "rollout.server.publisher=shm"]))


def start_receiver(sender: WeightSender, out: Path, *extra: str) -> subprocess.Popen:
    host, port = sender.address
    return subprocess.Popen([sys.executable, WORKER, "receive", host, str(port), "1", "2", str(out), *extra])


def publish(sender: WeightSender, model, version: int) -> dict:
    return sender.send(version, full_parameters(model), manifest_of(model.named_parameters()))


def held(out: Path, version: int) -> dict:
    return torch.load(out / f"v{version}.pt")


def assert_bit_identical(model, weights: dict) -> None:
    assert list(weights) == [name for name, _ in model.named_parameters()]
    for name, param in model.named_parameters():
        assert weights[name].dtype == param.dtype and torch.equal(weights[name].view(torch.uint8),
                                                                 param.detach().view(torch.uint8)), name


def test_gloo_push_two_versions_bit_identical_across_bucket_sizes(tmp_path):
    """~20 s. Version 1 in 1000-byte buckets (the 40 KiB embedding spans 41 of them, the small tensors share
    one), version 2 after a change in one bucket larger than the whole model, version 3 in buckets of the
    embedding's exact size: every time the receiver holds the trainer's weights bit for bit."""
    model = make_model(seed=0)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    assert largest == 160 * 64 * 4
    sender = WeightSender(1, bucket_bytes=1000, timeout_s=30, join_timeout_s=120)
    receiver = start_receiver(sender, tmp_path)
    try:
        sender.join()
        assert not torch.equal(make_model(seed=99)[0].weight, model[0].weight)  # the receiver starts elsewhere
        timings = publish(sender, model, 1)
        assert set(timings) == {"perf/weight_write_s", "perf/weight_load_s"}
        assert_bit_identical(model, held(tmp_path, 1))
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param.float()).to(param.dtype))
        sender.bucket_bytes = 10 * 2**20
        publish(sender, model, 2)
        assert_bit_identical(model, held(tmp_path, 2))
        with torch.no_grad():
            model[0].weight.mul_(-1)
        sender.bucket_bytes = largest
        publish(sender, model, 3)
        assert_bit_identical(model, held(tmp_path, 3))
    finally:
        sender.close()
    assert receiver.wait(timeout=60) == 0  # the close header ends the receiver


@pytest.mark.parametrize("fault", ["--die-after", "--hang-after"])
def test_a_receiver_that_dies_or_hangs_mid_publish_is_one_line(tmp_path, fault):
    """~15 s each. The receiver exits (or stops reading) after 2 of the 9 tensors of version 1: the publish
    ends in one RolloutServerError line naming the version (dead: at once; hung: after timeout_s), no hang."""
    model = make_model(seed=0)
    sender = WeightSender(1, bucket_bytes=1000, timeout_s=4, join_timeout_s=120)
    receiver = start_receiver(sender, tmp_path, fault, "2", "--timeout", "4")
    try:
        sender.join()
        began = time.monotonic()
        with pytest.raises(RolloutServerError) as caught:
            publish(sender, model, 1)
        took = time.monotonic() - began
    finally:
        receiver.kill()
        receiver.wait()
        sender.close()
    message = str(caught.value)
    assert "\n" not in message and message.startswith("publishing weight version 1 over gloo failed while "), message
    assert took < 30, took
    if fault == "--die-after":
        assert receiver.returncode == 17


def test_the_manifest_must_match_what_is_streamed():
    """A tensor that is not the announced one is refused before its bytes are sent (no receiver needed: the
    check runs before the first broadcast of that tensor)."""
    model = make_model(seed=0)
    manifest = manifest_of(model.named_parameters())
    manifest[0] = (manifest[0][0], "float16", manifest[0][2])
    sender = WeightSender(0, bucket_bytes=1 << 20, timeout_s=10)  # a group of the trainer alone
    sender.join()
    with pytest.raises(RolloutServerError, match=r"does not match the announced manifest entry \('0.weight', "
                                                  r"'float16'"):
        sender.send(1, full_parameters(model), manifest)
    sender.close()


def test_fsdp2_shards_are_gathered_and_published(tmp_path):
    """~40 s on 2 cores: 2 FSDP2 trainer ranks (gloo) publish through GlooPublisher; every rank gathers each
    parameter, rank 0 streams it (3000-byte buckets). The receiver holds the unsharded initial weights
    (version 1), then the weights after rank r scaled its dim-0 half by r + 2 (version 2)."""
    import socket

    with socket.socket() as sock:  # the trainers' rendezvous port: one the OS picks (torchrun hangs on port 0)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", str(port), WORKER, "fsdp", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    full = make_model(seed=0)
    assert_bit_identical(full, held(tmp_path, 1))
    with torch.no_grad():
        for param in full.parameters():
            first = (param.shape[0] + 1) // 2  # torch.chunk's split of dim 0 over 2 ranks
            param[:first].mul_(2)
            param[first:].mul_(3)
    assert_bit_identical(full, held(tmp_path, 2))


class FakeWeightServer:
    """vLLM's dev-mode weight-transfer routes, recorded: /get_world_size answers `world_size`."""

    def __init__(self, world_size: int = 2):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, payload):
                raw = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                fake.requests.append((self.path, None))
                self._send({"world_size": world_size} if self.path == "/get_world_size" else {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                fake.requests.append((self.path, body))
                self._send({"message": "ok"})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def fake_vllm_engines(monkeypatch):
    """vLLM's weight-transfer engine classes replaced by recorders (no vLLM, no CUDA here): what the trainer's
    side of the nccl and ipc publishers hands them."""
    import types

    calls = []

    class NCCL:
        @staticmethod
        def trainer_init(info):
            calls.append(("trainer_init", info))
            return "group"

        @staticmethod
        def trainer_send_weights(iterator, args):
            calls.append(("send", [(n, t.clone()) for n, t in iterator], args))

    class IPC:
        @staticmethod
        def trainer_send_weights(iterator, args):
            calls.append(("ipc", [(n, t.clone()) for n, t in iterator], args))

    for name, attrs in {"vllm": {}, "vllm.distributed": {}, "vllm.distributed.weight_transfer": {},
                        "vllm.distributed.weight_transfer.nccl_engine": {"NCCLWeightTransferEngine": NCCL},
                        "vllm.distributed.weight_transfer.ipc_engine": {"IPCWeightTransferEngine": IPC}}.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    return calls


def test_nccl_and_ipc_publishers_follow_vllms_weight_transfer_routes(fake_vllm_engines, tmp_path):
    """The HTTP side of the CUDA publishers against recorded routes (the engines are fakes, tensors stay on the
    CPU): nccl joins one group of 1 + the servers' world sizes with each server's rank offset, then per version
    pauses, announces the served names/dtypes/shapes with the packed bucket size, sends, resumes; ipc has one
    init and hands the served tensors to the IPC engine between pause and resume. What runs on a GPU is untested."""
    from omegaconf import OmegaConf

    from rlx.fleet.client import RequestPolicy, ServerClient
    from rlx.fleet.publishers import served_state_dict
    from rlx.models.loading import load_causal_lm

    model = load_causal_lm("builtin:tiny")
    servers = [FakeWeightServer(world_size=2), FakeWeightServer(world_size=1)]
    settings = OmegaConf.create({"bucket_mib": 1, "request_timeout_s": 10, "publish_host": None})
    client = ServerClient([s.url for s in servers], RequestPolicy(timeout_s=10, retries=0, backoff_s=0, concurrency=4))
    try:
        nccl = PUBLISHERS["nccl"](client, tmp_path, settings)
        nccl.device = "cpu"
        nccl.start(model)
        init = fake_vllm_engines[0]
        assert init[0] == "trainer_init" and init[1]["world_size"] == 4 and init[1]["master_address"] == "127.0.0.1"
        joins = [[b for p, b in s.requests if p == "/init_weight_transfer_engine"][0]["init_info"] for s in servers]
        assert ([j["rank_offset"] for j in joins] == [1, 3]
                and {j["master_port"] for j in joins} == {init[1]["master_port"]})
        timings = nccl.publish(model, 1)
        assert set(timings) == {"perf/weight_write_s", "perf/weight_load_s"}
        served = served_state_dict(model)
        _, sent, args = fake_vllm_engines[1]
        assert [n for n, _ in sent] == list(served) and all(torch.equal(t, served[n]) for n, t in sent)
        assert args == {"group": "group", "packed": True, "packed_buffer_size_bytes": 2**20}
        for server in servers:
            paths = [p for p, _ in server.requests]
            assert paths[-3:] == ["/pause?mode=wait", "/update_weights", "/resume"], paths
            info = server.requests[-2][1]["update_info"]
            assert info["names"] == list(served) and info["packed"] and info["packed_buffer_size_bytes"] == 2**20
            assert info["shapes"][0] == list(served[info["names"][0]].shape) and info["dtype_names"][0] == "float32"
        nccl.close()

        one = ServerClient([servers[0].url], RequestPolicy(timeout_s=10, retries=0, backoff_s=0, concurrency=4))
        ipc = PUBLISHERS["ipc"](one, tmp_path, settings)
        ipc.device = "cpu"
        ipc.start(model)
        ipc.publish(model, 2)
        kind, sent, args = fake_vllm_engines[-1]
        assert kind == "ipc" and args == {"mode": "http", "url": servers[0].url} and len(sent) == len(served)
        assert [p for p, _ in servers[0].requests][-3:] == ["/init_weight_transfer_engine", "/pause?mode=wait",
                                                            "/resume"]
        one.close()
        with pytest.raises(UserError, match="publisher=ipc shares GPU memory with one server"):
            PUBLISHERS["ipc"](client, tmp_path, settings).start(model)
    finally:
        client.close()
        for server in servers:
            server.close()
