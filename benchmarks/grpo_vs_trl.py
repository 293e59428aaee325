"""rlx vs TRL GRPOTrainer: the same model files, prompts, group size, completion length, batch, lr, no KL.

    python benchmarks/grpo_vs_trl.py                 # all settings, 3 alternating rounds (make bench)
    python benchmarks/grpo_vs_trl.py --settings 8x8x32 --rounds 1 --steps 2

Both sides: 8 prompts x 8 samples per step, one optimizer step per rollout batch (a single micro-batch of
64 sequences), AdamW lr 1e-6 constant, grad-norm clip 1.0, no KL term (so no reference model),
temperature 1, token-mean loss (TRL `loss_type="dapo"`), CPU, float32, one torch thread. Completion
length is forced on both sides by forbidding EOS before the budget (rlx `rollout.min_new_tokens`, TRL
`generation_kwargs={"min_new_tokens": ...}`), so every step generates exactly 64 x C tokens. The first
step of each run is a warm-up and is not timed (--warmup). rlx runs through its real CLI (`python -m rlx train`).
Tokens/s = completion tokens of a step / wall time of the step (generation + scoring + training).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (  # noqa: E402
    CACHE,
    TINY,
    large_vocab_model,
    load_summary,
    median,
    run_child,
    table,
    write_prompts,
)

SETTINGS = {  # name: (model, prompts per step, samples per prompt, completion tokens)
    "8x8x32": ("tiny", 8, 8, 32),
    "8x8x128": ("tiny", 8, 8, 128),
    "151k-vocab 8x8x256": ("large", 8, 8, 256),
    # random-init Qwen2.5-0.5B shape (494M parameters, 151,936 vocabulary), built offline (make bench-scale)
    "0.5b 2x4x64": ("0.5b", 2, 4, 64),
    "0.5b 2x4x256": ("0.5b", 2, 4, 256),
    # GPU sizes (make bench-scale DEVICE=cuda): a realistic rollout batch
    "0.5b 8x8x64": ("0.5b", 8, 8, 64),
    "0.5b 8x8x256": ("0.5b", 8, 8, 256),
    "0.5b 8x8x1024": ("0.5b", 8, 8, 1024),
}
KL_COEF = 0.04  # --kl: both sides (rlx algorithm.kl_coef, TRL beta), k3 estimator in the loss
LORA = {"r": 16, "alpha": 32}  # --lora: rlx model.lora defaults, all linear layers on both sides
LR = 1e-6
PROMPT_TOKENS = 40  # about the rendered length of write_prompts' questions (chat template included), for the floor
RESULTS = Path(__file__).resolve().parent / "results"


def _parameters(folder: Path) -> int:
    """Parameter count of a saved model from its safetensors header (no weights loaded)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        for key in handle.keys():
            total += _product(handle.get_slice(key).get_shape())
    return total


def _product(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def model_dir(kind: str) -> Path:
    if kind == "0.5b":
        folder = CACHE / "qwen2.5-0.5b-shape"
        if not (folder / "model.safetensors").is_file():
            from rlx.models.shapes import build_shaped_model

            build_shaped_model("qwen2.5-0.5b", folder)
        return folder
    return TINY if kind == "tiny" else large_vocab_model()


def matmul_gflops(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """The machine's measured fp32 matmul rate (GFLOP/s) with `threads` torch threads: best of `repeats`."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def cuda_matmul_gflops(size: int = 8192, repeats: int = 10) -> float:
    """GPU 0's measured bf16 matmul rate (GFLOP/s): mean of `repeats` products after 3 warm-ups."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_flops(parameters: int, rows: int, prompt_tokens: int, completion_tokens: int) -> float:
    """Arithmetic of one GRPO step without KL or old-log-prob passes: generation ~2 N FLOPs per token
    (prefill of the prompt and one decode step per completion token), the update ~6 N per token (forward
    and backward over prompt + completion). Attention's own FLOPs are left out (small at these lengths)."""
    tokens = rows * (prompt_tokens + completion_tokens)
    return 2 * parameters * tokens + 6 * parameters * tokens


def rlx_worker(setting: str, steps: int, prompts_file: Path, warmup: int, threads: int = 1, device: str = "cpu",
               lora: bool = False, kl: bool = False, extra: list[str] | None = None) -> dict:
    import subprocess

    kind, prompts, group, length = SETTINGS[setting]
    run_dir = CACHE / "rlx_run"
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl would otherwise collect earlier runs
    overrides = [
        f"model.path={model_dir(kind)}", "data=file", f"data.train_path={prompts_file}", "data.eval_size=8",
        "data.prompt_template='{question}'", "reward=exact_match", f"steps={steps + warmup}", f"prompts_per_step={prompts}",
        f"rollout.samples_per_prompt={group}", f"rollout.max_new_tokens={length}", f"rollout.min_new_tokens={length}",
        f"micro_batch_size={prompts * group}", f"optim.lr={LR}", "optim.warmup_steps=0", "optim.max_grad_norm=1.0",
        f"algorithm.kl_coef={KL_COEF if kl else 0.0}", "eval.every=0", "eval.at_start=false", "save.final=false", "save.plot=false",
        "log.samples_every=0", "log.progress=false", f"hardware.num_threads={threads}", f"hydra.run.dir={run_dir}",
    ]
    if device == "cuda":  # the GPU preset: bf16 weights (fp32 master copies) and bf16 autocast
        overrides += ["hardware=gpu", "model.dtype=bfloat16"]
    if lora:
        overrides += ["model.lora.enabled=true", f"model.lora.rank={LORA['r']}", f"model.lora.alpha={LORA['alpha']}"]
    overrides += extra or []
    subprocess.run([sys.executable, "-m", "rlx", "train", *overrides], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_time_s" in r][warmup:]  # drop the warm-up steps
    return {"step_times": [r["perf/step_time_s"] for r in rows],
            "tokens": [r["completions/mean_length"] * prompts * group for r in rows]}


def trl_worker(setting: str, steps: int, prompts_file: Path, warmup: int, threads: int = 1, device: str = "cpu",
               lora: bool = False, kl: bool = False) -> dict:
    import torch

    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    kind, prompts, group, length = SETTINGS[setting]
    path = model_dir(kind)
    rows = [json.loads(line) for line in prompts_file.read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    gpu = device == "cuda"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if gpu else torch.float32)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")

    def exact_match(prompts, completions, answer, **kwargs):  # same rule as rlx: <answer>...</answer> == answer
        out = []
        for completion, ref in zip(completions, answer):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            inner = text.split("<answer>")[-1].split("</answer>")[0].strip() if "<answer>" in text else None
            out.append(float(inner == ref))
        return out

    times, tokens = [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    config = GRPOConfig(
        output_dir=str(CACHE / "trl_run"), per_device_train_batch_size=prompts * group, gradient_accumulation_steps=1,
        num_generations=group, max_completion_length=length, generation_kwargs={"min_new_tokens": length},
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, beta=KL_COEF if kl else 0.0, num_iterations=1, loss_type="dapo", max_steps=steps + warmup,
        use_cpu=not gpu, bf16=gpu, fp16=False, logging_steps=1, report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0,
        log_completions=False, gradient_checkpointing=False,  # TRL enables it by default; rlx does not checkpoint
    )
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Timer()], peft_config=peft_config)
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    tokens = [m * prompts * group for m in lengths][warmup:]
    return {"step_times": times[warmup:], "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset of: " + ", ".join(SETTINGS))
    parser.add_argument("--rounds", type=int, default=3, help="alternating rlx/TRL runs per setting")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of each run")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides (default: 1)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: both sides on GPU 0 in bf16 (rlx hardware=gpu, TRL bf16=True), peak GPU memory from nvidia-smi")
    parser.add_argument("--lora", action="store_true", help=f"LoRA on both sides (rank {LORA['r']}, alpha {LORA['alpha']}, all linear)")
    parser.add_argument("--kl", action="store_true", help=f"KL to the reference on both sides (coefficient {KL_COEF})")
    parser.add_argument("--rlx-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra rlx train override (repeatable), e.g. rollout.onednn_decode=true")
    parser.add_argument("--worker", choices=["rlx", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    args = parser.parse_args()
    prompts_file = CACHE / "prompts.jsonl"
    if args.worker:
        if args.worker == "rlx":
            result = rlx_worker(args.setting, args.steps, prompts_file, args.warmup, args.threads, args.device,
                                args.lora, args.kl, args.rlx_set)
        else:
            result = trl_worker(args.setting, args.steps, prompts_file, args.warmup, args.threads, args.device,
                                args.lora, args.kl)
        print(json.dumps(result), flush=True)
        return
    write_prompts(prompts_file)
    gpu = args.device == "cuda"
    rate = cuda_matmul_gflops() if gpu else matmul_gflops(args.threads)
    print(f"{'bf16 GPU' if gpu else 'fp32'} matmul rate" + ("" if gpu else f" with {args.threads} thread(s)")
          + f": {rate:.1f} GFLOP/s", flush=True)
    variant = "".join(f" {name}" for name, on in (("lora", args.lora), ("kl", args.kl), ("cuda", gpu)) if on)
    variant += "".join(f" {item}" for item in args.rlx_set)
    memory = "peak GPU MiB" if gpu else "peak RSS MiB"
    results = []
    for setting in args.settings.split(","):
        model_dir(SETTINGS[setting][0])  # build outside the timed children
        runs = {"rlx": [], "trl": []}
        for round_index in range(args.rounds):
            order = ("rlx", "trl") if round_index % 2 == 0 else ("trl", "rlx")
            for tool in order:
                flags = [f"--{name}" for name, on in (("lora", args.lora), ("kl", args.kl)) if on]
                flags += [f"--rlx-set={item}" for item in args.rlx_set]
                out, rss = run_child([__file__, "--worker", tool, "--setting", setting, "--steps", str(args.steps),
                                      "--warmup", str(args.warmup), "--threads", str(args.threads),
                                      "--device", args.device, *flags], args.timeout, gpu_memory=gpu)
                step = median(out["step_times"])
                tokens = median(out["tokens"])
                runs[tool].append((step, tokens / step, rss))
                print(f"[{setting}{variant}] round {round_index + 1} {tool}: step {step:.2f}s  {tokens / step:.0f} tok/s  "
                      f"{memory} {rss:.0f}  ({load_summary()})", flush=True)
        summary = {tool: [median([r[i] for r in runs[tool]]) for i in range(3)] for tool in runs}
        kind, prompts, group, length = SETTINGS[setting]
        parameters = _parameters(model_dir(kind))
        floor = step_flops(parameters, prompts * group, PROMPT_TOKENS, length) / (rate * 1e9)
        print(f"[{setting}{variant}] compute floor: {step_flops(parameters, prompts * group, PROMPT_TOKENS, length) / 1e12:.2f} "
              f"TFLOP per step / {rate:.0f} GFLOP/s = {floor:.1f} s", flush=True)
        results.append((setting + variant, summary, floor))
    rows = []
    for setting, s, floor in results:
        rows.append([setting, f"{s['rlx'][0]:.2f}", f"{s['trl'][0]:.2f}", f"{floor:.2f}", f"{s['rlx'][1]:.0f}",
                     f"{s['trl'][1]:.0f}", f"{s['rlx'][1] / s['trl'][1]:.2f}x", f"{s['rlx'][2]:.0f}", f"{s['trl'][2]:.0f}",
                     f"{s['rlx'][2] / s['trl'][2]:.2f}"])
        RESULTS.mkdir(parents=True, exist_ok=True)
        name = "grpo_vs_trl_" + setting.replace(" ", "_") + ".json"
        (RESULTS / name).write_text(json.dumps({"setting": setting, "rlx": s["rlx"], "trl": s["trl"], "floor_s": floor,
                                                "matmul_gflops": rate, "threads": args.threads, "device": args.device,
                                                "lora": args.lora, "kl": args.kl, "rounds": args.rounds,
                                                "steps": args.steps, "load": load_summary()}, indent=1) + "\n")
    print()
    print(f"GRPO, medians of {args.rounds} alternating runs x {args.steps} timed steps after {args.warmup} warm-up; "
          f"{load_summary()}")
    print(table(rows, ["setting", "rlx step s", "TRL step s", "floor s", "rlx tok/s", "TRL tok/s", "tok/s rlx/TRL",
                       f"rlx {memory}", f"TRL {memory}", "memory rlx/TRL"]))


if __name__ == "__main__":
    main()
