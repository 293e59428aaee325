"""Processes of tests/test_publisher.py.

  receive HOST PORT RANK WORLD OUT [--die-after N | --hang-after N] [--timeout S]
      a weight receiver (rlx.fleet.weight_stream.serve_model) holding `make_model(seed=99)` (other weights
      than the trainer's); after each version it writes OUT/v{version}.pt (its parameters, bit for bit).
      --die-after N: exit (code 17) after applying N tensors, mid-publish; --hang-after N: sleep instead.
  fsdp OUT
      one of 2 trainer ranks (torch.distributed.run, gloo): make_model(seed=0) sharded with FSDP2 (fully_shard),
      published through GlooPublisher (rank 0 starts the receiver); version 1 = the initial weights, version 2
      after every rank scaled its local shards by (rank + 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch


def make_model(seed: int) -> torch.nn.Module:
    """Tensors of several sizes and dtypes: the embedding (40 KiB, the largest) down to a 1-element bias, and
    a bfloat16 block."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(160, 64), torch.nn.Linear(64, 48), torch.nn.LayerNorm(48),
                                torch.nn.Linear(48, 1), torch.nn.Linear(1, 30).to(torch.bfloat16))
    return model


def receive(host: str, port: int, rank: int, world: int, out: Path, die_after: int | None, hang_after: int | None,
            timeout_s: float) -> None:
    from rlx.fleet.weight_stream import WeightReceiver

    torch.set_num_threads(1)
    model = make_model(seed=99)
    params = dict(model.named_parameters())
    applied = [0]

    @torch.no_grad()
    def apply(name, tensor):
        if die_after is not None and applied[0] == die_after:
            os._exit(17)
        if hang_after is not None and applied[0] == hang_after:
            time.sleep(600)
        params[name].copy_(tensor)
        applied[0] += 1

    def saved(version):
        torch.save({n: p.detach().clone() for n, p in params.items()}, out / f"v{version}.pt")

    WeightReceiver(host, port, rank, world, timeout_s=timeout_s).serve(apply, lambda n: params[n], saved)


def fsdp(out: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from rlx.fleet.publishers import GlooPublisher

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = make_model(seed=0)
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    assert all(type(p).__name__ == "DTensor" for p in model.parameters())

    def launch(address, world):
        command = [sys.executable, __file__, "receive", address[0], str(address[1]), "1", str(world), str(out)]
        scrubbed = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        subprocess.Popen(command, env={k: v for k, v in os.environ.items() if k not in scrubbed})

    publisher = GlooPublisher(receivers=1, bucket_bytes=3000, timeout_s=60, launch=launch)
    publisher.start(model)
    publisher.publish(model, 1)
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().mul_(rank + 2)
    publisher.publish(model, 2)
    publisher.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "receive":
        args = sys.argv[2:]
        flag = lambda name: int(args[args.index(name) + 1]) if name in args else None  # noqa: E731
        receive(args[0], int(args[1]), int(args[2]), int(args[3]), Path(args[4]), flag("--die-after"),
                flag("--hang-after"), float(flag("--timeout") or 60))
    else:
        fsdp(Path(sys.argv[2]))
