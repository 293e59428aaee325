"""LoRA against the full fine-tune in rlx: how much of the step LoRA saves, beside what it can save.

    python benchmarks/lora_vs_full.py --settings "smollm2 4x8 natural<=64" --rounds 2 --threads 2

The same rlx worker as benchmarks/grpo_vs_trl.py (its real CLI in a child process, the same model files, prompts,
group size, natural completion lengths and one optimizer step per batch), run alternately with and without
`model.lora.enabled=true` (rank 16, alpha 32, every linear layer). Per run: the median step, generation, update
(one forward and backward of every sequence, with scoring) and optimizer time over the timed steps, tokens/s and
the peak resident memory.

What LoRA can save (the bound printed beside the measurement): generation is the same model in both (the adapters
add 2 r (d_in + d_out) FLOPs per token and layer, a few percent); the update's forward (2N FLOPs per token) and the
backward's input gradients (2N) stay, and only the frozen weights' gradients (2N) go, so the update can shrink to
2/3 at most, without activation checkpointing; the optimizer's step over the frozen weights goes entirely. The
bound: generation_full + 2/3 (update_full) + 0 x optimizer_full.

That bound counts matmuls only. What the model's own code allows is measured beside it (`framework_ratio`, also
alone with --framework-only): transformers' forward and backward of the same model on the setting's token counts,
without rlx, plain and with the same adapters: attention, norms, activations and the adapters' own matmuls do not
shrink with LoRA, so this ratio sits above 2/3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import CACHE, load_summary, machine_summary, median, run_child, table, write_prompts  # noqa: E402
from benchmarks.grpo_vs_trl import LORA, RESULTS, SETTINGS, matmul_gflops, model_dir  # noqa: E402

UPDATE_KEPT = 2 / 3  # forward 2N + input gradients 2N of the full update's 6N FLOPs per token


def lora_bound(full: dict) -> float:
    """The quickest step LoRA allows, from the full fine-tune's medians: generation unchanged, the update at 2/3
    (no weight gradients of the frozen layers), no optimizer step over them."""
    return full["generation_s"] + UPDATE_KEPT * full["update_s"]


def training_model(model_path, threads: int, rows: int, prompt_tokens: int, completion_tokens: int, lora: bool,
                   seed: int = 0):
    """The model at `model_path` in float32 and train mode (with LoRA adapters, rank and alpha as the rlx runs, every
    linear layer, when `lora`) and `rows` random sequences of prompt_tokens + completion_tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlx.models.lora import apply_lora

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    if lora:
        model = apply_lora(model, LORA["r"], LORA["alpha"], 0.0, "all-linear")
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (rows, prompt_tokens + completion_tokens),
                        generator=torch.Generator().manual_seed(seed))
    return model, ids


def completion_loss(model, ids, completion_tokens: int):
    """Minus the mean log-probability of the last completion_tokens of each row, the output head on those only
    (as rlx's update)."""
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=completion_tokens + 1).logits[:, :-1]
    return -logits.log_softmax(-1).gather(-1, ids[:, -completion_tokens:].unsqueeze(-1)).mean()


def framework_ratio(model_path, threads: int, rows: int, prompt_tokens: int, completion_tokens: int,
                    repeats: int = 2, seed: int = 0) -> dict:
    """transformers' own forward + backward (`completion_loss`) of the model at `model_path`, timed plain and then
    with LoRA adapters on the same tokens: the quickest of `repeats` after a warm-up. Returns full_s, lora_s and
    their ratio."""
    def timed(lora: bool) -> float:
        model, ids = training_model(model_path, threads, rows, prompt_tokens, completion_tokens, lora, seed)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            completion_loss(model, ids, completion_tokens).backward()
            model.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
        return min(times[1:])

    full, lora = timed(False), timed(True)
    return {"full_s": full, "lora_s": lora, "ratio": lora / full, "rows": rows, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, "threads": threads}


def summarise(runs: list[dict]) -> dict:
    """Medians over runs of each run's medians; update = step - generation - optimizer."""
    def phase(key):
        return median([median(run[key]) for run in runs])

    step, generation, optimizer = phase("step_times"), phase("generation_times"), phase("optimizer_times")
    return {"step_s": step, "generation_s": generation, "optimizer_s": optimizer,
            "update_s": step - generation - optimizer,
            "tokens_per_s": median([median(run["tokens"]) / median(run["step_times"]) for run in runs]),
            "peak_mib": median([run["peak_mib"] for run in runs])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="smollm2 4x8 natural<=64", help="a setting of benchmarks/grpo_vs_trl.py")
    parser.add_argument("--rounds", type=int, default=2, help="alternating full / LoRA runs")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--framework-only", action="store_true",
                        help="only transformers' own forward + backward, plain and with LoRA (framework_ratio), "
                             "added to the setting's results file")
    parser.add_argument("--prompt-tokens", type=int, default=48, help="framework_ratio: prompt length")
    parser.add_argument("--completion-tokens", type=int, default=56, help="framework_ratio: completion length "
                                                                          "(the setting's natural mean)")
    args = parser.parse_args()
    setting = args.settings
    kind, prompts, group, _ = SETTINGS[setting]
    name = "lora_vs_full_" + setting.replace(" ", "_").replace("<=", "_max") + ".json"
    framework = framework_ratio(model_dir(kind), args.threads, prompts * group, args.prompt_tokens,
                                args.completion_tokens)
    print(f"transformers' own forward + backward, {prompts * group} x ({args.prompt_tokens} + "
          f"{args.completion_tokens}) tokens: full {framework['full_s']:.2f}s, LoRA {framework['lora_s']:.2f}s, LoRA / "
          f"full {framework['ratio']:.2f} (matmul bound {UPDATE_KEPT:.2f})", flush=True)
    if args.framework_only:
        path = RESULTS / name
        recorded = json.loads(path.read_text()) if path.is_file() else {"setting": setting}
        recorded["framework"] = {**framework, "date": time.strftime("%Y-%m-%d"), "load": load_summary(),
                                 "command": "python benchmarks/lora_vs_full.py " + " ".join(sys.argv[1:])}
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(recorded, indent=1) + "\n")
        return
    prompts_file = CACHE / "prompts.jsonl"
    write_prompts(prompts_file)
    rate = matmul_gflops(args.threads)
    print(f"fp32 matmul rate with {args.threads} thread(s): {rate:.1f} GFLOP/s", flush=True)
    model_dir(kind)  # build outside the timed children
    runs = {"full": [], "lora": []}
    for round_index in range(args.rounds):
        order = ("full", "lora") if round_index % 2 == 0 else ("lora", "full")
        for variant in order:
            flags = ["--lora"] if variant == "lora" else []
            out, rss = run_child([str(Path(__file__).parent / "grpo_vs_trl.py"), "--worker", "rlx", "--setting",
                                  setting, "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads",
                                  str(args.threads), *flags], args.timeout)
            run = {**out, "peak_mib": rss}
            runs[variant].append(run)
            print(f"[{setting}] round {round_index + 1} {variant}: step {median(run['step_times']):.2f}s  generation "
                  f"{median(run['generation_times']):.2f}s  optimizer {median(run['optimizer_times']):.2f}s  "
                  f"peak RSS MiB {rss:.0f}  ({load_summary()})", flush=True)
    full, lora = summarise(runs["full"]), summarise(runs["lora"])
    bound = lora_bound(full)
    rows = [[variant, f"{s['step_s']:.2f}", f"{s['generation_s']:.2f}", f"{s['update_s']:.2f}",
             f"{s['optimizer_s']:.2f}",
             f"{s['tokens_per_s']:.0f}", f"{s['peak_mib']:.0f}"] for variant, s in (("full", full), ("lora", lora))]
    print(table(rows, ["variant", "step s", "generation s", "update s", "optimizer s", "tok/s", "peak RSS MiB"]))
    print(f"LoRA / full step: {lora['step_s'] / full['step_s']:.2f}; the bound (generation + 2/3 update, no "
          f"optimizer): {bound:.2f}s = {bound / full['step_s']:.2f} of the full step; LoRA's update / full update: "
          f"{lora['update_s'] / full['update_s']:.2f} (bound {UPDATE_KEPT:.2f}; transformers' own: "
          f"{framework['ratio']:.2f})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(json.dumps({
        "setting": setting, "full": full, "lora": lora, "lora_bound_s": bound, "runs": runs, "framework": framework,
        "matmul_gflops": rate,
        "threads": args.threads, "rounds": args.rounds, "steps": args.steps, "load": load_summary(),
        "date": time.strftime("%Y-%m-%d"), "machine": machine_summary(),
        "command": "python benchmarks/lora_vs_full.py " + " ".join(sys.argv[1:])}, indent=1) + "\n")


if __name__ == "__main__":
    main()
