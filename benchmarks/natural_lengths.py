"""Natural completion lengths of the real model, the input of benchmarks/async_sim.py's length tail.

    python benchmarks/natural_lengths.py        # ~10-20 min on one shared CPU thread (6 min for chain_sum at load 9)

SmolLM2-135M-Instruct (the packaged model rlx converts once into its cache), 64 prompts x 1 sample at temperature
0.7, up to 256 new tokens, batched (left padding), one CPU thread, on two prompt sets from reasoning-gym (generated
offline, seed 0): the default task (chain_sum, the bare question, as conf/tuning/smollm2-135m-instruct uses it)
and grade-school word problems (gsm_symbolic, asked to reason step by step), which is the kind of task whose
lengths make the long tail. Writes benchmarks/results/natural_lengths_smollm2_135m.json: every completion's length
in tokens (up to and including the end-of-turn token; 256 means it was cut at the budget).
"""

from __future__ import annotations

import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "natural_lengths_smollm2_135m.json"
MAX_NEW, TEMPERATURE, PROMPTS, SEED = 256, 0.7, 64, 0


def prompt_sets() -> dict[str, list[str]]:
    import reasoning_gym

    chain = reasoning_gym.create_dataset("chain_sum", size=PROMPTS, seed=SEED, min_terms=2, max_terms=2,
                                         min_digits=1, max_digits=1)
    words = reasoning_gym.create_dataset("gsm_symbolic", size=PROMPTS, seed=SEED)
    return {"gsm_symbolic": [row["question"] + "\nReason step by step, then state the final answer." for row in words],
            "chain_sum": [row["question"] for row in chain]}


def lengths(model, tokenizer, prompts: list[str]) -> list[int]:
    import torch

    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, do_sample=True, temperature=TEMPERATURE, top_p=1.0, top_k=0,
                             max_new_tokens=MAX_NEW, pad_token_id=tokenizer.pad_token_id)
    new = out[:, batch["input_ids"].shape[1]:]
    stops = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    result = []
    for row in new.tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        result.append(n)
    return result


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.models.loading import resolve_model_path

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    path = resolve_model_path("package:smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    record = {"model": "SmolLM2-135M-Instruct (package:smollm2-135m-instruct)", "prompts": PROMPTS, "samples": 1,
              "temperature": TEMPERATURE, "max_new_tokens": MAX_NEW, "seed": SEED, "threads": 1,
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": platform.machine(), "sets": {}}
    for name, prompts in prompt_sets().items():
        start = time.perf_counter()
        got = lengths(model, tokenizer, prompts)
        record["sets"][name] = {"lengths": got, "mean": sum(got) / len(got), "max": max(got),
                                "cut_at_budget": sum(n >= MAX_NEW for n in got), "seconds": time.perf_counter() - start}
        print(name, {k: v for k, v in record["sets"][name].items() if k != "lengths"}, flush=True)
        OUT.write_text(json.dumps(record, indent=1) + "\n")   # after each set: a long run keeps what it measured
    print("wrote", OUT)


if __name__ == "__main__":
    main()
