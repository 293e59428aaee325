"""Replay into collapsed groups (algorithm.replay): a per-prompt buffer of informative past samples, mixed into
groups whose rewards tie (R^3's cross-context replay; Skywork R1V2's Selective Sample Buffer; seed listing 001).

The abstracts give the principle only; rlx's form (a reconstruction, docs/algorithms/seed-ideas.md):
  - after scoring, every group that was informative (not tied) stores its correct samples and its wrong
    samples under the prompt's key (the rendered prompt; the newest `per_prompt` of each kind);
  - a group that collapsed (all wrong, or all correct, per `trigger`) gets its LAST sample replaced by the
    newest buffered sample of the missing kind, if one is younger than `max_age` steps;
  - the loop re-scores nothing (the stored reward is kept), recomputes the old log-probs of replayed rows
    under the current policy (ratio 1 at the first epoch), and may weight them by TIS with the stored
    sampler log-probs.
The buffer round-trips through state_dict exactly (checkpointed with the run as "replay").

Metrics: replay/filled_frac (collapsed groups replayed into / collapsed groups), replay/groups_filled,
replay/buffer_size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from rlx.algorithms.grouping import dense_ids, group_all
from rlx.engines.records import Generation, Rollout
from rlx.registry import Registry, publish
from rlx.rollout.stages.base import STAGES, ScoredDraw, Stage, StageContext, StageSettings, ratio


@dataclass
class ReplayEntry:
    """One buffered sample: what the loop needs to put it back into a batch."""

    completion_ids: list[int]
    reward: float
    correct: bool
    step: int
    logprobs: list[float] | None = None  # the sampler's log-probs when it was drawn (TIS)
    truncated: bool = False  # the sample hit the generation budget (no stop token)


class ReplayBuffer:
    """key (the prompt: its text or row id, as a string) -> the newest `per_prompt` correct and wrong samples."""

    def __init__(self, per_prompt: int = 2, max_age: int = 200):
        self.per_prompt, self.max_age = per_prompt, max_age
        self.entries: dict[str, dict[str, list[ReplayEntry]]] = {}

    def add(self, key, entry: ReplayEntry) -> None:
        kinds = self.entries.setdefault(str(key), {"correct": [], "wrong": []})
        kept = kinds["correct" if entry.correct else "wrong"]
        kept.append(entry)
        del kept[: max(0, len(kept) - self.per_prompt)]

    def newest(self, key, correct: bool, step: int) -> ReplayEntry | None:
        """The newest buffered sample of that kind, if it is at most max_age steps old."""
        kept = self.entries.get(str(key), {}).get("correct" if correct else "wrong", [])
        if kept and step - kept[-1].step <= self.max_age:
            return kept[-1]
        return None

    def __len__(self) -> int:
        return sum(len(v) for kinds in self.entries.values() for v in kinds.values())

    def state_dict(self) -> dict:
        return {"per_prompt": self.per_prompt, "max_age": self.max_age,
                "entries": {key: {kind: [asdict(e) for e in kept] for kind, kept in kinds.items()}
                            for key, kinds in self.entries.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.per_prompt, self.max_age = int(state["per_prompt"]), int(state["max_age"])
        self.entries = {key: {kind: [ReplayEntry(**e) for e in kept] for kind, kept in kinds.items()}
                        for key, kinds in state["entries"].items()}


# which collapsed groups get a replayed sample, and of which kind:
# fn(all_correct (K,) bool, all_wrong (K,) bool) -> (K,) long: 1 = insert a correct sample, 0 = a wrong one, -1 = none
TRIGGERS = publish("replay_trigger", Registry("replay trigger"))
TRIGGERS.register("all_fail")(lambda all_correct, all_wrong: torch.where(all_wrong, 1, -1))
TRIGGERS.register("tied")(lambda all_correct, all_wrong: torch.where(all_wrong, 1, torch.where(all_correct, 0, -1)))


def _group_summary(correct: torch.Tensor, groups: torch.Tensor):
    """Per group (dense id): its position in order of first appearance, correct count, size, last row."""
    index, count = dense_ids(groups)
    rows = torch.arange(groups.numel())
    first = torch.full((count,), groups.numel(), dtype=torch.long).scatter_reduce(0, index, rows, reduce="amin")
    appearance = torch.argsort(torch.argsort(first))  # (K,) dense id -> position among the groups as they appear
    hits = torch.zeros(count, dtype=torch.long).index_add_(0, index, correct.long())
    sizes = torch.zeros(count, dtype=torch.long).index_add_(0, index, torch.ones_like(index))
    last = torch.zeros(count, dtype=torch.long).scatter_reduce(0, index, rows, reduce="amax")
    return index, appearance, hits, sizes, last


def replay_plan(correct: torch.Tensor, groups: torch.Tensor, keys: list, buffer: ReplayBuffer, step: int,
                trigger: str = "all_fail") -> list[tuple[int, ReplayEntry]]:
    """(row to overwrite, buffered sample) for every collapsed group that has a usable buffered sample:
    the row is the group's last sample. correct, groups: (N,); keys: the prompt key of each group, in the
    order of the groups' first appearance. Groups without a usable entry are left alone. Sorted by row."""
    _, appearance, hits, sizes, last = _group_summary(correct, groups)
    wanted = TRIGGERS[trigger](hits == sizes, hits == 0)  # (K,)
    plan = []
    for dense in range(hits.numel()):
        if wanted[dense] >= 0:
            entry = buffer.newest(keys[int(appearance[dense])], bool(wanted[dense]), step)
            if entry is not None:
                plan.append((int(last[dense]), entry))
    return sorted(plan, key=lambda item: item[0])


def sample_entries(completions: list[list[int]], rewards: torch.Tensor, correct: torch.Tensor, step: int,
                   logprobs: list[list[float]] | None = None, truncated: list[bool] | None = None) -> list[ReplayEntry]:
    """One ReplayEntry per sample of a scored round, drawn at `step`; truncated: whether each sample hit the
    generation budget (None: none did); logprobs: the sampler's, when the round has them."""
    return [ReplayEntry(list(completions[row]), float(rewards[row]), bool(correct[row]), step,
                        list(logprobs[row]) if logprobs is not None else None,
                        bool(truncated[row]) if truncated is not None else False)
            for row in range(len(completions))]


def fill_buffer(buffer: ReplayBuffer, correct: torch.Tensor, groups: torch.Tensor, keys: list,
                entries: list[ReplayEntry]) -> int:
    """Store the samples (entries: one per sample, sample_entries) of every informative group (some correct, some
    wrong). keys as in replay_plan. Returns how many samples were stored."""
    index, appearance, hits, sizes, _ = _group_summary(correct, groups)
    informative = (hits > 0) & (hits < sizes)
    stored = 0
    for row in range(groups.numel()):
        dense = int(index[row])
        if informative[dense]:
            buffer.add(keys[int(appearance[dense])], entries[row])
            stored += 1
    return stored



class Replay(Stage):
    name = "replay"

    def __init__(self, trigger: str, per_prompt: int, max_age: int):
        self.trigger = trigger
        self.buffer = ReplayBuffer(per_prompt, max_age)
        self.collapsed, self.filled = 0.0, 0.0

    def after_scoring(self, part: ScoredDraw, ctx: StageContext, first_index: int) -> ScoredDraw:
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

    def after_step(self, parts: list[ScoredDraw], step: int) -> dict:
        metrics = {"replay/filled_frac": ratio(self.filled, self.collapsed), "replay/groups_filled": self.filled,
                   "replay/buffer_size": len(self.buffer)}
        self.collapsed, self.filled = 0.0, 0.0
        return metrics

    def checkpointed(self) -> dict:
        return {"replay": self.buffer}


def put_back(part: ScoredDraw, plan: list, pad: int, tokenizer) -> ScoredDraw:
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


def group_keys(part: ScoredDraw) -> list[str]:
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
