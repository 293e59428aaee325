"""rollout=server on the CPU: start-up time, generation speed and weight-publish time of a stock vLLM server.

    make test-vllm                                             # builds .venv-vllm once
    .venv-vllm/bin/python benchmarks/server_rollout.py         # tiny model, server pinned to core 1
    .venv-vllm/bin/python benchmarks/server_rollout.py --compiled  # without --enforce-eager (torch.compile)

The server is a child started as rlx starts it (rollout=server), pinned to one core with taskset (--core), this
process to another; it generates --prompts x --samples completions of exactly --tokens tokens (min_new_tokens), one
request per row with its own seed, as training does. Each round times one generation and one weight publish
(safetensors write + reload_weights + prefix-cache reset + version stamp). Writes
benchmarks/results/server_rollout_<shape>[_compiled][_shm].json with the load average (_shm: --work-dir given,
e.g. /dev/shm/rlx-server: the served checkpoint in memory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import torch
from omegaconf import OmegaConf

from benchmarks.common import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["tiny", "0.5b"], default="tiny")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core", type=int, default=1, help="the server's core (taskset); this process takes another")
    parser.add_argument("--compiled", action="store_true", help="let vLLM compile (no --enforce-eager)")
    parser.add_argument("--work-dir", default=None, help="rollout.server.work_dir (the served checkpoint's folder)")
    args = parser.parse_args()

    from rlx.config.paths import CONF_DIR
    from rlx.engines.sampling import sample_seed
    from rlx.engines.vllm import build_engine
    from rlx.models.loading import load_causal_lm, load_tokenizer

    pin = ["taskset", "-c", str(args.core)] if shutil.which("taskset") else []
    if pin:
        os.sched_setaffinity(0, {c for c in os.sched_getaffinity(0) if c != args.core} or {0})
    torch.set_num_threads(1)
    if args.shape == "tiny":
        model, tok = load_causal_lm("builtin:tiny"), load_tokenizer("builtin:tiny")
    else:
        from benchmarks.vllm_cpu import half_billion_shape

        path = str(half_billion_shape())
        model, tok = load_causal_lm(path), load_tokenizer(path)
    hf = OmegaConf.load(CONF_DIR / "rollout" / "hf.yaml")
    server = {k: v for k, v in OmegaConf.load(CONF_DIR / "rollout" / "server.yaml").items() if k != "defaults"}
    cfg = OmegaConf.merge(hf, server, {"dtype": "float32", "kv_cache_gib": 0.5, "enforce_eager": not args.compiled,
                                       "max_model_len": None,
                                       "server": {"launch_prefix": pin, "work_dir": args.work_dir}})
    began = time.perf_counter()
    generator = build_engine(cfg, model, tok, 0)
    start_s = time.perf_counter() - began
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a} + 3"}], tokenize=False,
                                     add_generation_prompt=True) for a in range(args.prompts)]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    rows = args.prompts * args.samples
    generate_s, publish_s, write_s, load_s = [], [], [], []
    try:
        for round_ in range(args.rounds):
            seeds = [sample_seed(0, round_ + 1, i) for i in range(rows)]
            t = time.perf_counter()
            out = generator.generate_ids(prompts, max_new_tokens=args.tokens, min_new_tokens=args.tokens, seeds=seeds,
                                         samples_per_prompt=args.samples)
            generate_s.append(time.perf_counter() - t)
            assert sum(len(r) for r in out.ids) == rows * args.tokens
            t = time.perf_counter()
            generator.publish(model, round_ + 1)
            publish_s.append(time.perf_counter() - t)
            timings = generator.step_metrics()
            write_s.append(timings["perf/weight_write_s"])
            load_s.append(timings["perf/weight_load_s"])
    finally:
        generator.close()
    tokens = rows * args.tokens
    result = {
        "shape": args.shape, "prompts": args.prompts, "samples": args.samples, "tokens": args.tokens,
        "rounds": args.rounds, "enforce_eager": not args.compiled, "server_core": args.core if pin else None,
        "startup_s": start_s, "load_average": list(os.getloadavg()),
        "generate": {"min_s": min(generate_s), "median_s": statistics.median(generate_s),
                     "tokens_per_s_best": tokens / min(generate_s),
                     "tokens_per_s_median": tokens / statistics.median(generate_s)},
        "publish": {"min_s": min(publish_s), "median_s": statistics.median(publish_s),
                    "write_median_s": statistics.median(write_s), "reload_median_s": statistics.median(load_s),
                    "work_dir": args.work_dir or "temporary (under /tmp)"},
    }
    print(json.dumps(result, indent=2))
    name = f"server_rollout_{args.shape}{'_compiled' if args.compiled else ''}{'_shm' if args.work_dir else ''}.json"
    (ROOT / "benchmarks" / "results" / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
