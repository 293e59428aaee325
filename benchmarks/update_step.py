"""One GRPO update at a real shape, split into its parts, beside its FLOP floor.

    python benchmarks/update_step.py [--shape qwen2.5-0.5b | --model SPEC] [--groups 2] [--samples 4]
                                     [--max-tokens 256] [--threads 2] [--repeats 2] [--rounds 1]
                                     [--modes padded,packed,lengths] [--overhead 256] [--out FILE]

The batch is a natural-length GRPO step: `--groups` prompts of 30-60 tokens, `--samples` completions each of
geometric length (mean 64 tokens, at most `--max-tokens`; seeded), the shape of
`benchmarks/grpo_vs_trl.py --settings "0.5b 2x4 natural<=256"`. Every mode runs in its own process, alternating,
so each reports its own peak RSS. Modes: `padded` (the rows in one micro-batch, micro_batch_split=rows), `packed`
(packed_forward=true), `lengths` (micro-batches of rows grouped by length, micro_batch_split=lengths, the default).
Per mode, the best of `--repeats` times of:
  forward        completion log-probs without gradients (what an old or reference log-prob pass costs)
  update         forward + backward of the token-mean policy loss (rlx.models.forward.completion_logprobs)
  head           the chunked output head alone, forward + backward over the real completion tokens
  optimizer      one fused AdamW step over all parameters (rlx.runtime.optim.build_optimizer)
The floor is 6 x parameters x tokens the update must run (each prompt once, every real completion token) at the
fp32 matmul rate measured in the same process; the optimizer's is reading and writing its 4 tensors a parameter.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import load_summary, machine_summary  # noqa: E402
from rlx.algorithms.logprobs import chunked_linear_logprobs  # noqa: E402
from rlx.loops.micro_batches import length_split, parameter_count, pass_overhead  # noqa: E402
from rlx.models.forward import LOGIT_CHUNK_ELEMENTS, LogprobSettings, completion_logprobs  # noqa: E402
from rlx.models.shapes import build_shaped_model  # noqa: E402
from rlx.runtime.optim import build_optimizer  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache"
MODES = {"padded": LogprobSettings(), "packed": LogprobSettings(pack=True), "lengths": LogprobSettings()}


def natural_batch(groups: int, samples: int, max_tokens: int, vocab: int, seed: int = 0):
    """(prompt ids, prompt mask, completion ids, completion mask): G samples of a prompt adjacent, prompts
    left-padded, completions right-padded; lengths seeded."""
    rng = random.Random(seed)
    prompts = [rng.randint(30, 60) for _ in range(groups)]
    lengths = [min(max_tokens, 1 + int(rng.expovariate(1 / 64))) for _ in range(groups * samples)]
    P, C, rows = max(prompts), max(lengths), groups * samples
    p_ids, p_mask = torch.zeros(rows, P, dtype=torch.long), torch.zeros(rows, P, dtype=torch.long)
    c_ids, c_mask = torch.zeros(rows, C, dtype=torch.long), torch.zeros(rows, C, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    for g, p in enumerate(prompts):
        prompt = torch.randint(3, vocab, (p,), generator=gen)
        for s in range(samples):
            row = g * samples + s
            p_ids[row, P - p:], p_mask[row, P - p:] = prompt, 1
            c_ids[row, : lengths[row]] = torch.randint(3, vocab, (lengths[row],), generator=gen)
            c_mask[row, : lengths[row]] = 1
    return (p_ids, p_mask, c_ids, c_mask), sum(prompts), sum(lengths)


def positions(part) -> int:
    """Token positions a padded forward of this micro-batch computes: rows x (longest prompt + longest completion)."""
    return int(part[0].shape[0] * (part[1].sum(1).max() + part[3].sum(1).max()))


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_gflops() -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    seconds = best_of(lambda: a @ b, 5)
    return 2 * 2048**3 / seconds / 1e9


def child(args) -> dict:
    """Time one mode's parts in this process; returns the figures."""
    from rlx.models.loading import load_causal_lm

    torch.set_num_threads(args.threads)
    model = load_causal_lm(args.model or str(CACHE / f"{args.shape}-all"))
    model.config.use_cache = False
    batch, prompt_tokens, completion_tokens = natural_batch(args.groups, args.samples, args.max_tokens,
                                                            model.config.vocab_size)
    settings = MODES[args.mode]
    rows = list(range(batch[0].shape[0]))
    micro = ([rows] if args.mode != "lengths" else  # lengths: rlx's micro_batch_split=lengths
             length_split(batch[1].sum(1).tolist(), batch[3].sum(1).tolist(), len(rows),
                          pass_overhead(parameter_count(model)) if args.overhead is None else args.overhead))
    parts = [[t[torch.tensor(run)] for t in batch] for run in micro]
    tokens = batch[3].sum()

    def forward():
        with torch.no_grad():
            for part in parts:
                completion_logprobs(model, *part, settings=settings)

    def update():
        for part in parts:  # the token-mean loss of the whole batch, accumulated over micro-batches
            logp, _ = completion_logprobs(model, *part, settings=settings)
            (-(logp * part[3]).sum() / tokens).backward()

    head = model.get_output_embeddings()
    hidden = torch.randn(completion_tokens, head.weight.shape[1], requires_grad=True)
    targets = batch[2][batch[3].bool()]

    def head_pass():
        logp, _ = chunked_linear_logprobs(hidden, head.weight, targets, bias=head.bias,
                                          chunk_tokens=max(1, LOGIT_CHUNK_ELEMENTS // head.weight.shape[0]))
        logp.sum().backward()

    optimizer, _ = build_optimizer(model, 10, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                   schedule="constant", warmup_steps=0)
    update()  # gradients exist and the optimizer's state is made before timing
    optimizer.step()
    params = sum(p.numel() for p in model.parameters())
    figures = {"forward_s": best_of(forward, args.repeats), "update_s": best_of(update, args.repeats),
               "head_s": best_of(head_pass, args.repeats), "optimizer_s": best_of(optimizer.step, args.repeats)}
    gflops = matmul_gflops()
    figures.update(params=params, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   padded_tokens=sum(positions(p) for p in parts), micro_batches=len(parts), matmul_gflops=gflops,
                   floor_s=6 * params * (prompt_tokens + completion_tokens) / (gflops * 1e9),
                   peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--model", default=None, help="an rlx model spec instead of the shape (builtin:tiny, "
                        "package:smollm2-135m-instruct, a folder)")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="padded,packed,lengths")
    parser.add_argument("--overhead", type=int, default=None, help="lengths: micro_batch_overhead (default: "
                        "rlx's, from the parameter count)")
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # set in the child processes
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(child(args)))
        return
    folder = CACHE / f"{args.shape}-all"
    if args.model is None and not (folder / "config.json").exists():
        build_shaped_model(args.shape, folder)
    results: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for mode in args.modes.split(","):
            command = [sys.executable, __file__, "--mode", mode] + [
                f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                if k in ("shape", "model", "groups", "samples", "max_tokens", "threads", "repeats", "overhead")
                and v is not None]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results.setdefault(mode, []).append(json.loads(out.strip().splitlines()[-1]))
    for mode, runs in results.items():
        best = {k: min(r[k] for r in runs) for k in runs[0]}
        print(f"{args.model or args.shape} {args.groups}x{args.samples} natural<={args.max_tokens} {mode}: "
              f"update {best['update_s']:.2f} s (floor {best['floor_s']:.2f} s, "
              f"{best['update_s'] / best['floor_s']:.2f}x)"
              f"  forward {best['forward_s']:.2f} s  head {best['head_s']:.2f} s  optimizer {best['optimizer_s']:.2f} s"
              f"  peak RSS {best['peak_rss_gb']:.2f} GB  tokens {best['prompt_tokens']}+{best['completion_tokens']}"
              f" (padded {best['padded_tokens']} in {best['micro_batches']})  {best['matmul_gflops']:.0f} GFLOP/s")
    if args.out:
        provenance = {"date": time.strftime("%Y-%m-%d"), "machine": machine_summary(), "load": load_summary(),
                      "command": "python benchmarks/update_step.py " + " ".join(sys.argv[1:])}
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, **provenance}, indent=1) + "\n")


if __name__ == "__main__":
    main()
