"""Hints for all-fail groups (algorithm.hints; Guide / SEELE, seed listing 003): a group that still fails entirely
is re-sampled with a hint, a prefix of the row's reference solution whose length is annealed, and the re-samples join
their group (groups are keyed by id, so sizes differ).

Guide ("Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models"): when all G samples of a prompt x
fail, re-sample from x + h (h a hint in the context) and train those samples with the importance ratio taken in the
PLAIN context,
    ratio_t = pi_theta(y_t | x, y_<t) / pi_old(y_t | x + h, y_<t),
so the update improves the no-hint policy used at test time. placement=prompt puts the hint in the user message and
trains the completion in the plain context (the hinted rows as sampled go to ScoredDraw.context, the ratio's
denominator);
placement=prefix continues from the plain prompt + the prefix tokens, and the prefix is not trained. SEELE ("Staying
in the Sweet Spot") makes the hint a prefix of the reference solution whose length is tuned; rlx anneals the fraction
linearly (SEELE fits an item-response curve per problem instead: not built). Rows with no usable reference are left
alone (their group keeps its zero advantage).

Metrics: hints/all_fail_groups, hints/hinted_groups, hints/rescued_frac (all-fail groups rescued: a hinted
re-sample correct), hints/fraction (the mean share of the solution given).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from rlx.algorithms.grouping import dense_ids, group_all
from rlx.algorithms.shaping import correct_from_accuracy
from rlx.engines.generator import completion_texts
from rlx.engines.records import Generation, Rollout
from rlx.engines.sampling import sample_seed
from rlx.rollout.prompts import format_prompts
from rlx.rollout.stages.base import STAGES, ScoredDraw, Stage, StageContext, StageSettings, ratio
from rlx.rollout.types import HintedContext, SameContext

# hint re-samples draw with sample_seed(seed, step, HINT_INDEX + ...): apart from the plain samples
HINT_INDEX = 1 << 30


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


def hinted_message(user_message: str, hint: str, template: str) -> str:
    """The user message of the hinted context x + h."""
    return template.format(prompt=user_message, hint=hint)


class Hints(Stage):
    name = "hints"

    def __init__(self, hints, accuracy_key: str):
        self.hints, self.accuracy_key = hints, accuracy_key
        self.all_fail, self.fraction_sum, self.draws = 0.0, 0.0, 0.0
        self.hinted_groups, self.rescued, self.samples = 0.0, 0.0, 0.0

    def after_scoring(self, part: ScoredDraw, ctx: StageContext, first_index: int) -> ScoredDraw:
        hints = self.hints
        fraction = hint_fraction(ctx.step, hints.fraction_start, hints.fraction_end, hints.anneal_steps)
        chosen, all_fail = self.chosen_groups(part, ctx, fraction)
        self.all_fail += float(all_fail)
        self.fraction_sum += float(fraction)
        self.draws += 1.0
        if not chosen:
            return part
        trained, behaviour, contexts_rows = self.resample(part, ctx, chosen)
        rows, prompts, groups = contexts_rows
        total, components, errors = ctx.score(prompts, trained, rows)
        correct = correct_from_accuracy(components[self.accuracy_key])
        self.hinted_groups += float(len(chosen))
        self.rescued += float(int(torch.unique(groups[correct]).numel()))
        self.samples += float(len(rows))
        pad = ctx.tokenizer.pad_token_id
        if behaviour is not None:  # placement=prompt: the re-samples were sampled after the hinted prompt
            context = HintedContext(Rollout.cat([part.behaviour, behaviour], pad))
        elif isinstance(part.context, HintedContext):
            context = HintedContext(Rollout.cat([part.context.rollout, trained], pad))
        else:
            context = SameContext()
        merged = ScoredDraw(Rollout.cat([part.rollout, trained], pad),
                       torch.cat([part.rewards, total.to(part.rewards.dtype)]),
                       {k: torch.cat([v, components[k]]) for k, v in part.components.items()}, part.rows + rows,
                       part.prompts + prompts, torch.cat([part.groups, groups]), torch.cat([part.correct, correct]),
                       torch.cat([part.first_correct, correct]), context,
                       torch.cat([part.hinted, torch.ones(len(rows), dtype=torch.bool)]), part.errors + errors)
        order = torch.sort(merged.groups, stable=True).indices  # each group's hinted rows right after its own
        return merged.select(order)

    def chosen_groups(self, part: ScoredDraw, ctx: StageContext, fraction: float) -> tuple[list, int]:
        """(dense group, first row, prefix ids) of each all-fail group with a reference solution, in order of first
        appearance; and the number of all-fail groups."""
        hints = self.hints
        failed = group_all(~part.correct.bool(), part.groups)  # (n,)
        index, count = dense_ids(part.groups)
        first_rows = torch.full((count,), len(part.rows), dtype=torch.long).scatter_reduce(
            0, index, torch.arange(len(part.rows)), reduce="amin")
        chosen = []
        for dense in torch.argsort(first_rows).tolist():
            row = int(first_rows[dense])
            if not bool(failed[row]):
                continue
            solution = reference_solution(part.rows[row], hints.source, hints.column, ctx.completion_template)
            ids = ctx.tokenizer(solution, add_special_tokens=False)["input_ids"] if solution is not None else None
            prefix = hint_prefix(ids, fraction)
            if prefix is not None:
                chosen.append((dense, row, prefix))
        return chosen, int(torch.unique(part.groups[failed]).numel())

    def resample(self, part: ScoredDraw, ctx: StageContext, chosen: list):
        """The hinted re-samples of the chosen groups: the rows trained (plain prompt; placement=prefix: prefix
        not trained), their behaviour rows (placement=prompt: the hinted prompt; else None), and each re-sample's
        data row, rendered plain prompt and group id."""
        hints, samples, pad = self.hints, self.hints.samples, ctx.tokenizer.pad_token_id
        rollout = part.rollout
        plain_ids = [rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist() for _, row, _ in chosen]
        seeds = [sample_seed(ctx.seed, ctx.step, HINT_INDEX + int(part.groups[row]) * samples + j)
                 for _, row, _ in chosen for j in range(samples)]
        if hints.placement == "prompt":  # Guide: the hint in the user message; trained in the plain context
            hinted_rows = [_with_hint(part.rows[row], ctx.tokenizer.decode(prefix), hints.template)
                           for _, row, prefix in chosen]
            texts = format_prompts(ctx.tokenizer, hinted_rows, ctx.use_chat_template, ctx.system_prompt)
            contexts = ctx.tokenizer(texts, add_special_tokens=False)["input_ids"]
            budget = ctx.max_new_tokens
        else:  # "prefix": continuation from a token prefix (the plain prompt + the first tokens of the solution)
            contexts = [ids + prefix for ids, (_, _, prefix) in zip(plain_ids, chosen)]
            budget = max(1, ctx.max_new_tokens - max(len(prefix) for _, _, prefix in chosen))
        out = ctx.generator.generate_ids(contexts, max_new_tokens=budget, seeds=seeds, samples_per_prompt=samples,
                                         min_new_tokens=min(ctx.min_new_tokens, budget), schedule=ctx.schedule)
        prefixes = [prefix for _, _, prefix in chosen for _ in range(samples)]
        if hints.placement == "prefix":  # the row's completion holds the prefix (not trained) and the continuation
            out = Generation([p + ids for p, ids in zip(prefixes, out.ids)],
                             [[0.0] * len(p) + lp for p, lp in zip(prefixes, out.logprobs)]
                             if out.logprobs is not None else None,
                             out.stopped)
        texts = completion_texts(ctx.tokenizer, out.ids)
        version = ctx.generator.version
        trained = Rollout.from_ids(plain_ids, out, samples, pad, texts, version=version)
        skip = [len(p) for p in prefixes] if hints.placement == "prefix" else [0] * len(prefixes)
        trained = _mask_prefixes(trained, skip, ctx.schedule)
        behaviour = None
        if hints.placement == "prompt":  # the same completions after the hinted prompt: old and sampler log-probs
            behaviour = Rollout.from_ids(contexts, out, samples, pad, texts, version=version)
            behaviour = replace(behaviour, temperatures=trained.temperatures)
        rows = [part.rows[row] for _, row, _ in chosen for _ in range(samples)]
        prompts = [part.prompts[row] for _, row, _ in chosen for _ in range(samples)]
        groups = torch.tensor([int(part.groups[row]) for _, row, _ in chosen for _ in range(samples)], dtype=torch.long)
        return trained, behaviour, (rows, prompts, groups)

    def after_step(self, parts: list[ScoredDraw], step: int) -> dict:
        metrics = {"hints/all_fail_groups": self.all_fail, "hints/hinted_groups": self.hinted_groups,
                   "hints/rescued_frac": ratio(self.rescued, self.all_fail),  # all-fail groups rescued
                   "hints/fraction": ratio(self.fraction_sum, self.draws)}
        self.all_fail, self.fraction_sum, self.draws = 0.0, 0.0, 0.0
        self.hinted_groups, self.rescued, self.samples = 0.0, 0.0, 0.0
        return metrics


def _mask_prefixes(trained: Rollout, skip: list[int], schedule: list[float] | None) -> Rollout:
    """The record with each row's first skip[r] completion tokens (the hint prefix) left out of the loss; with a
    temperature schedule, the continuation's position t was drawn at schedule[t] (the prefix at 1)."""
    loss_mask = trained.completion_mask.clone()
    for r, n in enumerate(skip):
        loss_mask[r, :n] = 0
    taus = trained.temperatures
    if schedule is not None:
        width = trained.completion_ids.shape[1]
        taus = torch.ones(len(trained), width)
        for r, n in enumerate(skip):
            length = int(trained.completion_mask[r].sum()) - n
            taus[r, n : n + length] = torch.tensor(schedule[:length], dtype=torch.float32)
    return replace(trained, loss_mask=loss_mask, step_index=torch.where(loss_mask.bool(), 0, -1), temperatures=taus)


def _with_hint(row: dict, hint: str, template: str) -> dict:
    """The data row with the hint in its user message (a chat list: in its last user message)."""
    prompt = row["prompt"]
    if isinstance(prompt, list):
        messages = [dict(m) for m in prompt]
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last]["content"] = hinted_message(messages[last]["content"], hint, template)
        return dict(row, prompt=messages)
    return dict(row, prompt=hinted_message(prompt, hint, template))


@STAGES.register("hints")
def hints(settings: StageSettings) -> Hints | None:
    return Hints(settings.algo.hints, settings.accuracy_key) if settings.algo.hints.enabled else None
