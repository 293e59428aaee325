"""Is the vLLM server batch-invariant here? The same seeded rows drawn one request at a time and all at once.

    .venv-vllm/bin/python benchmarks/batch_invariance.py [--rows 32] [--new-tokens 48] [--model builtin:tiny]

A row's tokens can depend on which other rows the server batches with it when its kernels are batch-variant
(a matmul split or reduction order chosen by batch size): that is what makes a server rollout, synchronous or
streaming, irreproducible even with rlx's per-row seeds. This draws `rows` seeded samples twice through a child
`vllm serve` (float32, eager): once with one request in flight at a time, once with every request in flight,
and compares token ids and log-probs bit for bit. On a GPU, compare with VLLM_BATCH_INVARIANT=1 in the
environment. Writes benchmarks/results/batch_invariance_<device>.json."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlx.config.paths import CONF_DIR

RESULTS = Path(__file__).resolve().parent / "results"


def rollout_cfg(**overrides):
    cfg = OmegaConf.load(CONF_DIR / "rollout" / "hf.yaml")
    for name in ("vllm", "server"):
        cfg = OmegaConf.merge(cfg, {k: v for k, v in OmegaConf.load(CONF_DIR / "rollout" / f"{name}.yaml").items()
                                    if k != "defaults"})
    return OmegaConf.merge(cfg, overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--model", default="builtin:tiny")
    args = parser.parse_args()

    from rlx.engines.sampling import sample_seed
    from rlx.fleet.backends import build_generator
    from rlx.models.loading import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(args.model), load_tokenizer(args.model)
    pin = ["taskset", "-c", "1"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    server = build_generator(rollout_cfg(backend="server", dtype="float32", kv_cache_gib=0.25, enforce_eager=True,
                                         max_model_len=256, server={"launch_prefix": pin}), model, tok, 0)
    try:
        server.publish(model, 0)
        texts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a} + {a % 7} + 3"}], tokenize=False,
                                         add_generation_prompt=True) for a in range(args.rows)]
        prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        seeds = [sample_seed(0, 1, i) for i in range(args.rows)]
        began = time.perf_counter()
        alone = [server.generate_ids([p], max_new_tokens=args.new_tokens, seeds=[s]) for p, s in zip(prompts, seeds)]
        alone_s = time.perf_counter() - began
        began = time.perf_counter()
        together = server.generate_ids(prompts, max_new_tokens=args.new_tokens, seeds=seeds)
        together_s = time.perf_counter() - began
    finally:
        server.close()
    ids_equal = sum(a.ids[0] == b for a, b in zip(alone, together.ids))
    first_diff = [next((t for t, (x, y) in enumerate(zip(a.ids[0], b)) if x != y), None)
                  for a, b in zip(alone, together.ids)]
    gaps = [float((torch.tensor(a.logprobs[0][:n]) - torch.tensor(b[:n])).abs().max())
            for a, b in zip(alone, together.logprobs) for n in [min(len(a.logprobs[0]), len(b))] if n]
    bitwise = sum(a.logprobs[0] == b for a, b in zip(alone, together.logprobs))
    result = {"device": platform.processor() or platform.machine(), "model": args.model, "rows": args.rows,
              "new_tokens": args.new_tokens, "rows_with_equal_tokens": ids_equal,
              "rows_with_bitwise_equal_logprobs": bitwise, "max_logprob_gap": max(gaps) if gaps else 0.0,
              "first_divergent_token": [d for d in first_diff if d is not None],
              "batch_invariant": ids_equal == args.rows and bitwise == args.rows,
              "alone_s": round(alone_s, 2), "together_s": round(together_s, 2),
              "env": {k: os.environ[k] for k in ("VLLM_BATCH_INVARIANT",) if k in os.environ}}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"batch_invariance_{device}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
