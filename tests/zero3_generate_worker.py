"""Worker of tests/test_sharded.py::test_generation_on_zero3_keeps_ranks_in_lockstep (started by torch.distributed.run).

Each of 2 ranks holds half of every parameter (DeepSpeed ZeRO-3, gloo) and generates greedily for its own
prompt; the prompts are picked so that the ranks' completions have different lengths, so a rank that
stopped decoding early would leave the other waiting in a parameter gather. Every rank's tokens must
equal those of the unsharded model.
"""

import sys

import deepspeed
import torch

from rlx.engines.hf import generate
from rlx.models.loading import load_causal_lm, load_tokenizer
from rlx.runtime.parallel import is_sharded


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer("builtin:tiny")
    model = load_causal_lm("builtin:tiny").eval()
    prompts = [f"{a} + {b} =" for a, b in ((3, 4), (57, 68), (9, 1), (120, 345), (2, 2), (999, 1))]
    kwargs = dict(samples_per_prompt=1, max_new_tokens=24, greedy=True)
    full = [generate(model, tokenizer, [p], **kwargs) for p in prompts]  # (1, C) each, on the unsharded model
    lengths = [int(r.lengths[0]) for r in full]
    first = 0
    second = next((i for i, n in enumerate(lengths) if n != lengths[first]), None)
    if second is None:
        print(f"all completions have {lengths[0]} tokens; the check needs two lengths", file=sys.stderr)
        raise SystemExit(3)
    mine = (first, second)[rank]
    engine, *_ = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})
    sharded = engine.module
    assert is_sharded(sharded)
    out = generate(sharded, tokenizer, [prompts[mine]], **kwargs)
    torch.distributed.barrier()
    assert torch.equal(out.completion_ids, full[mine].completion_ids), (out.texts, full[mine].texts)
    print(f"rank {rank}: {int(out.lengths[0])} tokens (other rank {lengths[(first, second)[1 - rank]]}) ok")


if __name__ == "__main__":
    main()
