"""Micro-batches of a mini-batch: a fixed count of sequences (micro_batch_size, the default), rows grouped by length
(micro_batch_split=lengths) or a token budget (micro_batch_tokens).

A training forward over a micro-batch costs about rows x (longest prompt + longest completion) token
positions: the micro-batch is trimmed to its own widths (models/forward.py trim_padding), not the step's.
With completions of very different lengths a fixed row count gives micro-batches of very different cost
(and peak memory); a token budget instead packs rows, in their order, while

    rows x (max prompt length + max completion length) <= micro_batch_tokens

(a single row above the budget gets a micro-batch of its own). Grouped by length (length_split), rows of
similar length share a micro-batch, so less padding is computed and each pass holds fewer activations: at
SmolLM2-135M with natural lengths (4 x 8, up to 64 tokens) the update took the same time at 0.78x the peak memory
(benchmarks/update_step.py), at the 0.5B shape (2 x 4, up to 256) about the same time; not the default, since it gains
no time where rlx's benchmarks run. The loss normalisers stay those of the
whole mini-batch (algorithms/losses.py aggregate), so the gradient is the same sum however the rows are
split. Processes must run the same number of micro-batches (each backward's all-reduce is a collective):
every process takes the largest count over processes and splits its largest micro-batches until it has it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPLITS = ("rows", "lengths")


def parameter_count(model) -> int:
    """The policy's parameters, whole under sharding (ZeRO-3 keeps the full count in ds_numel; a DTensor's numel is
    the full tensor's)."""
    inner = getattr(model, "module", model)
    return sum(getattr(p, "ds_numel", p.numel()) for p in inner.parameters())


def pass_overhead(parameters: int) -> int:
    """The fixed cost of one more forward + backward, in the token positions that cost as much: 32 + 4e9 / parameters.

    A pass reads every weight again (~3 reads of 4 bytes against 6 FLOPs a weight a token: ~2 F / B ~ 20-30
    positions at a CPU's F = 200 GFLOP/s and B = 15-20 GB/s) and runs each layer's Python and autograd bookkeeping
    (~0.1 s a pass at 30 layers, ~4e9 / parameters positions at 6 x parameters FLOPs a position): at the 0.5B shape
    40 positions, at SmolLM2-135M 62, on the 0.9M-parameter tiny model ~4,500 (its batches are not split)."""
    return 32 + int(4e9 / max(parameters, 1))


@dataclass(frozen=True)
class MicroBatching:
    """How a mini-batch is cut into forward + backward passes: at most `size` rows each, in consecutive runs
    (split "rows", the default) or grouped by length (split "lengths", `overhead` token positions the cost of one
    more pass), or by a token budget (`tokens`, when set). Read once from the settings (`of`)."""

    size: int
    tokens: int | None
    split: str
    overhead: int

    @classmethod
    def of(cls, settings, parameters: int) -> MicroBatching:
        """micro_batch_overhead=null: pass_overhead(parameters)."""
        overhead = settings.micro_batch_overhead
        return cls(settings.micro_batch_size, settings.micro_batch_tokens, settings.micro_batch_split,
                   pass_overhead(parameters) if overhead is None else overhead)

    @property
    def varies(self) -> bool:
        """Whether the count of micro-batches changes from step to step (Accelerate is told it each step)."""
        return self.tokens is not None or self.split == "lengths"


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


def length_split(prompt_lengths: list[int], completion_lengths: list[int], max_rows: int,
                 overhead: int) -> list[list[int]]:
    """Rows grouped by length so that a micro-batch pads little: the positions sorted by (completion, prompt)
    length, then the contiguous split of that order that minimises

        sum over micro-batches b of  rows(b) x (max prompt(b) + max completion(b)) + overhead

    with at most `max_rows` rows each (dynamic programming over the sorted order, O(n x max_rows)). `overhead`: the
    fixed cost of one more forward + backward (reading every weight again), in token positions. Positions within a
    micro-batch are ascending, so the G samples of a prompt that land together stay adjacent (their prompt is
    encoded once). Micro-batches are returned by their first position. Returns lists of positions."""
    order = sorted(range(len(completion_lengths)), key=lambda i: (completion_lengths[i], prompt_lengths[i]))
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cheapest split of the first j sorted positions
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest_prompt = 0
        for i in range(j - 1, max(j - max_rows, 0) - 1, -1):  # the last micro-batch holds sorted positions i..j-1
            longest_prompt = max(longest_prompt, prompt_lengths[order[i]])
            cost = best[i] + (j - i) * (longest_prompt + completion_lengths[order[j - 1]]) + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], n
    while j > 0:
        runs.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return sorted(runs)


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
                       batching: MicroBatching, count_all=None) -> list[torch.Tensor]:
    """The micro-batches (index tensors into the rollout) of one mini-batch `indices` (n,).

    batching.tokens set: token_budget_split on the rows' prompt and completion lengths (prompt_mask,
    completion_mask: (N, P), (N, C) of the whole rollout); else split "lengths": length_split; else consecutive
    chunks of batching.size rows. A plan whose count varies is then split (split_to_count) to
    `count_all(local count)`, the count every process agrees on (None: one process)."""
    if not batching.varies:
        return [indices[lo : lo + batching.size] for lo in range(0, len(indices), batching.size)]
    prompts = prompt_mask[indices].sum(dim=1).tolist()
    completions = completion_mask[indices].sum(dim=1).tolist()
    if batching.tokens is not None:
        runs = token_budget_split(prompts, completions, batching.tokens)
    else:
        runs = length_split(prompts, completions, batching.size, batching.overhead)
    if count_all is not None:
        runs = split_to_count(runs, count_all(len(runs)),
                              lambda run: len(run) * (max(prompts[i] for i in run) + max(completions[i] for i in run)))
    return [indices[torch.tensor(run, dtype=torch.long)] for run in runs]
