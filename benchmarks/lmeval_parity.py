"""rlx's log-likelihood scorer and GSM8K readers checked against lm-evaluation-harness on the same questions.

    python benchmarks/lmeval_parity.py                               # every task below, the real model (~25 min CPU)
    python benchmarks/lmeval_parity.py --tasks arc_easy:rc_0shot --limit 20 --gsm8k 0   # a quick look

Needs .venv-lmeval (`make lmeval-env`: lm-eval 0.4.13 beside torch 2.13 CPU and transformers 5.23) and the
benchmark cache (`rlx fetch benchmarks`). For each task:variant of the OLMES request files it
1. takes the first --limit questions (`rlx.evaluation.olmes.choice_questions`) and writes them as a local jsonl plus an
   lm-eval task YAML whose prompt IS the request's context and whose choices ARE its continuations
   (`target_delimiter: ""`, 0 few-shot: the 5-shot contexts already hold their examples). Questions with one context
   per choice (Winogrande's partial scoring) use lm-eval's "multiple input" mode: doc_to_text returns the gold index,
   doc_to_choice the contexts, doc_to_target the shared continuation, as lm-eval's own winogrande task does;
2. runs lm-eval's HF backend (benchmarks/lmeval_side.py in .venv-lmeval, `simple_evaluate` with log_samples, fp32)
   and rlx's `choice_loglikelihoods`, each in its own process pinned to one core (`taskset -c --core`, one torch
   thread), and reads every question's per-choice sums from both;
3. reports max |ll difference|, the share of questions whose acc and acc_norm agree, both accuracies, questions/s
   (scoring alone, model load excluded: the same for both) and each process's peak RSS.
GSM8K (--gsm8k N questions): the 5-shot protocol of rlx.evaluation.protocols given to lm-eval as a generate_until task
(greedy, the same `until` and --max-gen-toks); lm-eval's own strict-match / flexible-extract answers are compared with
rlx's readers on lm-eval's logged generations, and rlx generates the same prompts for the speed figure.
Writes benchmarks/results/lmeval_parity.json (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDE_PYTHON = ROOT / ".venv-lmeval" / "bin" / "python"
TASKS = ("arc_easy:rc_0shot arc_challenge:rc_0shot hellaswag:rc_0shot piqa:rc_0shot boolq:rc_0shot "
         "winogrande:rc_0shot sciq:rc_0shot openbookqa:rc_0shot csqa:rc_0shot socialiqa:rc_0shot "
         "arc_challenge:mc_5shot hellaswag:rc_5shot winogrande:rc_5shot").split()

UTILS = '''
def _multi(doc):
    return doc["multi"]


def doc_to_text(doc):
    return doc["gold"] if _multi(doc) else doc["contexts"][0]


def doc_to_choice(doc):
    return list(doc["contexts"]) if _multi(doc) else list(doc["continuations"])


def doc_to_target(doc):
    return doc["continuations"][0] if _multi(doc) else doc["gold"]
'''

CHOICE_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
num_fewshot: 0
target_delimiter: ""
doc_to_text: !function utils.doc_to_text
doc_to_choice: !function utils.doc_to_choice
doc_to_target: !function utils.doc_to_target
metric_list:
  - metric: acc
  - metric: acc_norm
"""

GSM8K_UTILS = '''

def gsm8k_text(doc):
    return doc["prompt"]


def gsm8k_target(doc):
    return doc["solution"]
'''

GSM8K_YAML = """task: rlxp_gsm8k
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
num_fewshot: 0
doc_to_text: !function utils.gsm8k_text
doc_to_target: !function utils.gsm8k_target
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: {max_gen_toks}
filter_list:
  - name: "strict-match"
    filter:
      - function: "regex"
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: "take_first"
  - name: "flexible-extract"
    filter:
      - function: "regex"
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: "take_first"
"""


def write_gsm8k_task(folder: Path, size: int, max_gen_toks: int) -> list[dict]:
    """GSM8K's first `size` problems in rlx's 5-shot protocol (rlx.evaluation.protocols.gsm8k_problems) as an lm-eval
    generate_until task: the prompt verbatim, lm-eval gsm8k's stops, filters and exact-match settings."""
    from rlx.evaluation.protocols import gsm8k_problems

    rows = gsm8k_problems(shots=5, size=size)
    data = folder / "rlxp_gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rlxp_gsm8k.yaml").write_text(GSM8K_YAML.format(data=data, max_gen_toks=max_gen_toks))
    return rows


def lmeval_name(task: str) -> str:
    return "rlxp_" + task.replace(":", "_")


def write_choice_task(folder: Path, task: str, questions) -> list[dict]:
    """The questions as a local jsonl and an lm-eval task YAML in `folder` (module docstring, step 1)."""
    rows = []
    for q in questions:
        multi = len(set(q.contexts)) > 1
        if multi and len(set(q.continuations)) > 1:
            raise ValueError(f"{q.id}: lm-eval's multiple-input mode needs one continuation shared by all contexts")
        rows.append({"id": q.id, "contexts": list(q.contexts), "continuations": list(q.continuations),
                     "gold": q.gold, "multi": multi})
    name = lmeval_name(task)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(CHOICE_YAML.format(name=name, data=data))
    (folder / "utils.py").write_text(UTILS + GSM8K_UTILS)
    return rows


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rlx_side(folder: Path, tasks: list[str], model_path: str, out: Path, gsm8k: int, max_gen_toks: int) -> None:
    """rlx's process: load the model once, score every task's jsonl, time each (module docstring, step 2)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.evaluation.loglikelihood import ChoiceQuestion, choice_loglikelihoods

    torch.set_num_threads(1)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    result = {"load_s": time.perf_counter() - start, "tasks": {}}
    for task in tasks:
        rows = [json.loads(line) for line in (folder / f"{lmeval_name(task)}.jsonl").read_text().splitlines()]
        questions = [ChoiceQuestion(r["id"], tuple(r["contexts"]), tuple(r["continuations"]), r["gold"]) for r in rows]
        start, cpu = time.perf_counter(), time.process_time()
        sums = choice_loglikelihoods(model, tokenizer, questions)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        result["tasks"][task] = {"seconds": seconds, "cpu_seconds": cpu, "lls": sums}
        print(f"rlx {task}: {len(questions)} questions in {seconds:.1f}s", flush=True)
    if gsm8k:
        result["gsm8k"] = rlx_generate(model, tokenizer, folder, max_gen_toks)
    result["peak_rss_mb"] = _peak_rss_mb()
    out.write_text(json.dumps(result))


def rlx_generate(model, tokenizer, folder: Path, max_gen_toks: int) -> dict:
    """Greedy completions of the GSM8K prompts through rlx's generator, cut at the protocol's stop strings."""
    from rlx.evaluation.protocols import GSM8K_UNTIL, generate_until

    rows = [json.loads(line) for line in (folder / "rlxp_gsm8k.jsonl").read_text().splitlines()]
    start, cpu = time.perf_counter(), time.process_time()
    texts = generate_until(model, tokenizer, [r["prompt"] for r in rows], GSM8K_UNTIL, max_gen_toks)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"rlx gsm8k: {len(rows)} questions in {seconds:.1f}s", flush=True)
    return {"seconds": seconds, "cpu_seconds": cpu, "generations": texts}


def _pinned(core: int | None) -> list[str]:
    return ["taskset", "-c", str(core)] if core is not None else []


def run_child(command: list[str], core: int | None) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT))
    subprocess.run(_pinned(core) + command, check=True, env=env)


def compare_task(rows: list[dict], ours: list[list[float]], theirs: list[dict], multi_norm: bool) -> dict:
    """Per-question agreement of the two sides' sums and of acc / acc_norm (rlx's choice_scores on rlx's sums
    against lm-eval's own per-sample metrics). multi_norm: lm-eval's acc_norm in multiple-input mode divides by
    the length of each CONTEXT (its doc_to_choice), so there it is compared with the same rule on rlx's sums."""
    from rlx.evaluation.loglikelihood import choice_scores

    by_doc = {s["doc_id"]: s for s in theirs}
    diffs, same_acc, same_norm, acc = [], 0, 0, {"rlx": [0.0, 0.0], "lm_eval": [0.0, 0.0]}
    same_requests = 0
    worst = None
    for i, (row, sums) in enumerate(zip(rows, ours)):
        sample = by_doc[i]
        pairs = [[c, k] for c, k in zip(row["contexts"], row["continuations"])]
        same_requests += [[str(a) for a in arg[:2]] for arg in sample["arguments"]] == pairs
        for j, (a, b) in enumerate(zip(sums, sample["lls"])):
            if worst is None or abs(a - b) > worst["diff"]:
                worst = {"question": row["id"], "choice": j, "rlx": a, "lm_eval": b, "diff": abs(a - b)}
            diffs.append(abs(a - b))
        scores = choice_scores(sums, tuple(row["continuations"]), row["gold"])
        if multi_norm:
            normed = [s / len(c) for s, c in zip(sums, row["contexts"])]
            scores["acc_norm"] = float(max(range(len(normed)), key=lambda j: (normed[j], -j)) == row["gold"])
        same_acc += scores["acc"] == sample["acc"]
        same_norm += scores["acc_norm"] == sample["acc_norm"]
        acc["rlx"][0] += scores["acc"]
        acc["rlx"][1] += scores["acc_norm"]
        acc["lm_eval"][0] += sample["acc"]
        acc["lm_eval"][1] += sample["acc_norm"]
    n = len(rows)
    return {
        "questions": n,
        "same_requests": same_requests / n,
        "max_abs_ll_diff": max(diffs),
        "mean_abs_ll_diff": sum(diffs) / len(diffs),
        "worst": worst,
        "same_acc": same_acc / n,
        "same_acc_norm": same_norm / n,
        "acc": {"rlx": acc["rlx"][0] / n, "lm_eval": acc["lm_eval"][0] / n},
        "acc_norm": {"rlx": acc["rlx"][1] / n, "lm_eval": acc["lm_eval"][1] / n},
    }


def compare_gsm8k(rows: list[dict], theirs: list[dict], ours: list[str]) -> dict:
    """rlx's strict-match and flexible-extract readers and exact match on lm-eval's own logged generations, against
    the answers lm-eval's filters logged; and the share of greedy generations equal between the two sides."""
    from rlx.evaluation.protocols import gsm8k_exact_match, gsm8k_flexible, gsm8k_strict

    by_filter = {(s["doc_id"], s["filter"]): s for s in theirs}
    same = {"strict": 0, "flexible": 0, "strict_em": 0, "flexible_em": 0, "generation": 0}
    em = {"strict": [0.0, 0.0], "flexible": [0.0, 0.0]}
    for i, row in enumerate(rows):
        text = by_filter[(i, "strict-match")]["generation"]
        filtered = {name: by_filter[(i, key)] for name, key in (("strict", "strict-match"),
                                                                ("flexible", "flexible-extract"))}
        for name, reader in (("strict", gsm8k_strict), ("flexible", gsm8k_flexible)):
            ours_answer = reader(text) or "[invalid]"  # lm-eval's fallback where rlx's reader returns None
            theirs_answer = filtered[name]["filtered"]
            theirs_answer = theirs_answer[0] if isinstance(theirs_answer, list) else theirs_answer
            same[name] += ours_answer == theirs_answer
            ours_em = gsm8k_exact_match(ours_answer, row["solution"])
            same[f"{name}_em"] += ours_em == filtered[name]["exact_match"]
            em[name][0] += ours_em
            em[name][1] += filtered[name]["exact_match"]
        same["generation"] += ours[i] == text
    n = len(rows)
    return {"questions": n, **{f"same_{k}": v / n for k, v in same.items()},
            "exact_match": {k: {"rlx_reader": v[0] / n, "lm_eval": v[1] / n} for k, v in em.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="*", default=list(TASKS),
                        help="task:variant of the OLMES request files, or mmlu:mc / mmlu:rc")
    parser.add_argument("--limit", type=int, default=200, help="first N questions of a 0-shot task")
    parser.add_argument("--limit-shots", type=int, default=50, help="first N questions of a 5-shot task")
    parser.add_argument("--gsm8k", type=int, default=50, help="GSM8K questions (0: none)")
    parser.add_argument("--max-gen-toks", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16, help="lm-eval's --batch_size")
    parser.add_argument("--core", type=int, default=1, help="the core both processes are pinned to (-1: no pin)")
    parser.add_argument("--model", default=None, help="model folder (default: rlx fetch smollm2-135m-instruct)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "lmeval_parity.json"))
    parser.add_argument("--reuse", default=None, help="a work folder of an earlier run: its lm-eval results are kept "
                        "(same tasks and limits), only rlx's side runs again")
    parser.add_argument("--side", choices=["rlx"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "rlx":
        rlx_side(Path(args.folder), args.tasks, args.model, Path(args.out), args.gsm8k, args.max_gen_toks)
        return
    print(json.dumps(run(args), indent=1))


def _questions(name: str, variant: str):
    """A request file's questions; "mmlu:mc" / "mmlu:rc": MMLU's test split 0-shot, every 57th question so that
    the first N span the subjects (rlx.evaluation.olmes.mmlu_questions)."""
    from rlx.evaluation.olmes import choice_questions, mmlu_questions

    if name == "mmlu":
        return mmlu_questions("test", variant)[::57]
    return choice_questions(name, variant)


def _speed(entry: dict, n: int, ours: dict, theirs: dict) -> None:
    """Questions per wall second and per CPU second of the pinned one-thread process (the CPU figure is the one that
    holds on a shared machine: another process on the same core stretches wall time, not this process's CPU time)."""
    entry["questions_per_s"] = {"rlx": n / ours["seconds"], "lm_eval": n / theirs["seconds"]}
    entry["questions_per_cpu_s"] = {"rlx": n / ours["cpu_seconds"], "lm_eval": n / theirs["cpu_seconds"]}
    entry["speedup"] = entry["questions_per_s"]["rlx"] / entry["questions_per_s"]["lm_eval"]
    entry["speedup_cpu"] = entry["questions_per_cpu_s"]["rlx"] / entry["questions_per_cpu_s"]["lm_eval"]


def default_model() -> str:
    from rlx.models.loading import resolve_model_path

    return resolve_model_path("package:smollm2-135m-instruct")


def run(args) -> dict:
    if not SIDE_PYTHON.exists():
        sys.exit(f"{SIDE_PYTHON} is missing; run `make lmeval-env` first")
    model = args.model or default_model()
    core = None if args.core < 0 else args.core
    folder = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="lmeval_parity_"))
    print(f"work folder: {folder}", flush=True)
    load = os.getloadavg()
    rows = {}
    for task in args.tasks:
        name, variant = task.split(":")
        limit = args.limit if variant.endswith("0shot") else args.limit_shots
        rows[task] = write_choice_task(folder, task, _questions(name, variant)[:limit])
    side_tasks = [lmeval_name(t) for t in args.tasks]
    if args.gsm8k:
        gsm_rows = write_gsm8k_task(folder, args.gsm8k, args.max_gen_toks)
        (folder / "utils.py").write_text(UTILS + GSM8K_UTILS)
        side_tasks.append("rlxp_gsm8k")
    if not (args.reuse and (folder / "lmeval.json").exists()):
        run_child([str(SIDE_PYTHON), str(ROOT / "benchmarks" / "lmeval_side.py"), "--tasks-dir", str(folder),
                   "--tasks", ",".join(side_tasks), "--model", model, "--batch-size", str(args.batch_size),
                   "--out", str(folder / "lmeval.json")], core)
    run_child([sys.executable, str(Path(__file__).resolve()), "--side", "rlx", "--folder", str(folder), "--tasks",
               *args.tasks, "--model", model, "--gsm8k", str(args.gsm8k), "--max-gen-toks", str(args.max_gen_toks),
               "--out", str(folder / "rlx.json")], core)
    theirs = json.loads((folder / "lmeval.json").read_text())
    ours = json.loads((folder / "rlx.json").read_text())
    report = {"model": model, "lm_eval": f"0.4.13 (HF backend, fp32, batch_size {args.batch_size})",
              "pinned_core": core, "peak_rss_mb": {"rlx": ours["peak_rss_mb"], "lm_eval": theirs["peak_rss_mb"]},
              "load_s": {"rlx": ours["load_s"], "lm_eval": theirs["load_s"]}, "load_average_at_start": load,
              "tasks": {}}
    for task in args.tasks:
        side = theirs["tasks"][lmeval_name(task)]
        entry = compare_task(rows[task], ours["tasks"][task]["lls"], side["samples"],
                             multi_norm=any(r["multi"] for r in rows[task]))
        n = entry["questions"]
        _speed(entry, n, ours["tasks"][task], side)
        report["tasks"][task] = entry
    if args.gsm8k:
        side = theirs["tasks"]["rlxp_gsm8k"]
        entry = compare_gsm8k(gsm_rows, side["samples"], ours["gsm8k"]["generations"])
        _speed(entry, len(gsm_rows), ours["gsm8k"], side)
        entry["max_gen_toks"] = args.max_gen_toks
        report["gsm8k"] = entry
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
