"""A weight publisher of your own, in one file: the file publisher, writing bfloat16.

    rlx train rollout=server plugins=[examples.bf16_publisher] rollout.server.publisher=bf16_file

A server that serves in bfloat16 (vLLM's `dtype: auto` on a bf16 checkpoint, most GPU deployments) casts whatever
it loads to bfloat16, so a float32 file is twice the bytes to write and read for nothing it keeps. This publisher
writes the served weights in bfloat16 and is otherwise the `file` publisher: the atomic rename, the version kept
for rollout.server.overlap_steps, reload_weights on every live server, catch-up of a returning one. Keep `file`
when the servers serve float32 (the CPU): they would then sample from rounded weights.
"""

from __future__ import annotations

import torch

import rlx
from rlx.fleet.publishers import FilePublisher


@rlx.register("weight_publisher", "bf16_file")
class BF16FilePublisher(FilePublisher):
    def weights(self, model) -> dict[str, torch.Tensor]:
        served = super().weights(model)
        return {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in served.items()}
