"""Greedy held-out evaluation of a policy on task rows during training (eval/accuracy, eval/reward, ...), decoded
through the Generator protocol (rlx/engines/generator.py), so it honours rollout.backend (rlx/fleet/backends.py
eval_generator)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.engines.generator import Draw, sample_rollout
from rlx.rewards import RewardComponent, TrainerState, compute_rewards, token_lists
from rlx.rollout.prompts import format_prompts
from rlx.runtime.parallel import gather, global_sum


def eval_shard(count: int, acc) -> tuple[slice, int]:
    """This process's rows of an evaluation split over all processes: a contiguous block of
    ceil(count / N) rows (the last blocks shorter or empty), and how many copies of a row pad it to
    that size, so every process generates the same number of rows (the same collectives under ZeRO-3)
    and the gathered blocks start with the `count` real rows in order."""
    processes = acc.num_processes if acc is not None else 1
    rank = acc.process_index if acc is not None else 0
    per = -(-count // processes)
    lo, hi = min(count, rank * per), min(count, (rank + 1) * per)
    return slice(lo, hi), per - (hi - lo)


@dataclass(frozen=True)
class TaskEvalSettings:
    """How held-out task rows are evaluated: the reward component read as accuracy, the prompt format (chat
    template, system prompt), the greedy generation's budget and batch size (the rows the policy decodes at a time
    when it decodes itself: rlx.engines.generator.eval_policy_generator), what a failing reward does
    (reward.on_error), and the run's step count (the reward functions' `trainer_state.max_steps`)."""

    accuracy_key: str
    use_chat_template: bool
    system_prompt: str | None
    max_new_tokens: int
    batch_size: int
    on_error: str = "raise"
    max_steps: int = 0


@torch.no_grad()
def evaluate(generator, tokenizer, rows: list[dict], rewards: list[RewardComponent], settings: TaskEvalSettings, *,
             acc=None, step: int = 0) -> tuple[dict, list[dict]]:
    """Greedy completions of `generator` (the Generator protocol: the policy itself, a vLLM engine or server) on
    held-out rows; returns eval/* metrics and per-row records. Reward functions get `trainer_state` with the
    training step being evaluated (global_step=step) and the run's max_steps. The rows' seeds are drawn from the
    torch RNG (greedy rows do not use them), as rlx.engines.hf.generate drew them before evaluation went through
    the generator: the run's RNG state (saved in checkpoints) moves as it did.

    With several processes (acc), every process generates its block of the rows (eval_shard) and the
    per-row results are gathered, so each process returns the metrics of all rows; the records are
    this process's rows (the main process's are the first ones)."""
    accuracy_key, system_prompt = settings.accuracy_key, settings.system_prompt
    mine, padding = eval_shard(len(rows), acc)
    rows = rows[mine] + rows[:1] * padding if rows else rows
    prompts = format_prompts(tokenizer, rows, settings.use_chat_template, system_prompt)
    seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
    rollout = sample_rollout(generator, tokenizer, prompts, Draw(1, settings.max_new_tokens, greedy=True), seeds)
    total, per_component, _ = compute_rewards(rewards, prompts, rollout.texts, rows, settings.on_error,
                                              system_prompt=system_prompt,
                                              completion_ids=token_lists(rollout.completion_ids,
                                                                         rollout.completion_mask),
                                              state=TrainerState(global_step=step, max_steps=settings.max_steps))
    lengths, truncated = rollout.lengths.float(), rollout.truncated.float()
    local = {"total": total, "lengths": lengths, "truncated": truncated,
             **{f"component/{k}": v for k, v in per_component.items()}}
    if acc is not None and acc.num_processes > 1:  # (N x block,) -> the `count` real rows, in order
        count = int(global_sum(acc, mine.stop - mine.start))
        local = {name: gather(acc, values.float())[:count] for name, values in local.items()}
    total, lengths, truncated = local["total"], local["lengths"], local["truncated"]
    scores = {name[len("component/"):]: values for name, values in local.items() if name.startswith("component/")}
    metrics = {
        "eval/accuracy": torch.nan_to_num(scores[accuracy_key], nan=0.0).mean().item(),
        "eval/reward": total.mean().item(),
        "eval/mean_length": lengths.mean().item(),
        "eval/truncated_frac": truncated.mean().item(),
    }
    for name, values in scores.items():
        metrics[f"eval/{name}"] = torch.nan_to_num(values, nan=0.0).mean().item()
    real = mine.stop - mine.start
    records = [
        {"prompt": row["prompt"], "answer": row.get("answer"), "completion": text,
         "score": per_component[accuracy_key][i].item()}
        for i, (row, text) in enumerate(zip(rows[:real], rollout.texts[:real]))
    ]
    return metrics, records


def task_evaluator(acc, generator, tokenizer, rows: list[dict], rewards: list[RewardComponent],
                   settings: TaskEvalSettings):
    """run_eval(step) -> metrics: greedy evaluation through `generator` (rlx.fleet.backends.eval_generator: the
    policy itself under rollout=hf, else the engine or server holding the published weights) on held-out `rows`
    (settings: task_eval_settings(settings))."""

    def run_eval(step: int) -> dict:
        metrics, _ = evaluate(generator, tokenizer, rows, rewards, settings, acc=acc, step=step)
        return metrics

    return run_eval


def task_eval_settings(settings) -> TaskEvalSettings:
    """The TaskEvalSettings of `evaluate` from the typed settings of `rlx train` (the same for every loop)."""
    return TaskEvalSettings(accuracy_key=settings.reward.accuracy, use_chat_template=settings.model.chat_template,
                            system_prompt=settings.data.system_prompt, max_new_tokens=settings.eval.max_new_tokens,
                            batch_size=settings.eval.batch_size, on_error=settings.reward.on_error,
                            max_steps=settings.steps)
