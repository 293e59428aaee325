"""Micro-batches of a mini-batch: a fixed count of sequences (micro_batch_size) or a token budget (micro_batch_tokens).

A training forward over a micro-batch costs about rows x (longest prompt + longest completion) token
positions: the micro-batch is trimmed to its own widths (models/forward.py trim_padding), not the step's.
With completions of very different lengths a fixed row count gives micro-batches of very different cost
(and peak memory); a token budget instead packs rows, in their order, while

    rows x (max prompt length + max completion length) <= micro_batch_tokens

(a single row above the budget gets a micro-batch of its own). The loss normalisers stay those of the
whole mini-batch (algorithms/losses.py aggregate), so the gradient is the same sum however the rows are
split. Processes must run the same number of micro-batches (each backward's all-reduce is a collective):
every process takes the largest count over processes and splits its largest micro-batches until it has it.
"""

from __future__ import annotations

import torch


def token_budget_split(prompt_lengths: list[int], completion_lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive runs of row positions whose padded cost rows x (max prompt + max completion) stays within
    `budget`; a row costing more than the budget alone forms its own run. Order is kept (the G samples of a
    prompt stay adjacent, so the forward still encodes their prompt once). Returns lists of positions."""
    runs, current, longest_prompt, longest_completion = [], [], 0, 0
    for i, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
        lp, lc = max(longest_prompt, p), max(longest_completion, c)
        if current and (len(current) + 1) * (lp + lc) > budget:
            runs.append(current)
            current, lp, lc = [], p, c
        current.append(i)
        longest_prompt, longest_completion = lp, lc
    if current:
        runs.append(current)
    return runs


def split_to_count(runs: list[list[int]], count: int, cost) -> list[list[int]]:
    """Split the costliest run (cost(run) -> number) in two halves until there are `count` runs (needs at
    least `count` rows in all). Used so that every process runs the same number of micro-batches."""
    runs = [list(r) for r in runs]
    while len(runs) < count:
        splittable = [i for i, r in enumerate(runs) if len(r) > 1]
        if not splittable:
            raise ValueError(f"{sum(len(r) for r in runs)} rows cannot fill {count} micro-batches")
        worst = max(splittable, key=lambda i: cost(runs[i]))
        run = runs.pop(worst)
        half = len(run) // 2
        runs[worst:worst] = [run[:half], run[half:]]
    return runs


def plan_micro_batches(indices: torch.Tensor, prompt_mask: torch.Tensor, completion_mask: torch.Tensor,
                       micro_batch_size: int, micro_batch_tokens: int | None, count_all=None) -> list[torch.Tensor]:
    """The micro-batches (index tensors into the rollout) of one mini-batch `indices` (n,).

    micro_batch_tokens None: consecutive chunks of micro_batch_size rows. Else token_budget_split on the
    rows' prompt and completion lengths (prompt_mask, completion_mask: (N, P), (N, C) of the whole
    rollout), then split_to_count to `count_all(local count)`, the count every process agrees on (None:
    one process)."""
    if micro_batch_tokens is None:
        return [indices[lo : lo + micro_batch_size] for lo in range(0, len(indices), micro_batch_size)]
    prompts = prompt_mask[indices].sum(dim=1).tolist()
    completions = completion_mask[indices].sum(dim=1).tolist()
    runs = token_budget_split(prompts, completions, micro_batch_tokens)
    if count_all is not None:
        runs = split_to_count(runs, count_all(len(runs)),
                              lambda run: len(run) * (max(prompts[i] for i in run) + max(completions[i] for i in run)))
    return [indices[torch.tensor(run, dtype=torch.long)] for run in runs]
