"""Replay into collapsed groups (algorithm.replay; R^3 / Skywork's selective sample buffer): the samples of
informative groups go into a per-prompt buffer (rlx/rollout/replay.py, keyed by the rendered prompt); a group the
trigger calls collapsed gets the newest buffered sample of the missing kind in place of its last sample. The
buffer is checkpointed as "replay".

Metrics: replay/filled_frac (collapsed groups replayed into / collapsed groups), replay/groups_filled,
replay/buffer_size.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlx.algorithms.grouping import dense_ids, group_all
from rlx.engines.records import Generation, Rollout
from rlx.rollout.replay import TRIGGERS, ReplayBuffer, fill_buffer, replay_plan, sample_entries
from rlx.rollout.stages.base import STAGES, Round, Stage, StageContext, StageSettings, ratio


class Replay(Stage):
    name = "replay"

    def __init__(self, trigger: str, per_prompt: int, max_age: int):
        self.trigger = trigger
        self.buffer = ReplayBuffer(per_prompt, max_age)
        self.collapsed, self.filled = 0.0, 0.0

    def after_scoring(self, part: Round, ctx: StageContext, first_index: int) -> Round:
        keys = group_keys(part)
        plan = replay_plan(part.correct, part.groups, keys, self.buffer, ctx.step, self.trigger)
        rollout = part.rollout
        completions = [ids[mask.bool()].tolist() for ids, mask in zip(rollout.completion_ids, rollout.loss_mask)]
        logprobs = ([lp[mask.bool()].tolist() for lp, mask in zip(rollout.logprobs, rollout.loss_mask)]
                    if rollout.logprobs is not None else None)
        wanted = TRIGGERS[self.trigger](group_all(part.correct, part.groups), group_all(~part.correct, part.groups))
        self.collapsed += float(torch.unique(part.groups[wanted >= 0]).numel())  # groups the trigger asks a sample for
        entries = sample_entries(completions, part.rewards, part.correct, ctx.step, logprobs,
                                 truncated=rollout.truncated.tolist())
        fill_buffer(self.buffer, part.correct, part.groups, keys, entries)
        self.filled += float(len(plan))
        return put_back(part, plan, ctx.tokenizer.pad_token_id, ctx.tokenizer) if plan else part

    def after_step(self, parts: list[Round], step: int) -> dict:
        metrics = {"replay/filled_frac": ratio(self.filled, self.collapsed), "replay/groups_filled": self.filled,
                   "replay/buffer_size": len(self.buffer)}
        self.collapsed, self.filled = 0.0, 0.0
        return metrics

    def checkpointed(self) -> dict:
        return {"replay": self.buffer}


def put_back(part: Round, plan: list, pad: int, tokenizer) -> Round:
    """`part` with each planned (row, buffered entry) in place of that row: its completion, reward and verdict; the
    sampler's policy version is the one the entry was sampled with."""
    rollout = part.rollout
    prompt_ids = [rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist() for row, _ in plan]
    replayed = [entry for _, entry in plan]
    out = Generation([e.completion_ids for e in replayed],
                     [list(e.logprobs) for e in replayed] if all(e.logprobs is not None for e in replayed) else None,
                     [not e.truncated for e in replayed])
    texts = tokenizer.batch_decode([e.completion_ids for e in replayed], skip_special_tokens=True)
    fresh = Rollout.from_ids(prompt_ids, out, 1, pad, texts, [max(e.step - 1, 0) for e in replayed])  # its sampler
    if rollout.logprobs is not None and fresh.logprobs is None:
        fresh = replace(fresh, logprobs=torch.zeros(fresh.completion_ids.shape))
    merged = Rollout.cat([rollout, fresh], pad)
    order = torch.arange(len(rollout))
    rewards, correct = part.rewards.clone(), part.correct.clone()
    for position, (row, entry) in enumerate(plan):
        order[row] = len(rollout) + position
        rewards[row] = entry.reward
        correct[row] = entry.correct
    return replace(part, rollout=merged.select(order), rewards=rewards, correct=correct)


def group_keys(part: Round) -> list[str]:
    """The prompt key of each group, in order of first appearance (the rendered prompt)."""
    index, count = dense_ids(part.groups)
    first = torch.full((count,), len(part.prompts), dtype=torch.long).scatter_reduce(
        0, index, torch.arange(len(part.prompts)), reduce="amin")
    order = torch.argsort(first)
    return [part.prompts[int(first[g])] for g in order.tolist()]


@STAGES.register("replay")
def replay(settings: StageSettings) -> Replay | None:
    knobs = settings.algo.replay
    return Replay(knobs.trigger, knobs.per_prompt, knobs.max_age) if knobs.enabled else None
