"""Training forward + backward over a natural-length batch: padded, skipping the padding columns a micro-batch
shares (rlx.models.forward.trim_padding), and packed without padding (pack=True, packed_forward), alternating.

    python benchmarks/trim_padding.py [--model builtin:tiny|PATH] [--rows 64] [--micro 16] [--threads 2]

The batch mimics a GRPO step: prompts of 10-60 tokens (left-padded to the longest), completions of
4-256 tokens (geometric-ish: most short, a few long; right-padded to the longest), micro-batches of
`--micro` consecutive rows.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rlx.models.forward import completion_logprobs  # noqa: E402
from rlx.models.loading import load_causal_lm  # noqa: E402


def natural_batch(rows: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    prompts = [rng.randint(10, 60) for _ in range(rows)]
    completions = [min(256, 4 + int(rng.expovariate(1 / 40))) for _ in range(rows)]
    P, C = max(prompts), max(completions)
    p_ids = torch.zeros(rows, P, dtype=torch.long)
    p_mask = torch.zeros(rows, P, dtype=torch.long)
    c_ids = torch.zeros(rows, C, dtype=torch.long)
    c_mask = torch.zeros(rows, C, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        p_ids[i, P - p:] = torch.randint(3, vocab, (p,))
        p_mask[i, P - p:] = 1
        c_ids[i, :c] = torch.randint(3, vocab, (c,))
        c_mask[i, :c] = 1
    return (p_ids, p_mask, c_ids, c_mask), sum(completions), rows * C


def one_pass(model, batch, micro: int, trim: bool, pack: bool = False) -> float:
    start = time.perf_counter()
    for lo in range(0, batch[0].shape[0], micro):
        part = [t[lo : lo + micro] for t in batch]
        logp, _ = completion_logprobs(model, *part, trim=trim, pack=pack)
        (logp * part[3]).sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_causal_lm(args.model, "float32")
    model.train()
    batch, real, padded = natural_batch(args.rows, model.config.vocab_size)
    variants = {"padded": (False, False), "trimmed": (True, False), "packed": (True, True)}
    times = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (trim, pack) in variants.items():  # alternating
            model.zero_grad(set_to_none=True)
            times[name].append(one_pass(model, batch, args.micro, trim, pack))
    off, on, packed = (min(times[name]) for name in variants)
    print(f"model {args.model}, {args.rows} rows in micro-batches of {args.micro}, {args.threads} threads; completion "
          f"tokens {real} real of {padded} padded; load {os.getloadavg()[0]:.2f}")
    print(f"forward+backward, best of {args.repeats}: padded {off:.3f} s, trimmed {on:.3f} s ({off / on:.2f}x), "
          f"packed {packed:.3f} s ({off / packed:.2f}x)")


if __name__ == "__main__":
    main()
