"""How many forward FLOPs rlx's log-likelihood scorer and lm-evaluation-harness spend on the questions of a
benchmarks/lmeval_parity.py report, and the GFLOP/s each reached: what speed-up the work itself allows.

    python benchmarks/lmeval_flops.py                    # reads benchmarks/results/lmeval_parity.json, prints a table

FLOPs from token counts on SmolLM2-135M-Instruct (attention left out): 2 x 106.2M per token through the 30 blocks and
2 x 576 x 49152 per row of the output head. rlx feeds each question's trie once (less a prefix every question shares,
`shared_prefix`) and runs the head at scored positions only; lm-eval feeds every (context, continuation) pair but the
continuation's last token, one forward for the one-token continuations of one context (its logits cache), and runs the
head at every position. flop_ratio = lm-eval's / rlx's: the speed-up at equal GFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = 2 * 106.2e6  # FLOPs per token through the 30 blocks (2 x their multiply-adds)
HEAD = 2 * 576 * 49152  # FLOPs per output-head row


def task_flops(tokenizer, questions) -> dict:
    """rlx's and lm-eval's forward FLOPs on `questions` (module docstring)."""
    from rlx.evaluation.loglikelihood import _trees, shared_prefix, split_pair

    trees = _trees(tokenizer, questions)
    prefix = shared_prefix(trees)
    rlx_tokens = sum(len(tree.tokens) for tree in trees) - prefix * (len(trees) - 1)
    targets = sum(len(tree.targets) for tree in trees)
    lmeval_tokens = 0
    for question in questions:
        fed = {tuple(c + x[:-1]) for c, x in (split_pair(tokenizer, c, x)
                                              for c, x in zip(question.contexts, question.continuations))}
        lmeval_tokens += sum(len(sequence) for sequence in fed)
    return {"shared_prefix": prefix, "rlx_tokens": rlx_tokens, "lmeval_tokens": lmeval_tokens,
            "rlx_flops": rlx_tokens * BODY + targets * HEAD, "lmeval_flops": lmeval_tokens * (BODY + HEAD)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", default=str(ROOT / "benchmarks" / "results" / "lmeval_parity.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from lmeval_parity import _questions, default_model
    from transformers import AutoTokenizer

    report = json.loads(Path(args.report).read_text())
    tokenizer = AutoTokenizer.from_pretrained(report.get("model") or default_model())
    print(f"{'task':26s} {'prefix':>6s} {'rlx tok':>8s} {'lm-eval tok':>11s} {'flop ratio':>10s} "
          f"{'rlx GFLOP/s':>11s} {'lm-eval GFLOP/s':>15s} {'speed-up':>8s}")
    for task, entry in report["tasks"].items():
        name, variant = task.split(":")
        n = entry["questions"]
        f = task_flops(tokenizer, _questions(name, variant)[:n])
        cpu = {side: n / entry["questions_per_cpu_s"][side] for side in ("rlx", "lm_eval")}
        print(f"{task:26s} {f['shared_prefix']:6d} {f['rlx_tokens']:8d} {f['lmeval_tokens']:11d} "
              f"{f['lmeval_flops'] / f['rlx_flops']:10.2f} {f['rlx_flops'] / cpu['rlx'] / 1e9:11.1f} "
              f"{f['lmeval_flops'] / cpu['lm_eval'] / 1e9:15.1f} {entry['speedup_cpu']:8.2f}")


if __name__ == "__main__":
    main()
