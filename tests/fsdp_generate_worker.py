"""Worker of tests/test_fsdp.py::test_fsdp2_shards_and_generates_in_lockstep (started by torch.distributed.run).

Two CPU ranks (gloo) put the built-in tiny model through rlx's FSDP2 setup (Accelerate's plugin forced onto
the CPU by rlx.runtime.parallel.use_fsdp_on_cpu, then `prepare`), and the KL reference through place_reference.
Every parameter of both must be a DTensor whose local piece is this rank's half (dim 0 split over 2 ranks).
Each rank then generates greedily for its own prompt, picked so that the two completions have different
lengths: the rank that stops first must keep taking part in the all-gathers, and the tokens must equal the
unsharded model's. The reference's log-probs of those tokens must equal the unsharded model's too.
"""

import sys

import torch
from accelerate import Accelerator
from omegaconf import OmegaConf

from rlx.engines.hf import generate
from rlx.models.loading import load_causal_lm, load_tokenizer
from rlx.models.lora import place_reference, reference_model
from rlx.runtime.parallel import fsdp_plugin, is_sharded, use_fsdp_on_cpu

FSDP = OmegaConf.load(__file__.replace("tests/fsdp_generate_worker.py", "conf/hardware/fsdp.yaml")).fsdp


def assert_half_shards(model, rank: int, what: str) -> None:
    for name, param in model.named_parameters():
        assert type(param).__name__ == "DTensor", f"{what} {name} is a {type(param).__name__}, not a DTensor shard"
        full, local = param.shape, param.to_local().shape
        expected = (full[0] + 1) // 2 if rank == 0 else full[0] // 2  # torch.chunk's split of dim 0 over 2 ranks
        assert local[0] == expected and tuple(local[1:]) == tuple(full[1:]), (what, name, full, local)


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    use_fsdp_on_cpu(accelerator, fsdp_plugin(FSDP))
    rank = accelerator.process_index
    tokenizer = load_tokenizer("builtin:tiny")
    model = load_causal_lm("builtin:tiny").eval()
    prompts = [f"{a} + {b} =" for a, b in ((3, 4), (57, 68), (9, 1), (120, 345), (2, 2), (999, 1))]
    kwargs = dict(samples_per_prompt=1, max_new_tokens=24, greedy=True)
    full = [generate(model, tokenizer, [p], **kwargs) for p in prompts]  # (1, C) each, on the unsharded model
    lengths = [int(r.lengths[0]) for r in full]
    second = next((i for i, n in enumerate(lengths) if n != lengths[0]), None)
    if second is None:
        print(f"all completions have {lengths[0]} tokens; the check needs two lengths", file=sys.stderr)
        raise SystemExit(3)
    mine = (0, second)[rank]
    reference = reference_model(model)
    with torch.no_grad():
        ids = torch.cat([full[mine].prompt_ids, full[mine].completion_ids], dim=1)
        unsharded_logits = model(input_ids=ids).logits
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sharded, optimizer = accelerator.prepare(model, optimizer)
    reference = place_reference(reference, accelerator)
    assert is_sharded(sharded) and is_sharded(reference)
    assert_half_shards(sharded, rank, "policy")
    assert_half_shards(reference, rank, "reference")
    out = generate(accelerator.unwrap_model(sharded), tokenizer, [prompts[mine]], **kwargs)
    assert torch.equal(out.completion_ids, full[mine].completion_ids), (out.texts, full[mine].texts)
    with torch.no_grad():
        gap = (reference(input_ids=ids).logits - unsharded_logits).abs().max().item()
    assert gap < 1e-5, f"sharded reference logits differ by {gap:.2e}"
    accelerator.wait_for_everyone()
    print(f"rank {rank}: {int(out.lengths[0])} tokens (other rank {lengths[(0, second)[1 - rank]]}), "
          f"reference gap {gap:.1e} ok")


if __name__ == "__main__":
    main()
