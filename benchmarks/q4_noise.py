"""An ESTIMATE of how much the Q4_1 weights of the packaged SmolLM2-135M-Instruct move its benchmark scores.

    python benchmarks/q4_noise.py --limit 200 --draws 2       # ~10 min on one core

rlx's packaged model is the Q4_1 GGUF dequantized to fp32; the published lm-eval figures are on the unquantized
weights, which are not available offline. Proxy: add to every 2-D weight matrix noise of the size Q4_1 rounding
leaves (per block of 32 weights along a row, Q4_1 stores 16 levels between the block's min and max, step
d = (max - min) / 15; rounding error ~ U(-d/2, d/2)), i.e. a second quantization's worth of error, and re-score with
rlx's choice_loglikelihoods. The change in accuracy is an estimate of the size of the gap Q4_1 itself could explain,
not a measurement of it (the real error is the rounding of the unquantized weights, correlated with them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

TASKS = ("arc_easy:rc_0shot", "arc_challenge:rc_0shot", "hellaswag:rc_0shot", "piqa:rc_0shot")


def q4_1_noise_(weight: torch.Tensor, generator: torch.Generator, block: int = 32) -> None:
    """In place: w += U(-d/2, d/2) per block of `block` weights along the last dim, d = (max - min) / 15."""
    rows, cols = weight.shape
    usable = cols - cols % block
    blocks = weight[:, :usable].reshape(rows, usable // block, block)  # (R, NB, 32)
    step = (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / 15  # (R, NB, 1)
    noise = (torch.rand(blocks.shape, generator=generator) - 0.5) * step
    weight[:, :usable] += noise.reshape(rows, usable)


def score(model, tokenizer, questions) -> dict:
    from rlx.evaluation.loglikelihood import choice_loglikelihoods, choice_scores

    sums = choice_loglikelihoods(model, tokenizer, questions)
    scores = [choice_scores(s, q.continuations, q.gold) for s, q in zip(sums, questions)]
    return {k: sum(s[k] for s in scores) / len(scores) for k in ("acc", "acc_norm")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "q4_noise.json"))
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.evaluation.olmes import choice_questions
    from rlx.models.loading import resolve_model_path

    torch.set_num_threads(1)
    path = resolve_model_path("package:smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    questions = {t: choice_questions(*t.split(":"))[:args.limit] for t in TASKS}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    clean = {k: v.clone() for k, v in model.state_dict().items()}
    result = {"questions_per_task": args.limit, "tasks": {t: {"packaged": score(model, tokenizer, q)}
                                                         for t, q in questions.items()}}
    for draw in range(args.draws):
        generator = torch.Generator().manual_seed(draw)
        model.load_state_dict(clean)
        with torch.no_grad():
            for weight in model.parameters():
                if weight.dim() == 2:  # every matrix (the tied embedding too); norms stay
                    q4_1_noise_(weight.data, generator)
        for task, qs in questions.items():
            result["tasks"][task][f"noise_draw_{draw}"] = score(model, tokenizer, qs)
        print(json.dumps(result), flush=True)
    for entry in result["tasks"].values():
        draws = [v for k, v in entry.items() if k.startswith("noise_draw")]
        entry["mean_change_points"] = {m: 100 * (sum(d[m] for d in draws) / len(draws) - entry["packaged"][m])
                                       for m in ("acc", "acc_norm")}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
