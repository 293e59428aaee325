"""Hints for all-fail groups (Guide / SEELE family, seed listing 003), the parts that need no loop:
which groups get a hint, the hint itself (a prefix of the row's reference solution, its length annealed),
the hinted user message, and the two prompt contexts of a hinted row.

Guide ("Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models"):
when all G samples of a prompt x fail, re-sample from x + h (h a hint in the context) and train those
samples with the importance ratio taken in the PLAIN context,
    ratio_t = pi_theta(y_t | x, y_<t) / pi_old(y_t | x + h, y_<t),
so the update improves the no-hint policy used at test time. SEELE ("Staying in the
Sweet Spot") makes the hint a prefix of the reference solution whose length is tuned; rlx anneals the
fraction linearly (SEELE fits an item-response curve per problem instead: not built). Rows with no
usable reference are left alone (their group keeps its zero advantage).
"""

from __future__ import annotations

import math

import torch

from rlx.algorithms.grouping import group_all

DEFAULT_TEMPLATE = "{prompt}\nHint: the solution begins with: {hint}"


def hint_fraction(step: int, start: float, end: float, anneal_steps: int) -> float:
    """The hinted share of the reference solution at a training step: linear from `start` at step 0 to
    `end` at `anneal_steps`, then `end` (anneal_steps 0: `end` throughout). Example: 0.8 -> 0.2 over 100
    steps gives 0.5 at step 50."""
    if anneal_steps <= 0 or step >= anneal_steps:
        return float(end)
    return float(start) + (float(end) - float(start)) * step / anneal_steps


def reference_solution(row: dict, source: str, column: str | None = None,
                       completion_template: str | None = None) -> str | None:
    """The text a hint is cut from, or None when the row has none:
      source "column": row[column] (e.g. a worked solution);
      source "answer": completion_template formatted with row["answer"] (chain_sum: "<answer>12</answer>")."""
    if source == "column":
        text = row.get(column) if column else None
    elif source == "answer":
        answer = row.get("answer")
        text = None if answer is None or completion_template is None else completion_template.format(answer=answer)
    else:
        raise ValueError(f"unknown hint source '{source}'; valid choices: column, answer")
    return text if isinstance(text, str) and text.strip() else None


def hint_prefix(solution_ids: list[int] | None, fraction: float) -> list[int] | None:
    """The first ceil(fraction * n) tokens of the tokenized reference solution (at least one when the
    fraction is positive, never more than n). None when there is no solution, or the fraction is 0
    (no hint: the row is left alone). Example: 10 tokens, fraction 0.25 -> the first 3."""
    if not solution_ids or fraction <= 0:
        return None
    keep = min(len(solution_ids), max(1, math.ceil(fraction * len(solution_ids))))
    return list(solution_ids[:keep])


def hinted_message(user_message: str, hint: str, template: str = DEFAULT_TEMPLATE) -> str:
    """The user message of the hinted context x + h."""
    return template.format(prompt=user_message, hint=hint)


def groups_to_hint(correct: torch.Tensor, groups: torch.Tensor, has_hint: torch.Tensor) -> torch.Tensor:
    """(N,) bool: samples of groups that failed entirely AND whose row has a usable hint (the trigger
    `all_fail`). correct, groups, has_hint: (N,)."""
    return group_all(~correct.bool(), groups) & has_hint.bool()


def rescued_fraction(hinted_correct: torch.Tensor, hinted_groups: torch.Tensor) -> float:
    """Mechanism metric: the fraction of hinted (all-fail) groups in which some hinted re-sample is correct."""
    if hinted_groups.numel() == 0:
        return 0.0
    solved = torch.unique(hinted_groups[hinted_correct.bool()])
    return solved.numel() / torch.unique(hinted_groups).numel()


def _left_pad(ids: torch.Tensor, mask: torch.Tensor, width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    missing = width - ids.shape[1]
    if missing <= 0:
        return ids, mask
    return (torch.cat([torch.full((ids.shape[0], missing), pad_id, dtype=ids.dtype), ids], dim=1),
            torch.cat([torch.zeros((mask.shape[0], missing), dtype=mask.dtype), mask], dim=1))


def guide_contexts(plain_ids: torch.Tensor, plain_mask: torch.Tensor, hinted_ids: torch.Tensor,
                   hinted_mask: torch.Tensor, hinted: torch.Tensor, pad_id: int) -> dict[str, torch.Tensor]:
    """The two contexts of every row (left-padded prompts, (N, P) and (N, P')):
      policy_*    the PLAIN prompt of every row: the current policy's log-probs (the ratio's numerator)
      behaviour_* the prompt the sample was drawn from: hinted rows their hinted prompt, the others the
                  plain one: the old/sampler log-probs (the ratio's denominator, and TIS).
    hinted: (N,) bool. Returns {policy_ids, policy_mask, behaviour_ids, behaviour_mask}."""
    width = max(plain_ids.shape[1], hinted_ids.shape[1])
    plain_ids, plain_mask = _left_pad(plain_ids, plain_mask, width, pad_id)
    hinted_ids, hinted_mask = _left_pad(hinted_ids, hinted_mask, width, pad_id)
    chosen = hinted.bool().unsqueeze(1)
    return {"policy_ids": plain_ids, "policy_mask": plain_mask,
            "behaviour_ids": torch.where(chosen, hinted_ids, plain_ids),
            "behaviour_mask": torch.where(chosen, hinted_mask, plain_mask)}
