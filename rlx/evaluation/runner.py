"""`rlx eval`: generate on benchmark problems (or play held-out episodes of a text environment, env=),
score, and report metrics with bootstrap intervals.

    outputs/eval/<time>_<name>/
      config.yaml  overrides.yaml  eval.log
      <benchmark>/model.jsonl      one line per problem: prompt, completions, extracted answers, scores
      <benchmark>/compare.jsonl    the same for compare= (the paired second model)
      env_<env>/model.jsonl        with env=: one line per task: its greedy and sampled episodes
      summary.json  summary.txt    every metric with its interval, and the paired differences
      plots/pass_at_k.png          pass@k against k (with intervals), one panel per benchmark

Per-problem (per-task) lines are appended as each batch of problems finishes, so `rlx eval resume=<dir>` reads
them back and generates only for the problems that are missing. The metrics, their intervals, the table and
the plot: rlx/evaluation/summary.py; the command line front (`@hydra.main`): rlx/cli/eval.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rlx.config.schema import EvalConfig
from rlx.engines.hf import eos_ids
from rlx.envs.registry import plays_through_gateway
from rlx.errors import UserError
from rlx.evaluation.agents import per_task_values
from rlx.evaluation.benchmarks import Benchmark
from rlx.evaluation.choices import ChoiceBenchmark, run_choice_benchmark
from rlx.evaluation.progress import EvalProgress
from rlx.evaluation.records import drop_partial_line as _drop_partial_line
from rlx.evaluation.records import read_records
from rlx.evaluation.run_task import with_run_subject
from rlx.evaluation.summary import plot_pass_at_k, render_table, suite_summary, summarize, support_lines
from rlx.fleet.backends import build_generator
from rlx.runtime.rundir import append_text, atomic_write_text
from rlx.runtime.storage import writing

log = logging.getLogger("rlx")


# --------------------------------------------------------------------------------------------
# Which model: a run directory, a checkpoint, a local folder, a hub id or builtin:NAME
# --------------------------------------------------------------------------------------------


def resolve_run(run: str, checkpoint: str = "final") -> tuple[str, str]:
    """(model folder, label) of a training run directory's final model or a chosen checkpoint."""
    from rlx.models.loading import is_run_model

    run_dir = Path(run).expanduser()
    if is_run_model(run_dir):  # already a model folder (final/, a LoRA adapter or a checkpoint)
        return str(run_dir), f"{run_dir.parent.name}/{run_dir.name}"
    if not run_dir.is_dir():
        raise UserError(f"run '{run}' is not a directory; give a training run directory such as outputs/train/<run>")
    step = re.fullmatch(r"step_?(\d+)", checkpoint)
    named = f"step_{int(step.group(1)):06d}" if step else checkpoint  # step_2 -> step_000002
    candidates = [run_dir / named, run_dir / "checkpoints" / named, Path(checkpoint).expanduser()]
    for folder in candidates:
        if is_run_model(folder):
            label = run_dir.name if checkpoint == "final" else f"{run_dir.name}/{checkpoint}"
            return str(folder), label
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*") if is_run_model(p))
    sharded = (run_dir / "checkpoints" / named / "trainer_state.json").is_file() and not is_run_model(
        run_dir / "checkpoints" / named)
    raise UserError(
        f"run '{run}' has no model '{checkpoint}'"
        + (" (that checkpoint holds sharded FSDP/DeepSpeed states, not a model)" if sharded else "")
        + "; valid choices: "
          f"{', '.join(['final'] * (run_dir / 'final').is_dir() + saved) or 'none (did the run finish?)'}"
    )


def resolve_compare(compare: str, run: str | None, checkpoint: str) -> tuple[str, str]:
    """compare=base: the model a run started from; a run directory; else a model path/id."""
    if compare == "base":
        if run is None:
            raise UserError("compare=base needs run=<training run directory> (its config names the base model)")
        config = Path(run).expanduser() / "config.yaml"
        if not config.is_file():
            raise UserError(f"compare=base: {config} not found; give compare=<model path or builtin:NAME> instead")
        base = OmegaConf.load(config).model.path
        if base is None:
            raise UserError("compare=base: the run built its model from scratch; give compare=<model> instead")
        return str(base), f"base ({base})"
    from rlx.models.loading import gguf_source, is_run_model

    folder = Path(compare).expanduser()
    if folder.is_dir() and not is_run_model(folder) and gguf_source(compare) is None:  # a run dir, not a GGUF folder
        return resolve_run(compare, "final")
    return compare, compare


def load_model(path: str, model_cfg, device: torch.device):
    from rlx.models.loading import is_run_model, load_causal_lm, load_run_model, load_tokenizer

    if Path(path).is_dir() and is_run_model(Path(path)):  # a run's final/, LoRA adapter or checkpoint
        model, tokenizer = load_run_model(path, model_cfg.dtype, model_cfg.trust_remote_code)
        return model.to(device).eval(), tokenizer
    tokenizer = load_tokenizer(path, model_cfg.revision, model_cfg.trust_remote_code)
    model = load_causal_lm(path, model_cfg.dtype, model_cfg.revision, model_cfg.trust_remote_code)
    return model.to(device).eval(), tokenizer


# --------------------------------------------------------------------------------------------
# Generation and scoring, batch by batch, appended to a jsonl
# --------------------------------------------------------------------------------------------


def _batch_seed(seed: int, problem_id: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(problem_id.encode())) % 2**31


def _model_inputs(tokenizer, problems: list[dict], chat_template: bool, system_prompt: str | None) -> list[str]:
    from rlx.rollout.prompts import format_prompts

    return format_prompts(tokenizer, problems, chat_template, system_prompt)


@dataclass(frozen=True)
class EvalPass:
    """One model's pass over one benchmark or environment: its results file (the records already there are
    kept, the rest generated), the sampling knobs (cfg.sampling), whether prompts use the chat template, the
    run's seed, and the progress bar's label and switch."""

    results: Path
    sampling: object
    chat_template: bool
    seed: int
    label: str
    progress: object


@torch.no_grad()
def run_benchmark(model, tokenizer, bench: Benchmark, problems: list[dict], run: EvalPass, engine=None) -> list[dict]:
    """Generate and score every problem not yet in `run.results`; returns all records in problem order.
    Sampling goes through the generator protocol (rlx.engines.generator.sample_rollout): `engine` (rollout=vllm,
    its knobs set to `sampling`'s) when given, else HFGenerator on the model. Seeds: drawn per completion from
    the torch RNG seeded per batch (greedy rows first, then the sampled ones)."""
    from rlx.engines.generator import Draw, sample_rollout

    results, sampling, label = run.results, run.sampling, run.label
    generator = engine if engine is not None else _hf_generator(model, tokenizer, sampling, logprobs=False)

    def generate(inputs, *, samples_per_prompt, greedy=False):
        seeds = torch.randint(0, 2**31 - 1, (len(inputs) * samples_per_prompt,)).tolist()
        return sample_rollout(generator, tokenizer, inputs, Draw(samples_per_prompt, max_new, greedy=greedy), seeds)

    done = {r["id"]: r for r in read_records(results)}
    todo = [p for p in problems if p["id"] not in done]
    if done:
        log.info("%s: %d/%d problems already in %s, generating the rest", label, len(problems) - len(todo),
                 len(problems), results)
    n, greedy = int(sampling.n), bool(sampling.greedy)
    per_problem = n + int(greedy)
    max_new = int(sampling.max_new_tokens or bench.max_new_tokens)
    use_chat = run.chat_template if bench.chat_template is None else bool(bench.chat_template)
    step = max(1, int(sampling.batch_size) // per_problem)  # problems per batch
    bar = EvalProgress(label, len(problems), len(problems) - len(todo), run.progress)
    running = [r["greedy"]["score"] if greedy else float(np.mean(r["scores"])) for r in done.values()]
    with writing(results.parent, "the results folder"):
        results.parent.mkdir(parents=True, exist_ok=True)
    _drop_partial_line(results)
    try:
        for start in range(0, len(todo), step):
            batch = todo[start : start + step]
            inputs = _model_inputs(tokenizer, batch, use_chat, bench.system_prompt)
            torch.manual_seed(_batch_seed(run.seed, batch[0]["id"]))
            texts, truncated = [], []
            if greedy:
                out = generate(inputs, samples_per_prompt=1, greedy=True)
                texts += out.texts
                truncated += out.truncated.tolist()
            if n:
                out = generate(inputs, samples_per_prompt=n)
                texts += out.texts
                truncated += out.truncated.tolist()
            owners = (list(batch) if greedy else []) + [p for p in batch for _ in range(n)]
            extracted, scores = bench.score(texts, owners)
            lines = []
            for i, problem in enumerate(batch):
                record = {"id": problem["id"], "prompt": inputs[i], "answer": problem["answer"], "greedy": None}
                offset = len(batch) if greedy else 0
                if greedy:
                    record["greedy"] = {"completion": texts[i], "extracted": extracted[i], "score": scores[i],
                                        "truncated": truncated[i]}
                lo, hi = offset + i * n, offset + (i + 1) * n
                record.update(samples=texts[lo:hi], extracted=extracted[lo:hi], scores=scores[lo:hi],
                              truncated=int(sum(truncated[lo:hi])))
                done[problem["id"]] = record
                running.append(record["greedy"]["score"] if greedy else float(np.mean(record["scores"])))
                lines.append(json.dumps(record) + "\n")
            # one write per batch: an interruption loses at most this batch (a line cut short is dropped on resume)
            append_text(results, "".join(lines), f"the records of {len(batch)} problems")
            bar.update(len(batch), len(texts), "greedy acc" if greedy else "mean score", float(np.mean(running)))
    finally:
        bar.close()
    return [done[p["id"]] for p in problems]


@torch.no_grad()
def run_environment(generator, tokenizer, env_cfg, factory, tasks: int, run: EvalPass,
                    stop_ids: list[int]) -> list[dict]:
    """Play every held-out task not yet in `run.results` (its greedy episode and sampling.n sampled ones,
    evaluation/agents.py: play_tasks); returns all task records in task order."""
    from rlx.evaluation.agents import play_tasks

    results, sampling = run.results, run.sampling
    ids = [f"task_{t:06d}" for t in range(tasks)]
    done = {r["id"]: r for r in read_records(results)}
    todo = [t for t, i in enumerate(ids) if i not in done]
    n, greedy = int(sampling.n), bool(sampling.greedy)
    step = max(1, int(sampling.batch_size) // (n + int(greedy)))  # tasks per batch
    bar = EvalProgress(run.label, tasks, tasks - len(todo), run.progress, unit="tasks")
    running = [r["greedy"]["success"] if greedy else float(np.mean([e["success"] for e in r["episodes"]]))
               for r in done.values()]
    with writing(results.parent, "the results folder"):
        results.parent.mkdir(parents=True, exist_ok=True)
    _drop_partial_line(results)
    try:
        for start in range(0, len(todo), step):
            batch = play_tasks(generator, tokenizer, factory, env_cfg, todo[start:start + step], run, stop_ids)
            for record in batch:
                done[record["id"]] = record
                running.append(record["greedy"]["success"] if greedy else
                               float(np.mean([e["success"] for e in record["episodes"]])))
            # one write per batch: an interruption loses at most this batch (a line cut short is dropped on resume)
            append_text(results, "".join(json.dumps(r) + "\n" for r in batch), f"the records of {len(batch)} tasks")
            bar.update(len(batch), len(batch) * (n + int(greedy)), "greedy success" if greedy else "success",
                       float(np.mean(running)))
    finally:
        bar.close()
    return [done[i] for i in ids]


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def check_settings(cfg: DictConfig) -> EvalConfig:
    """The settled eval config's knobs checked and made typed settings (rlx.config.settings.checked_settings: types,
    ranges and choices of every knob, one line naming it), then the rules that compare them. Returns the settings."""
    from rlx.config.settings import checked_settings

    s = checked_settings(cfg, "eval")
    check_eval_settings(s)
    return s


def check_eval_settings(cfg: EvalConfig) -> None:
    """What makes no sense in `rlx eval`'s typed settings: one line naming the knobs and the fix (UserError)."""
    sampling = cfg.sampling
    if sampling.n < 0 or (sampling.n == 0 and not sampling.greedy):
        raise UserError(f"sampling.n={sampling.n} with sampling.greedy={sampling.greedy} generates nothing; "
                        "set sampling.n >= 1 or sampling.greedy=true")
    if sampling.batch_size < 1:
        raise UserError(f"sampling.batch_size={sampling.batch_size} must be at least 1")
    if not cfg.benchmark and cfg.env is None:
        raise UserError("no benchmark selected; e.g. benchmark=chain_sum or benchmark=[chain_sum,gsm8k], or env=grid")
    if any(int(k) < 1 for k in cfg.metrics.ks):
        raise UserError(f"metrics.ks={list(cfg.metrics.ks)} must all be >= 1")
    if not 0 < cfg.metrics.confidence < 1:
        raise UserError(f"metrics.confidence={cfg.metrics.confidence} must lie in (0, 1)")
    if cfg.rollout.backend == "vllm" and cfg.compare:
        raise UserError("rollout=vllm evaluates one model per run (one engine per process); "
                        "evaluate the compare= model in a second run, or use rollout=hf")


def _saved_config(out_dir: Path, cfg: DictConfig) -> DictConfig:
    """On resume, the settings of the interrupted evaluation win (same models, benchmarks, sampling)."""
    saved = out_dir / "config.yaml"
    if not saved.is_file():
        raise UserError(f"resume={out_dir}: no config.yaml there; give a directory written by rlx eval")
    try:
        old = OmegaConf.load(saved)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"resume={out_dir}: {saved} is damaged ({first}); the evaluation cannot be resumed as it "
                        "was") from None
    if not isinstance(old, DictConfig) or "sampling" not in old or "metrics" not in old:
        raise UserError(f"resume={out_dir}: {saved} was not written by rlx eval (a training run?); give a directory "
                        "written by rlx eval, or evaluate a training run with run=<run>")
    old.resume = str(out_dir)
    old.progress = cfg.progress
    return old


def _environment(s: EvalConfig):
    """(results folder name, environment factory, number of tasks) when env= is set, else None."""
    env_cfg = s.env
    if env_cfg is None:
        return None
    from rlx.envs import env_factory
    from rlx.errors import EnvError

    try:
        factory = env_factory(env_cfg.name, env_cfg.target, env_cfg.kwargs)
    except EnvError as exc:
        raise UserError(str(exc)) from None
    label = str(env_cfg.target).rpartition(".")[2] if env_cfg.name == "custom" else env_cfg.name
    if plays_through_gateway(env_cfg.name):  # [harness] checked before a model loads; results named by run()'s module
        from rlx.gateway.harness import HarnessSettings, load_harness

        load_harness(env_cfg.target)
        HarnessSettings.from_env(env_cfg, greedy=False)
        label = "harness_" + str(env_cfg.target).rpartition(".")[0].rpartition(".")[2]
    return f"env_{label}", factory, int(s.limit or env_cfg.eval_episodes)


def _hf_generator(model, tokenizer, sampling, logprobs: bool = True):
    from rlx.engines.generator import DecodeStep, HFGenerator

    return HFGenerator(model, tokenizer, temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                       top_k=int(sampling.top_k), batch_size=int(sampling.batch_size), logprobs=logprobs,
                       decode=DecodeStep(share_prefix=True))  # a few-shot prompt's examples encoded once per batch


def _eval_pass(cfg: EvalConfig, out_dir: Path, name: str, role: str) -> EvalPass:
    """The EvalPass of `role`'s model ("model" or "compare") over the benchmark or environment `name`."""
    return EvalPass(out_dir / name / f"{role}.jsonl", cfg.sampling, chat_template=bool(cfg.model.chat_template),
                    seed=int(cfg.seed), label=f"{name} {role}", progress=cfg.progress)


def _settled_config(cfg: DictConfig, out_dir: Path, overrides: list[str]) -> DictConfig:
    """The settings evaluated by: a resumed evaluation's own (config.yaml), else cfg resolved, sampling as the
    run= sampled unless the command line says otherwise, with the benchmark= files outside the package added."""
    if cfg.resume:
        cfg = _saved_config(out_dir, cfg)
    else:
        if cfg.run:  # ask and read answers as the run's model preset does (before the prompts' interpolations resolve)
            from rlx.evaluation.run_task import run_answer

            answer = run_answer(cfg.run, overrides)
            if answer is not None:
                with open_dict(cfg):
                    cfg.model.answer = answer
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        if cfg.run:  # sample as the run sampled, unless the command line says otherwise
            from rlx.evaluation.run_task import run_sampling

            taken = {k: v for k, v in run_sampling(cfg.run, overrides).items() if cfg.sampling[k] != v}
            for knob, value in taken.items():
                cfg.sampling[knob] = value
            if taken:
                log.info("sampling with the run's %s (sampling.KNOB=... to change)",
                         ", ".join(f"{k}={v}" for k, v in taken.items()))
    # benchmark=./mine.yaml: files outside the package (rlx/evaluation/run_task.py)
    if cfg.get("benchmark_files") and not cfg.resume:
        from rlx.evaluation.run_task import load_benchmark_files

        extra = load_benchmark_files(list(cfg.benchmark_files))
        clash = sorted(set(extra) & set(cfg.get("benchmark") or {}))
        if clash:
            raise UserError(f"benchmark '{clash[0]}' is both a file and a package benchmark; rename it in its file")
        cfg.benchmark = {**OmegaConf.to_container(cfg.get("benchmark") or OmegaConf.create({})), **extra}
    return cfg


def _write_summary(summary: dict, labels: dict, cfg: EvalConfig, out_dir: Path) -> None:
    """summary.json, the table and notes (printed, and in summary.txt), the pass@k plot (cfg.plot), the headline."""
    from rich.console import Console

    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2), "the evaluation summary (summary.json)")
    console = Console(record=True, width=160)
    console.print(render_table(summary, labels, float(cfg.metrics.confidence)))
    from rlx.evaluation.explain import metric_notes

    for line in support_lines(summary, labels) + metric_notes(summary):
        console.print(line)
    atomic_write_text(out_dir / "summary.txt", console.export_text(), "the evaluation summary (summary.txt)")
    if cfg.plot:
        plot_pass_at_k(summary, labels, out_dir / "plots" / "pass_at_k.png")
    from rlx.evaluation.explain import headline_line

    log.info("done: %s  %s", out_dir, headline_line(summary))


def evaluate(cfg: DictConfig, out_dir: Path, overrides: list[str]) -> dict:
    """Evaluate according to the composed config `cfg`, writing everything into out_dir: the config settled (a
    resume's own, the run's sampling, benchmark files), recorded as config.yaml and made typed settings
    (check_settings); the evaluation reads only those. Returns summary.json's content."""
    from rlx.runtime.rundir import write_run_files

    cfg = _settled_config(cfg, out_dir, overrides)
    s = check_settings(cfg)
    benchmark_given = any(o.lstrip("+~").startswith("benchmark") for o in overrides)
    if s.env is not None and benchmark_given:
        raise UserError("env= evaluates an environment instead of benchmarks; evaluate benchmark= in a separate run")
    if s.hardware.num_threads:
        torch.set_num_threads(s.hardware.num_threads)
    from rlx.config.rules import check_device

    check_device(s.hardware)  # hardware=gpu never falls back to the CPU silently
    if not s.resume:
        write_run_files(out_dir, cfg, overrides)
    if s.run and s.env is None and not benchmark_given and not s.suite:  # a suite names its own benchmarks
        s = with_run_subject(s)
    return _evaluate_settings(s, out_dir)


def _evaluate_settings(s: EvalConfig, out_dir: Path) -> dict:
    """The evaluation of the typed settings `s`: each subject (the model, and compare=) on every benchmark or on
    the environment's held-out episodes, the results files written as it goes, then summary.json."""
    device = torch.device("cpu" if s.hardware.cpu else "cuda")
    environment = _environment(s)  # (name, factory, tasks) with env=, else None
    reader = s.model.answer.reader if s.model.answer else None  # an evaluation resumed from before model.answer: none
    benchmarks = [] if environment else [make_benchmark(name, spec, reader) for name, spec in s.benchmark.items()]
    problems = {b.name: b.load(s.limit, s.subset, int(s.subset_seed)) for b in benchmarks}
    subjects = {"model": resolve_run(s.run, s.checkpoint) if s.run else (s.model.path, s.model.path)}
    if s.compare:
        subjects["compare"] = resolve_compare(str(s.compare), s.run, s.checkpoint)
    labels = {role: label for role, (_, label) in subjects.items()}
    if len(set(labels.values())) < len(labels):
        labels["compare"] += " (compare)"
    log.info("eval directory: %s", out_dir)
    records: dict[str, dict[str, list[dict]]] = {b.name: {} for b in benchmarks}
    if environment:
        records[environment[0]] = {}
    for role, (path, _) in subjects.items():
        model, tokenizer = load_model(path, s.model, device)
        log.info("%s: %s (%.2fM parameters) on %s", role, path, sum(p.numel() for p in model.parameters()) / 1e6,
                 device)
        # rollout=hf: the model generates itself with `sampling`'s knobs (below); vllm / server: an engine or server
        engine = None if s.rollout.backend == "hf" else build_generator(s.rollout, model, tokenizer, int(s.seed))
        if engine is not None:  # generate_ids samples with these knobs
            engine.sampling = {"temperature": float(s.sampling.temperature), "top_p": float(s.sampling.top_p),
                               "top_k": int(s.sampling.top_k)}
        if environment:
            name, factory, tasks = environment
            # an episode that cannot play a turn: stop before playing, one line
            if not plays_through_gateway(s.env.name):
                from rlx.rollout.budgets import check_episode_budget
                from rlx.rollout.env import EVAL_SEED_BASE
                from rlx.rollout.prompt_limits import model_context

                check_episode_budget(s.env, factory, tokenizer, model_context(model), path,
                                     [EVAL_SEED_BASE + task for task in range(tasks)], bool(s.model.chat_template))
            records[name][role] = run_environment(
                engine or _hf_generator(model, tokenizer, s.sampling), tokenizer, s.env, factory, tasks,
                _eval_pass(s, out_dir, name, role),
                stop_ids=engine.stop_ids if engine is not None else eos_ids(model, tokenizer))
        for bench in benchmarks:
            run = _eval_pass(s, out_dir, bench.name, role)
            if bench.kind == "loglikelihood":  # each choice scored (rlx/evaluation/choices.py)
                records[bench.name][role] = run_choice_benchmark(model, tokenizer, bench, problems[bench.name], run,
                                                                 int(s.scoring_tokens))
            else:  # generated and verified
                records[bench.name][role] = run_benchmark(model, tokenizer, bench, problems[bench.name], run, engine)
        if engine is not None:
            engine.close()
        del model, engine
    summary = {
        "models": {role: {"path": path, "label": label} for role, (path, label) in subjects.items()},
        "sampling": dataclasses.asdict(s.sampling),
        "benchmarks": {name: summarize(by_role, s.metrics, per_task_values) for name, by_role in records.items()
                       if environment},
    }
    for bench in benchmarks:  # reader: which reader found each benchmark's answers (the table's `read by`)
        summary["benchmarks"][bench.name] = {"kind": bench.kind, **({"headline": bench.metric} if bench.metric else {}),
                                             "reader": bench.reader,
                                             **summarize(records[bench.name], s.metrics, bench.values)}
    if len(benchmarks) > 1:
        summary["suite"] = suite_summary(s.suite or "all", benchmarks, records, s.metrics)
    _write_summary(summary, labels, s, out_dir)
    return summary


def make_benchmark(name: str, spec: dict, model_reader: str | None = None):
    """The benchmark of a config section, by its `kind`: generate (Benchmark, the default; model_reader: where the
    evaluated model states its answers) or loglikelihood (rlx/evaluation/choices.py: ChoiceBenchmark, no reader)."""
    if spec.get("kind") == "loglikelihood":
        return ChoiceBenchmark(name, dict(spec["load"]), str(spec["metric"]))
    return Benchmark(name, spec, model_reader)


def headline(summary: dict) -> float | None:
    """The number a sweeper optimizes: greedy accuracy (else pass@1) of the first benchmark; with env=:
    greedy success (else success)."""
    for result in summary["benchmarks"].values():
        for name in (result.get("headline"), "greedy/accuracy", "greedy/success", "pass@1", "success"):
            if name in result["model"]:
                return result["model"][name]["value"]
    return None
