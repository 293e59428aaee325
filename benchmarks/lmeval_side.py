"""The lm-evaluation-harness side of benchmarks/lmeval_parity.py: runs in .venv-lmeval (never in rlx's .venv).

    .venv-lmeval/bin/python benchmarks/lmeval_side.py --tasks-dir DIR --tasks a,b --model FOLDER --out side.json

Loads lm-eval's HF backend once (`HFLM`, the class `lm_eval --model hf` builds, fp32, CPU) and runs
`lm_eval.simple_evaluate` once per task of DIR (the task YAMLs lmeval_parity.py wrote) with log_samples, timing each
call (wall and CPU seconds of this process). Writes per task: the seconds, and per logged sample its doc id, the
per-choice log-likelihoods (or, for a generative task, the raw generation and the filtered answers) and lm-eval's own
per-sample metrics; then the process's peak resident memory (getrusage, this process alone).
"""

from __future__ import annotations

import argparse
import json
import resource
import time


def _sample_record(sample: dict) -> dict:
    record = {"doc_id": sample["doc_id"], "id": sample["doc"].get("id"),
              "arguments": [list(a) for a in sample["arguments"]]}
    resps = sample["resps"]
    if resps and isinstance(resps[0][0], (list, tuple)):  # loglikelihood requests: [[ (ll, is_greedy) ], ...]
        record["lls"] = [float(r[0][0]) for r in resps]
    else:  # generate_until: [[text]]
        record["generation"] = resps[0][0]
        record["filtered"] = sample["filtered_resps"]
        record["filter"] = sample.get("filter")
    for key in ("acc", "acc_norm", "exact_match"):
        if key in sample:
            record[key] = float(sample[key])
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks-dir", required=True)
    parser.add_argument("--tasks", required=True, help="comma-separated task names of --tasks-dir")
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(1)
    start = time.perf_counter()
    lm = HFLM(pretrained=args.model, dtype="float32", device="cpu", batch_size=args.batch_size)
    manager = TaskManager(include_path=args.tasks_dir)
    out = {"load_s": time.perf_counter() - start, "tasks": {}}
    for task in args.tasks.split(","):
        start, cpu = time.perf_counter(), time.process_time()
        result = simple_evaluate(model=lm, tasks=[task], task_manager=manager, log_samples=True,
                                 batch_size=args.batch_size, bootstrap_iters=0)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        samples = result["samples"][task]
        out["tasks"][task] = {"seconds": seconds, "cpu_seconds": cpu, "results": result["results"][task],
                              "samples": [_sample_record(s) for s in samples]}
        print(f"lm-eval {task}: {len(samples)} samples in {seconds:.1f}s", flush=True)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(args.out, "w") as handle:
        json.dump(out, handle)


if __name__ == "__main__":
    main()
