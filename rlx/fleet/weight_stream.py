"""The NCCL weight-push lifecycle, run on the CPU over gloo: a trainer and its weight receivers in one process group.

The lifecycle is the one vLLM's NCCL weight-transfer engine and the peers (verl, prime-rl, SkyRL) follow; here
every step runs over torch.distributed's gloo backend so that it is tested on a machine without a GPU:

  join     the trainer opens a TCP store on 127.0.0.1 at a port the OS picks (`WeightSender.address`), each
           receiver joins it with its rank (1..R); a gloo process group of the R+1 processes, made directly
           (ProcessGroupGloo), so a trainer that already holds torch.distributed's default group (DDP, FSDP)
           keeps it untouched
  announce per publish, a header [PUBLISH, version, manifest length] and the manifest (JSON: the version, the
           bucket size, every tensor's name, dtype and shape, in the order they are streamed)
  stream   the tensors' bytes, concatenated in manifest order, broadcast in buckets of exactly `bucket_bytes`
           (the last one shorter); a tensor larger than a bucket spans several, so neither side ever holds more
           than one bucket plus the tensor being assembled
  apply    the receiver rebuilds each tensor from its bytes as soon as its last byte arrived and hands it to
           `apply(name, tensor)` (e.g. a copy into the model it holds)
  ack      the receiver runs its own step for the version (`on_version`), then every process contributes [version,
           digest] to an all-gather; the digest is a blake2b of the bytes of
           every tensor in manifest order (the trainer's of what it sent, a receiver's of what it holds after
           applying, read back through `read`), so equal digests mean bit-identical weights. A receiver that
           acknowledges another version or another digest is an error
  close    a header [CLOSE, 0, 0]; the receivers return

Failures are one line (RolloutServerError), never a hang: the group has a timeout (`timeout_s`) on every
collective, and a receiver that dies mid-publish breaks gloo's connection, which the trainer sees at once.

Under FSDP2 (`full_parameters`) every trainer rank gathers each parameter (DTensor.full_tensor, a collective of
the trainer's own group) in the same order while the stream is built, one parameter at a time; rank 0 alone
sends. Tested on 2 gloo trainer processes (tests/test_publisher.py).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator

import torch

from rlx.errors import RolloutServerError

PUBLISH, CLOSE = 1, 0
DEFAULT_BUCKET_BYTES = 64 * 2**20


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor (a view when it is contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def manifest_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, str, list[int]]]:
    """[(name, dtype name, shape)] read from the tensors' metadata only (a DTensor's shape is the full one)."""
    return [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in named]


def _nbytes(entry) -> int:
    _, dtype, shape = entry
    count = 1
    for n in shape:
        count *= int(n)
    return count * torch.empty((), dtype=getattr(torch, dtype)).element_size()


def _digest_int(hasher) -> int:
    return int.from_bytes(hasher.digest()[:8], "little", signed=True)


def full_parameters(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full CPU tensor) of every parameter, lazily. An FSDP2 shard (DTensor) is gathered with
    full_tensor(), a collective every rank of the trainer's group must call in the same order."""
    for name, param in model.named_parameters():
        tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
        yield name, tensor.detach().to("cpu")


def _group(host: str, port: int, rank: int, world_size: int, timeout_s: float, store=None,
           join_timeout_s: float | None = None):
    """(store, gloo group) with timeout_s on every collective. The join is bounded by join_timeout_s: each
    receiver announces itself in the store, and the trainer waits for all of them there before the group's own
    rendezvous (which would otherwise give a receiver still importing torch only timeout_s)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    joining = datetime.timedelta(seconds=join_timeout_s or timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world_size, False, timeout=joining)
    if rank == 0:
        store.wait([f"rlx/joined/{r}" for r in range(1, world_size)], joining)
    else:
        store.set(f"rlx/joined/{rank}", "1")
    return store, dist.ProcessGroupGloo(store, rank, world_size, timeout)


def _broadcast(group, tensor: torch.Tensor, root: int = 0) -> None:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = root
    group.broadcast([tensor], options).wait()


def _all_gather(group, tensor: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    out = [torch.empty_like(tensor) for _ in range(world_size)]
    group.allgather([out], [tensor]).wait()
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


class WeightSender:
    """The trainer's end (rank 0). `address` = (host, port) for the receivers; `join()` waits for all of them."""

    def __init__(self, receivers: int, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = 120.0,
                 join_timeout_s: float | None = None, host: str = "127.0.0.1"):
        """timeout_s bounds every collective of a publish; join_timeout_s (default timeout_s) the wait for the
        receivers to join (a receiver that imports torch first may need tens of seconds on a busy machine)."""
        import torch.distributed as dist

        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.world_size, self.bucket_bytes, self.timeout_s = receivers + 1, int(bucket_bytes), float(timeout_s)
        self.join_timeout_s = float(join_timeout_s or timeout_s)
        self.store = dist.TCPStore(host, 0, self.world_size, True,
                                   timeout=datetime.timedelta(seconds=self.join_timeout_s),
                                   wait_for_workers=False)  # port 0: the OS picks a free one
        self.address = (host, int(self.store.port))
        self.group = None
        self.stage = "joining"

    def join(self) -> None:
        """Form the process group with every receiver (blocks until they joined or timeout_s passed)."""
        try:
            _, self.group = _group(*self.address, 0, self.world_size, self.timeout_s, store=self.store,
                                   join_timeout_s=self.join_timeout_s)
        except Exception as exc:  # noqa: BLE001 - DistStoreError / DistNetworkError / RuntimeError from c10d
            raise RolloutServerError(f"the weight receivers did not join {self.address[0]}:{self.address[1]} within "
                                     f"{self.join_timeout_s:g} s: {_first_line(exc)}") from None

    def send(self, version: int, named: Iterable[tuple[str, torch.Tensor]],
             manifest: list[tuple[str, str, list[int]]]) -> dict[str, float]:
        """Announce `manifest` as `version`, stream the tensors `named` yields (in manifest order, matching it),
        collect the acknowledgements. Returns timings; RolloutServerError (one line) on any failure."""
        began = time.perf_counter()
        self.stage = "announcing"
        try:
            self._announce(PUBLISH, version, manifest)
            digest = self._stream(named, manifest)
            streamed = time.perf_counter()
            self.stage = "waiting for the acknowledgements"
            acks = _all_gather(self.group, torch.tensor([version, digest], dtype=torch.int64), self.world_size)
        except RolloutServerError:
            raise
        except Exception as exc:  # noqa: BLE001 - gloo raises RuntimeError (peer gone) or a timeout error
            raise RolloutServerError(f"publishing weight version {version} over gloo failed while {self.stage}: "
                                     f"{_first_line(exc)}") from None
        for rank, ack in enumerate(acks[1:], start=1):
            got_version, got_digest = int(ack[0]), int(ack[1])
            if got_version != version or got_digest != digest:
                raise RolloutServerError(f"weight receiver {rank} acknowledged version {got_version} with digest "
                                         f"{got_digest:#x}, not version {version} with {digest:#x} (weights differ)")
        done = time.perf_counter()
        return {"perf/weight_write_s": streamed - began, "perf/weight_load_s": done - streamed}

    def close(self) -> None:
        """Tell the receivers to return (best effort: a receiver already gone is not an error here)."""
        if self.group is not None:
            try:
                self._announce(CLOSE, 0, [])
            except Exception:  # noqa: BLE001
                pass
        self.group = None

    def _announce(self, kind: int, version: int, manifest) -> None:
        body = json.dumps({"version": version, "bucket_bytes": self.bucket_bytes, "entries": manifest}).encode()
        _broadcast(self.group, torch.tensor([kind, version, len(body)], dtype=torch.int64))
        if kind == PUBLISH:
            _broadcast(self.group, torch.frombuffer(bytearray(body), dtype=torch.uint8))

    def _stream(self, named, manifest) -> int:
        bucket = torch.empty(self.bucket_bytes, dtype=torch.uint8)
        hasher, fill, sent = hashlib.blake2b(), 0, 0
        count = 0
        for (name, tensor), entry in zip(named, manifest, strict=True):
            count += 1
            self.stage = f"streaming bucket {sent + 1} ({name})"
            if (name != entry[0] or str(tensor.dtype).removeprefix("torch.") != entry[1]
                or list(tensor.shape) != entry[2]):
                raise RolloutServerError(f"tensor {name} {tuple(tensor.shape)} {tensor.dtype} does not match the "
                                         f"announced manifest entry {entry}")
            data = _as_bytes(tensor)
            hasher.update(memoryview(data.numpy()))  # no copy
            offset = 0
            while offset < data.numel():
                take = min(data.numel() - offset, self.bucket_bytes - fill)
                bucket[fill:fill + take].copy_(data[offset:offset + take])
                fill, offset = fill + take, offset + take
                if fill == self.bucket_bytes:
                    _broadcast(self.group, bucket)
                    fill, sent = 0, sent + 1
        if fill:
            _broadcast(self.group, bucket[:fill])
        return _digest_int(hasher)


class WeightReceiver:
    """A receiver's end (rank >= 1): `serve(apply, read)` handles publishes until the trainer closes."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, *, timeout_s: float = 120.0,
                 join_timeout_s: float | None = None):
        self.rank, self.world_size = rank, world_size
        self.store, self.group = _group(host, port, rank, world_size, timeout_s, join_timeout_s=join_timeout_s)
        self.version: int | None = None

    def serve(self, apply: Callable[[str, torch.Tensor], None], read: Callable[[str], torch.Tensor],
              on_version: Callable[[int], None] = lambda version: None) -> None:
        """Until CLOSE: receive a publish, apply(name, tensor) each tensor, on_version(version) (the receiver's
        own step once a version is in place, e.g. dropping cached keys), then acknowledge with the digest of
        read(name) (what the receiver holds): the trainer's publish returns after all of it."""
        while self.receive_one(apply, read, on_version):
            pass

    def receive_one(self, apply, read, on_version=lambda version: None) -> bool:
        header = torch.empty(3, dtype=torch.int64)
        _broadcast(self.group, header)
        kind, version, length = (int(v) for v in header)
        if kind == CLOSE:
            return False
        body = torch.empty(length, dtype=torch.uint8)
        _broadcast(self.group, body)
        manifest = json.loads(bytes(body.numpy()))
        bucket_bytes, entries = int(manifest["bucket_bytes"]), manifest["entries"]
        total = sum(_nbytes(e) for e in entries)
        bucket = torch.empty(bucket_bytes, dtype=torch.uint8)
        index, assembled, target = 0, 0, None  # the entry being assembled and how many of its bytes arrived
        for start in range(0, total, bucket_bytes):
            size = min(bucket_bytes, total - start)
            _broadcast(self.group, bucket[:size])
            used = 0
            while used < size:
                if target is None:
                    target, assembled = torch.empty(_nbytes(entries[index]), dtype=torch.uint8), 0
                take = min(size - used, target.numel() - assembled)
                target[assembled:assembled + take].copy_(bucket[used:used + take])
                used, assembled = used + take, assembled + take
                if assembled == target.numel():
                    index, target = self._finish(entries, index, target, apply), None
        while index < len(entries):  # empty tensors carry no bytes
            index = self._finish(entries, index, torch.empty(0, dtype=torch.uint8), apply)
        on_version(version)
        hasher = hashlib.blake2b()
        for name, _, _ in entries:
            hasher.update(memoryview(_as_bytes(read(name)).numpy()))
        _all_gather(self.group, torch.tensor([version, _digest_int(hasher)], dtype=torch.int64), self.world_size)
        self.version = version
        return True

    @staticmethod
    def _finish(entries, index: int, raw: torch.Tensor, apply) -> int:
        name, dtype, shape = entries[index]
        apply(name, raw.view(getattr(torch, dtype)).reshape(shape))
        return index + 1


def serve_model(model, host: str, port: int, rank: int, world_size: int, *, timeout_s: float = 120.0,
                on_version: Callable[[int], None] = lambda version: None) -> WeightReceiver:
    """A receiver holding `model`: each tensor is copied into the parameter of the same name."""
    params = dict(model.named_parameters())

    @torch.no_grad()
    def apply(name: str, tensor: torch.Tensor) -> None:
        params[name].copy_(tensor)

    receiver = WeightReceiver(host, port, rank, world_size, timeout_s=timeout_s)
    receiver.serve(apply, lambda name: params[name], on_version)
    return receiver
