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
them back and generates only for the problems that are missing.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import zlib
from datetime import datetime
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlx.config.paths import CONF_DIR
from rlx.errors import StorageError, UserError, fail
from rlx.evaluation.agents import per_task_values
from rlx.evaluation.benchmarks import Benchmark
from rlx.evaluation.metrics import (
    bootstrap_ci,
    crossover_k,
    majority_vote,
    mean_at_k,
    paired_bootstrap_diff,
    pass_at_k,
    solved_set_changes,
)
from rlx.rollout.hf import eos_ids
from rlx.rollout.vllm import build_engine
from rlx.runtime.rundir import append_text, atomic_write_text, start_bar, stop_bar
from rlx.runtime.storage import writing

log = logging.getLogger("rlx")


def _eval_dir(resume, name) -> str:
    """Output directory: the resumed one, or outputs/eval/<time>_<name>."""
    if resume not in (None, "", "None", "null"):
        return str(resume)
    import os

    root = os.environ.get("RLX_OUTPUTS", "outputs")
    return f"{root}/eval/{datetime.now().strftime('%Y-%m-%d_%H-%M-%S.%f')}_{name}"


if not OmegaConf.has_resolver("rlx_eval_dir"):
    OmegaConf.register_new_resolver("rlx_eval_dir", _eval_dir)


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
        + f"; valid choices: {', '.join(['final'] * (run_dir / 'final').is_dir() + saved) or 'none (did the run finish?)'}"
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
    from rlx.models.loading import is_run_model

    folder = Path(compare).expanduser()
    if folder.is_dir() and not is_run_model(folder):
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


def read_records(path: Path) -> list[dict]:
    """Finished problems of a results file; a line cut short by an interruption is ignored."""
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def _drop_partial_line(path: Path) -> None:
    """Cut a last line left unfinished by an interruption, so appended records start on a new line."""
    if path.is_file():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with writing(path, f"{path.name} without its cut-short last line"):
                path.write_bytes(data[: data.rfind(b"\n") + 1])


def _batch_seed(seed: int, problem_id: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(problem_id.encode())) % 2**31


def _model_inputs(tokenizer, problems: list[dict], chat_template: bool, system_prompt: str | None) -> list[str]:
    from rlx.rollout.prompts import format_prompts

    return format_prompts(tokenizer, problems, chat_template, system_prompt)


class _Progress:
    """Problems done, samples/s and the running metric: a rich bar on a terminal, log lines otherwise."""

    def __init__(self, label: str, total: int, done: int, enabled: str | bool, unit: str = "problems"):
        self.label, self.total, self.done, self.unit = label, total, done, unit
        self.samples, self.start = 0, time.monotonic()
        show = sys.stderr.isatty() if enabled == "auto" else bool(enabled)
        self._bar = None
        if show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), MofNCompleteColumn(), BarColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.fields[status]}"))
            self._task = self._bar.add_task(label, total=total, completed=done, status="")
            self._swapped = start_bar(self._bar)

    def update(self, problems: int, samples: int, metric_name: str, metric: float) -> None:
        self.done += problems
        self.samples += samples
        rate = self.samples / max(time.monotonic() - self.start, 1e-9)
        status = f"{rate:.1f} samples/s  {metric_name} {metric:.3f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, status=status)
        else:
            log.info("%s: %d/%d %s  %s", self.label, self.done, self.total, self.unit, status)

    def close(self) -> None:
        if self._bar is not None:
            stop_bar(self._bar, self._swapped)
            self._bar = None


@torch.no_grad()
def run_benchmark(model, tokenizer, bench: Benchmark, problems: list[dict], results: Path, sampling, *,
                  chat_template: bool, seed: int, label: str, progress, engine=None) -> list[dict]:
    """Generate and score every problem not yet in `results`; returns all records in problem order.
    Sampling goes through the generator protocol (rlx.rollout.generator.sample_rollout): `engine` (rollout=vllm,
    its knobs set to `sampling`'s) when given, else HFGenerator on the model. Seeds: drawn per completion from
    the torch RNG seeded per batch (greedy rows first, then the sampled ones)."""
    from rlx.rollout.generator import sample_rollout

    generator = engine if engine is not None else _hf_generator(model, tokenizer, sampling, logprobs=False)

    def generate(inputs, *, samples_per_prompt, greedy=False):
        seeds = torch.randint(0, 2**31 - 1, (len(inputs) * samples_per_prompt,)).tolist()
        return sample_rollout(generator, tokenizer, inputs, samples_per_prompt=samples_per_prompt,
                              max_new_tokens=max_new, seeds=seeds, greedy=greedy)

    done = {r["id"]: r for r in read_records(results)}
    todo = [p for p in problems if p["id"] not in done]
    if done:
        log.info("%s: %d/%d problems already in %s, generating the rest", label, len(problems) - len(todo),
                 len(problems), results)
    n, greedy = int(sampling.n), bool(sampling.greedy)
    per_problem = n + int(greedy)
    max_new = int(sampling.max_new_tokens or bench.max_new_tokens)
    use_chat = chat_template if bench.chat_template is None else bool(bench.chat_template)
    step = max(1, int(sampling.batch_size) // per_problem)  # problems per batch
    bar = _Progress(label, len(problems), len(problems) - len(todo), progress)
    running = [r["greedy"]["score"] if greedy else float(np.mean(r["scores"])) for r in done.values()]
    with writing(results.parent, "the results folder"):
        results.parent.mkdir(parents=True, exist_ok=True)
    _drop_partial_line(results)
    try:
        for start in range(0, len(todo), step):
            batch = todo[start : start + step]
            inputs = _model_inputs(tokenizer, batch, use_chat, bench.system_prompt)
            torch.manual_seed(_batch_seed(seed, batch[0]["id"]))
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
def run_environment(generator, tokenizer, env_cfg, factory, tasks: int, results: Path, sampling, *,
                    chat_template: bool, seed: int, label: str, progress, stop_ids: list[int]) -> list[dict]:
    """Play every held-out task not yet in `results` (its greedy episode and sampling.n sampled ones,
    evaluation/agents.py: play_tasks); returns all task records in task order."""
    from rlx.evaluation.agents import play_tasks

    ids = [f"task_{t:06d}" for t in range(tasks)]
    done = {r["id"]: r for r in read_records(results)}
    todo = [t for t, i in enumerate(ids) if i not in done]
    n, greedy = int(sampling.n), bool(sampling.greedy)
    step = max(1, int(sampling.batch_size) // (n + int(greedy)))  # tasks per batch
    bar = _Progress(label, tasks, tasks - len(todo), progress, unit="tasks")
    running = [r["greedy"]["success"] if greedy else float(np.mean([e["success"] for e in r["episodes"]]))
               for r in done.values()]
    with writing(results.parent, "the results folder"):
        results.parent.mkdir(parents=True, exist_ok=True)
    _drop_partial_line(results)
    try:
        for start in range(0, len(todo), step):
            batch = play_tasks(generator, tokenizer, factory, env_cfg, todo[start:start + step], n=n, greedy=greedy,
                               seed=seed, use_chat_template=chat_template, stop_ids=stop_ids)
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
# Metrics with intervals, and the paired difference
# --------------------------------------------------------------------------------------------


def per_problem_values(records: list[dict], ks: list[int], threshold: float) -> dict[str, np.ndarray]:
    """One value per problem for every metric: greedy/accuracy, pass@k, maj@k, mean@k.
    A k larger than a problem's number of samples is left out."""
    values: dict[str, list[float]] = {}
    if records and records[0].get("greedy") is not None:
        values["greedy/accuracy"] = [r["greedy"]["score"] for r in records]
    n = min(len(r["scores"]) for r in records) if records else 0
    for k in [k for k in ks if 1 <= k <= n]:
        values[f"pass@{k}"] = [pass_at_k(len(r["scores"]), sum(s >= threshold for s in r["scores"]), k) for r in records]
        values[f"maj@{k}"] = [majority_vote(r["extracted"][:k], r["scores"][:k])[1] for r in records]
        values[f"mean@{k}"] = [mean_at_k(r["scores"], k) for r in records]
    return {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}  # each (P,)


def summarize(records_by_role: dict[str, list[dict]], metrics_cfg, values_fn=per_problem_values) -> dict:
    """Per role: {metric: {value, low, high}}; with a compare role: paired differences on shared problems.
    values_fn(records, ks, threshold) -> {metric: (P,) one value per problem} (per_problem_values for
    benchmarks, evaluation/agents.py: per_task_values for environments)."""
    ks = [int(k) for k in metrics_cfg.ks]
    boot = dict(n_resamples=int(metrics_cfg.bootstrap_resamples), confidence=float(metrics_cfg.confidence),
                seed=int(metrics_cfg.bootstrap_seed))
    out: dict = {"problems": {role: len(recs) for role, recs in records_by_role.items()}}
    values = {role: values_fn(recs, ks, float(metrics_cfg.correct_threshold))
              for role, recs in records_by_role.items()}
    for role, metrics in values.items():
        out[role] = {}
        for name, vals in metrics.items():
            ci = bootstrap_ci(vals, **boot)
            out[role][name] = {"value": ci.point, "low": ci.low, "high": ci.high}
    if "compare" in records_by_role:
        shared = sorted({r["id"] for r in records_by_role["model"]} & {r["id"] for r in records_by_role["compare"]})
        index = {role: {r["id"]: i for i, r in enumerate(recs)} for role, recs in records_by_role.items()}
        out["diff"] = {"problems": len(shared)}
        for name in values["model"].keys() & values["compare"].keys():
            a = values["model"][name][[index["model"][i] for i in shared]]  # (P,) paired by problem id
            b = values["compare"][name][[index["compare"][i] for i in shared]]  # (P,)
            d = paired_bootstrap_diff(a, b, **boot)
            out["diff"][name] = {"value": d.diff, "low": d.low, "high": d.high, "frac_positive": d.frac_positive}
        if shared and all("scores" in r for recs in records_by_role.values() for r in recs):
            out["support"] = support_changes([records_by_role["model"][index["model"][i]] for i in shared],
                                             [records_by_role["compare"][index["compare"][i]] for i in shared],
                                             float(metrics_cfg.correct_threshold))
    return out


def support_changes(model_records: list[dict], compare_records: list[dict], threshold: float) -> dict:
    """Crossover k (where the compare= model's pass@k reaches the model's) and solved-set changes from the
    compare= model to the model, over the same problems (rlx/evaluation/metrics.py). n: samples per problem."""
    def counts(records):
        return (np.array([len(r["scores"]) for r in records]),
                np.array([sum(s >= threshold for s in r["scores"]) for r in records]))

    (n_model, c_model), (n_compare, c_compare) = counts(model_records), counts(compare_records)
    samples = int(min(n_model.min(), n_compare.min())) if len(model_records) else 0
    crossover = crossover_k(n_model, c_model, n_compare, c_compare) if samples else None
    return {"samples": samples, "crossover_k": crossover, **solved_set_changes(c_model, c_compare)}


def _metric_order(name: str) -> tuple:
    kind, _, k = name.partition("@")
    order = {"greedy/accuracy": 0, "greedy/success": 0, "greedy/return": 1, "greedy/turns": 2, "success": 3, "return": 4,
             "turns": 5, "pass": 6, "maj": 7, "mean": 8}
    return (order.get(kind, 9), int(k) if k.isdigit() else 0)


def render_table(summary: dict, labels: dict[str, str], confidence: float):
    """A rich Table: one row per benchmark and metric, value [low, high] per model and the difference."""
    from rich.table import Table

    pct = f"{confidence:.0%}"
    table = Table(title=f"rlx eval ({pct} bootstrap intervals over problems or environment tasks)")
    table.add_column("benchmark")
    table.add_column("metric")
    table.add_column(labels["model"], justify="right")
    if "compare" in labels:
        table.add_column(labels["compare"], justify="right")
        table.add_column("difference (paired)", justify="right")
        table.add_column("P(diff>0)", justify="right")

    def cell(entry):
        return f"{entry['value']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"

    for bench, result in summary["benchmarks"].items():
        for i, name in enumerate(sorted(result["model"], key=_metric_order)):
            row = [bench if i == 0 else "", name, cell(result["model"][name])]
            if "compare" in labels:
                diff = result["diff"].get(name)
                row += [cell(result["compare"][name]) if name in result["compare"] else "-",
                        f"{diff['value']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]" if diff else "-",
                        f"{diff['frac_positive']:.3f}" if diff else "-"]
            table.add_row(*row)
    return table


def support_lines(summary: dict, labels: dict[str, str]) -> list[str]:
    """One line per benchmark with compare=: the crossover k and the solved-set changes (support_changes)."""
    lines = []
    for bench, result in summary["benchmarks"].items():
        support = result.get("support")
        if not support or not support["samples"]:
            continue
        k = support["crossover_k"]
        crossing = (f"{labels['compare']} reaches {labels['model']}'s pass@k at k = {k}" if k is not None else
                    f"{labels['model']} stays ahead up to k = {support['samples']}")
        lines.append(f"{bench}: {crossing}; solved at least once in {support['samples']} samples: by {labels['model']} only "
                     f"{support['expand']} (expand), by {labels['compare']} only {support['shrink']} (shrink), "
                     f"both {support['both']}, neither {support['neither']}")
    return lines


def _k_ticks(ax, ks: list[int]) -> None:
    """Ticks at the plotted k, written 1, 2, 4 (not 2^0, 2^1, 2^2)."""
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()


def plot_pass_at_k(summary: dict, labels: dict[str, str], path: Path) -> Path | None:
    """pass@k against k (log2 axis) with interval bars, one panel per benchmark."""
    panels = [(b, r) for b, r in summary["benchmarks"].items() if any(m.startswith("pass@") for m in r["model"])]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paired = any(any(m.startswith("pass@") for m in r.get("diff", {})) for _, r in panels)
    fig, axes = plt.subplots(2 if paired else 1, len(panels), figsize=(5 * len(panels), 7.5 if paired else 4),
                             squeeze=False)
    for column, (bench, result) in enumerate(panels):
        diff = sorted((int(m.split("@")[1]), e) for m, e in result.get("diff", {}).items() if m.startswith("pass@"))
        if paired and diff:  # compare=: the paired difference model - compare, with its interval
            ax = axes[1][column]
            mid = np.array([e["value"] for _, e in diff])
            err = np.array([[e["value"] - e["low"] for _, e in diff], [e["high"] - e["value"] for _, e in diff]])
            ax.errorbar([k for k, _ in diff], mid, yerr=err, marker="o", capsize=3, color="C2",
                        label=f"{labels['model']} - {labels['compare']}")
            ax.axhline(0.0, color="grey", linewidth=1)
            ax.set_xscale("log", base=2)
            _k_ticks(ax, [k for k, _ in diff])
            ax.set_xlabel("k")
            ax.set_ylabel("paired difference in pass@k")
            ax.set_title(f"{bench}: paired difference ({result['diff']['problems']} problems)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        elif paired:
            axes[1][column].axis("off")
        ax = axes[0][column]
        for role in ("model", "compare"):
            if role not in result:
                continue
            points = sorted((int(m.split("@")[1]), e) for m, e in result[role].items() if m.startswith("pass@"))
            ks = [k for k, _ in points]
            mid = np.array([e["value"] for _, e in points])
            err = np.array([[e["value"] - e["low"] for _, e in points], [e["high"] - e["value"] for _, e in points]])
            ax.errorbar(ks, mid, yerr=err, marker="o", capsize=3, label=labels[role])
        ax.set_xscale("log", base=2)
        _k_ticks(ax, ks)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k")
        ax.set_title(bench)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with writing(path, "the pass@k plot", partial=path, optional="plots"):  # optional: summary.json holds the numbers
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=100)
            return path
    finally:
        plt.close(fig)
    return None


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def check_settings(cfg: DictConfig) -> None:
    from rlx.config.schema import check_config

    check_config(cfg, "eval")  # types, ranges and choices of every knob (rlx/config/schema.py), one line naming it
    sampling = cfg.sampling
    if sampling.n < 0 or (sampling.n == 0 and not sampling.greedy):
        raise UserError(f"sampling.n={sampling.n} with sampling.greedy={sampling.greedy} generates nothing; "
                        "set sampling.n >= 1 or sampling.greedy=true")
    if sampling.batch_size < 1:
        raise UserError(f"sampling.batch_size={sampling.batch_size} must be at least 1")
    if not cfg.benchmark and not cfg.get("env"):
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
        raise UserError(f"resume={out_dir}: {saved} is damaged ({first}); the evaluation cannot be resumed as it was") from None
    if not isinstance(old, DictConfig) or "sampling" not in old or "metrics" not in old:
        raise UserError(f"resume={out_dir}: {saved} was not written by rlx eval (a training run?); give a directory "
                        "written by rlx eval, or evaluate a training run with run=<run>")
    old.resume = str(out_dir)
    old.progress = cfg.progress
    return old


def _environment(cfg: DictConfig):
    """(results folder name, environment factory, number of tasks) when env= is set, else None."""
    env_cfg = cfg.get("env")
    if not env_cfg:
        return None
    from rlx.envs import env_factory
    from rlx.errors import EnvError

    try:
        factory = env_factory(env_cfg.name, env_cfg.get("target"), env_cfg.get("kwargs"))
    except EnvError as exc:
        raise UserError(str(exc)) from None
    label = str(env_cfg.target).rpartition(".")[2] if env_cfg.name == "custom" else env_cfg.name
    return f"env_{label}", factory, int(cfg.limit or env_cfg.eval_episodes)


def _run_environment(run: str):
    """The `env` config a training run played (its config.yaml), or None (not an agent run)."""
    saved = Path(run).expanduser() / "config.yaml"
    if not saved.is_file():
        return None
    env = OmegaConf.load(saved).get("env")
    if env:
        log.info("run=%s trained on env=%s: evaluating held-out episodes of it (benchmark=... evaluates benchmarks)",
                 run, env.name)
    return env or None


def _hf_generator(model, tokenizer, sampling, logprobs: bool = True):
    from rlx.rollout.generator import HFGenerator

    return HFGenerator(model, tokenizer, temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                       top_k=int(sampling.top_k), batch_size=int(sampling.batch_size), logprobs=logprobs)


def evaluate(cfg: DictConfig, out_dir: Path, overrides: list[str]) -> dict:
    """Evaluate according to cfg, writing everything into out_dir. Returns summary.json's content."""
    from rich.console import Console

    from rlx.runtime.rundir import write_run_files

    if cfg.resume:
        cfg = _saved_config(out_dir, cfg)
    else:
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    check_settings(cfg)
    if cfg.get("env") and any(o.lstrip("+~").startswith("benchmark") for o in overrides):
        raise UserError("env= evaluates an environment instead of benchmarks; evaluate benchmark= in a separate run")
    if cfg.hardware.num_threads:
        torch.set_num_threads(cfg.hardware.num_threads)
    from rlx.config.rules import check_device

    check_device(cfg.hardware)  # hardware=gpu never falls back to the CPU silently
    device = torch.device("cpu" if cfg.hardware.cpu else "cuda")
    if not cfg.resume:
        write_run_files(out_dir, cfg, overrides)
    if cfg.run and not cfg.get("env") and not any(o.lstrip("+~").startswith("benchmark") for o in overrides):
        cfg.env = _run_environment(cfg.run)  # an agent run: its own environment, unless benchmark= is given
    environment = _environment(cfg)  # (name, factory, tasks) with env=, else None
    benchmarks = [] if environment else [Benchmark(name, OmegaConf.to_container(spec, resolve=True))
                                         for name, spec in cfg.benchmark.items()]
    problems = {b.name: b.load(cfg.limit) for b in benchmarks}
    subjects = {"model": resolve_run(cfg.run, cfg.checkpoint) if cfg.run else (cfg.model.path, cfg.model.path)}
    if cfg.compare:
        subjects["compare"] = resolve_compare(str(cfg.compare), cfg.run, cfg.checkpoint)
    labels = {role: label for role, (_, label) in subjects.items()}
    if len(set(labels.values())) < len(labels):
        labels["compare"] += " (compare)"
    log.info("eval directory: %s", out_dir)
    records: dict[str, dict[str, list[dict]]] = {b.name: {} for b in benchmarks}
    if environment:
        records[environment[0]] = {}
    for role, (path, _) in subjects.items():
        model, tokenizer = load_model(path, cfg.model, device)
        log.info("%s: %s (%.2fM parameters) on %s", role, path, sum(p.numel() for p in model.parameters()) / 1e6, device)
        engine = build_engine(cfg.rollout, model, tokenizer, int(cfg.seed))  # None: generate with the model
        if engine is not None:  # generate_ids samples with these knobs
            engine.sampling = {"temperature": float(cfg.sampling.temperature), "top_p": float(cfg.sampling.top_p),
                               "top_k": int(cfg.sampling.top_k)}
        if environment:
            name, factory, tasks = environment
            records[name][role] = run_environment(
                engine or _hf_generator(model, tokenizer, cfg.sampling), tokenizer, cfg.env, factory, tasks,
                out_dir / name / f"{role}.jsonl", cfg.sampling, chat_template=bool(cfg.model.chat_template),
                seed=int(cfg.seed), label=f"{name} {role}", progress=cfg.progress,
                stop_ids=engine.stop_ids if engine is not None else eos_ids(model, tokenizer))
        for bench in benchmarks:
            records[bench.name][role] = run_benchmark(
                model, tokenizer, bench, problems[bench.name], out_dir / bench.name / f"{role}.jsonl", cfg.sampling,
                chat_template=bool(cfg.model.chat_template), seed=int(cfg.seed), label=f"{bench.name} {role}",
                progress=cfg.progress, engine=engine,
            )
        if engine is not None:
            engine.close()
        del model, engine
    summary = {
        "models": {role: {"path": path, "label": label} for role, (path, label) in subjects.items()},
        "sampling": OmegaConf.to_container(cfg.sampling),
        "benchmarks": {name: summarize(by_role, cfg.metrics, per_task_values if environment else per_problem_values)
                       for name, by_role in records.items()},
    }
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2), "the evaluation summary (summary.json)")
    console = Console(record=True, width=160)
    console.print(render_table(summary, labels, float(cfg.metrics.confidence)))
    for line in support_lines(summary, labels):
        console.print(line)
    atomic_write_text(out_dir / "summary.txt", console.export_text(), "the evaluation summary (summary.txt)")
    if cfg.plot:
        plot_pass_at_k(summary, labels, out_dir / "plots" / "pass_at_k.png")
    log.info("results: %s", out_dir)
    return summary


def headline(summary: dict) -> float | None:
    """The number a sweeper optimizes: greedy accuracy (else pass@1) of the first benchmark; with env=:
    greedy success (else success)."""
    for result in summary["benchmarks"].values():
        for name in ("greedy/accuracy", "greedy/success", "pass@1", "success"):
            if name in result["model"]:
                return result["model"][name]["value"]
    return None


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base="1.3")
def eval_app(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        summary = evaluate(cfg, out_dir, list(hydra_cfg.overrides.task))
    except UserError as exc:
        fail(str(exc))
    except StorageError as exc:  # finished problems stay in the results files; resume generates only the rest
        if (out_dir / "config.yaml").is_file():
            exc.survived = f"the problems already scored stay in {out_dir}/*/*.jsonl"
            exc.command = f"rlx eval resume={out_dir}"
        else:
            exc.survived = "nothing was evaluated yet"
        fail(str(exc), code=3)
    return headline(summary)
