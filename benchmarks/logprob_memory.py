"""Peak memory of the log-prob computation: chunked (rlx) vs naive full logits, forward + backward.

    python benchmarks/logprob_memory.py              # 151k-vocabulary model, 8 sequences x 256 completion tokens

Each variant runs in its own child process; the figure is the child's peak RSS minus its RSS just
before the forward (model, optimizer-free), i.e. what the log-prob forward and backward add.
The naive variant is `model(...).logits` followed by log-softmax and gather (models/forward.py with
chunked=False); 8 sequences keep its (N, T, V) logits small enough for a shared machine: the
GRPO batch of 64 x 256 would need ~10 GB of float32 logits alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import large_vocab_model, load_summary, run_child, table  # noqa: E402


def worker(variant: str, rows: int, length: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from rlx.models.forward import completion_logprobs
    from rlx.models.loading import load_causal_lm

    model = load_causal_lm(str(large_vocab_model()))
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, vocab, (rows, 24), generator=g)  # (N, P)
    completion_ids = torch.randint(3, vocab, (rows, length), generator=g)  # (N, C)
    ones = torch.ones_like
    args = (prompt_ids, ones(prompt_ids), completion_ids, ones(completion_ids))
    completion_logprobs(model, *[a[:1, :4] for a in args], chunked=variant == "chunked")[0].sum().backward()  # warm-up
    model.zero_grad(set_to_none=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    logp, _ = completion_logprobs(model, *args, with_entropy=True, chunked=variant == "chunked")
    logp.sum().backward()
    return {"seconds": time.perf_counter() - start, "rss_before": before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--worker", choices=["chunked", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.rows, args.length)), flush=True)
        return
    large_vocab_model()
    results = {}
    for variant in ("naive", "chunked"):
        out, peak = run_child([__file__, "--worker", variant, "--rows", str(args.rows), "--length", str(args.length)],
                              1800)
        results[variant] = (peak - out["rss_before"], peak, out["seconds"])
        print(f"{variant}: +{results[variant][0]:.0f} MiB over the loaded model (peak RSS {peak:.0f} MiB), "
              f"{out['seconds']:.1f} s ({load_summary()})", flush=True)
    rows = [[v, f"{r[0]:.0f}", f"{r[1]:.0f}", f"{r[2]:.1f}"] for v, r in results.items()]
    print()
    print(f"log-probs + entropy, forward + backward, {args.rows} x (24 + {args.length}) tokens, vocabulary 151,936; "
          f"chunked / naive added memory = {results['chunked'][0] / results['naive'][0]:.2f}")
    print(table(rows, ["variant", "added MiB", "peak RSS MiB", "seconds"]))


if __name__ == "__main__":
    main()
