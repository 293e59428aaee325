"""rlx vs TRL DPOTrainer: step time and peak memory of sigmoid DPO on the same pairs and model files.

    python benchmarks/dpo_vs_trl.py                  # both settings, 3 alternating rounds (make bench)
    python benchmarks/dpo_vs_trl.py --settings tiny --rounds 1 --steps 2

Both sides: 16 (prompt, chosen, rejected) pairs per optimizer step in one micro-batch, beta 0.1, AdamW
lr 1e-6 constant, grad-norm clip 1.0, a frozen reference model evaluated every step (TRL's default;
no precomputation), CPU, float32, one torch thread, EOS appended to every completion.
rlx has no preference loop yet, so its side is the step a loop builds from rlx's parts: the chunked
log-prob forward (models/forward.py) on chosen and rejected stacked in one batch, the reference
forward without gradients, and `algorithms.preference.preference_loss(loss_type="dpo")`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import CACHE, TINY, large_vocab_model, load_summary, median, run_child, table  # noqa: E402

SETTINGS = {"tiny": "tiny", "151k-vocab": "large"}  # name: model
PAIRS, BETA, LR = 16, 0.1, 1e-6


def model_dir(kind: str) -> Path:
    return TINY if kind == "tiny" else large_vocab_model()


def write_pairs(path: Path, count: int = 256, seed: int = 0) -> Path:
    """chain_sum pairs: the chosen completion works the sum out and answers right, the rejected one is off by one."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(count):
            terms = [rng.randint(0, 9) for _ in range(4)]
            steps, total = [], terms[0]
            for term in terms[1:]:
                steps.append(f"{total} + {term} = {total + term}")
                total += term
            work = ", ".join(steps)
            handle.write(json.dumps({
                "prompt": "Compute " + " + ".join(map(str, terms)),
                "chosen": f"{work}, so <answer>{total}</answer>",
                "rejected": f"{work}, so <answer>{total + 1}</answer>",
            }) + "\n")
    return path


def _chat_prompt(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def rlx_worker(setting: str, steps: int, pairs_file: Path) -> dict:
    import copy

    import torch

    torch.set_num_threads(1)
    from rlx.algorithms.preference import preference_loss
    from rlx.models.forward import completion_logprobs
    from rlx.models.loading import load_causal_lm, load_tokenizer

    path = str(model_dir(SETTINGS[setting]))
    tokenizer, model = load_tokenizer(path), load_causal_lm(path)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        batch = rows[step * PAIRS : (step + 1) * PAIRS]
        prompts = [_chat_prompt(tokenizer, r["prompt"]) for r in batch] * 2
        tokenizer.padding_side = "left"
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)  # (2B, P)
        tokenizer.padding_side = "right"
        completions = [r["chosen"] + tokenizer.eos_token
                       for r in batch] + [r["rejected"] + tokenizer.eos_token for r in batch]
        comp = tokenizer(completions, return_tensors="pt", padding=True, add_special_tokens=False)  # (2B, C)
        args = (enc["input_ids"], enc["attention_mask"], comp["input_ids"], comp["attention_mask"])
        with torch.no_grad():
            ref_logp, _ = completion_logprobs(reference, *args)  # (2B, C)
        logp, _ = completion_logprobs(model, *args)  # (2B, C)
        mask = comp["attention_mask"].to(logp.dtype)
        sums, ref_sums = (logp * mask).sum(1), (ref_logp * mask).sum(1)  # (2B,)
        loss, _ = preference_loss(sums[:PAIRS], sums[PAIRS:], ref_sums[:PAIRS], ref_sums[PAIRS:], loss_type="dpo",
                                  beta=BETA)
        loss.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return {"step_times": times[1:]}


def trl_worker(setting: str, steps: int, pairs_file: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    path = model_dir(SETTINGS[setting])
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    dataset = Dataset.from_list([{**r, "prompt": _chat_prompt(tokenizer, r["prompt"])} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    config = DPOConfig(
        output_dir=str(CACHE / "trl_dpo_run"), per_device_train_batch_size=PAIRS, gradient_accumulation_steps=1,
        beta=BETA, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        max_steps=steps + 1, use_cpu=True, bf16=False, fp16=False, logging_steps=1, report_to=[],
        save_strategy="no", seed=0, dataloader_num_workers=0, gradient_checkpointing=False, max_length=None,
    )
    trainer = DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[Timer()])
    trainer.train()
    return {"step_times": times[1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated subset of: " + ", ".join(SETTINGS))
    parser.add_argument("--rounds", type=int, default=3, help="alternating rlx/TRL runs per setting")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed")
    parser.add_argument("--worker", choices=["rlx", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    args = parser.parse_args()
    pairs_file = CACHE / "pairs.jsonl"
    if args.worker:
        worker = rlx_worker if args.worker == "rlx" else trl_worker
        print(json.dumps(worker(args.setting, args.steps, pairs_file)), flush=True)
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    write_pairs(pairs_file)
    rows = []
    for setting in args.settings.split(","):
        model_dir(SETTINGS[setting])
        runs = {"rlx": [], "trl": []}
        for round_index in range(args.rounds):
            order = ("rlx", "trl") if round_index % 2 == 0 else ("trl", "rlx")
            for tool in order:
                out, rss = run_child([__file__, "--worker", tool, "--setting", setting, "--steps", str(args.steps)],
                                     args.timeout)
                runs[tool].append((median(out["step_times"]), rss))
                print(f"[{setting}] round {round_index + 1} {tool}: step {runs[tool][-1][0]:.2f}s  peak RSS {rss:.0f} "
                      f"MiB  ({load_summary()})", flush=True)
        s = {tool: [median([r[i] for r in runs[tool]]) for i in range(2)] for tool in runs}
        rows.append([setting, f"{s['rlx'][0]:.2f}", f"{s['trl'][0]:.2f}", f"{s['rlx'][0] / s['trl'][0]:.2f}",
                     f"{s['rlx'][1]:.0f}", f"{s['trl'][1]:.0f}", f"{s['rlx'][1] / s['trl'][1]:.2f}"])
    print()
    print(f"DPO ({PAIRS} pairs/step), medians of {args.rounds} alternating runs x {args.steps} timed steps; "
          f"{load_summary()}")
    print(table(rows, ["setting", "rlx step s", "TRL step s", "step rlx/TRL", "rlx peak RSS MiB", "TRL peak RSS MiB",
                       "RSS rlx/TRL"]))


if __name__ == "__main__":
    main()
