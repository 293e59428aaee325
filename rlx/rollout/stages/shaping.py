"""Group reward shaping (algorithm.shapers, in the configured order, each on the previous one's output): the
SHAPERS registry (rlx/algorithms/shaping.py) with correctness, lengths, the sampler's mean log-probs and, for PAR,
the reward of the row's reference completion. LASER-D's per-difficulty length targets are updated after each step
on every row drawn, and checkpointed as "laser_d".

Metrics: shaping/{name}_delta_abs for each shaper (mean |shaped - input| over the samples), each shaper's own
metrics (sample-weighted means over the step's draws), shaping/par_reference_reward when a shaper reads r(x, y_ref).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlx.algorithms.grouping import dense_ids
from rlx.algorithms.shaping import SHAPERS, GroupSignals, LaserDTargets
from rlx.engines.records import Generation, Rollout
from rlx.rollout.stages.base import STAGES, ScoredDraw, Stage, StageContext, StageSettings, mean_logprobs, ratio


class Shaping(Stage):
    name = "shaping"

    def __init__(self, shapers: list[str], knobs: dict, accuracy_weight: float, laser_d: LaserDTargets | None):
        self.shapers, self.knobs, self.accuracy_weight, self.laser_d = shapers, knobs, accuracy_weight, laser_d
        self.averages: dict = {}  # metric -> [sum of value x samples, samples]
        self.reference_sum, self.reference_n = 0.0, None  # None: no reference scored this step

    def add_mean(self, name: str, value: float, samples: int) -> None:
        total = self.averages.setdefault(name, [0.0, 0])
        total[0] += float(value) * samples
        total[1] += samples

    def after_scoring(self, part: ScoredDraw, ctx: StageContext, first_index: int) -> ScoredDraw:
        reference = None
        # r(x, y_ref): the reward of the row's reference completion (data.completion_template)
        if any(SHAPERS.needs(name).reference_rewards for name in self.shapers):
            texts = [ctx.completion_template.format(answer=row.get("answer")) for row in part.rows]
            reference = _reference_rewards(ctx, part, texts)
        signals = GroupSignals(part.groups, part.correct, part.rollout.lengths, mean_logprobs(part.rollout), reference,
                               self.accuracy_weight, ctx.max_new_tokens, ctx.step)
        knobs = dict(self.knobs)
        if self.laser_d is not None:
            knobs["bucket_targets"] = tuple(self.laser_d.targets.tolist())
        rewards = part.rewards
        for name in self.shapers:  # in the configured order, each on the previous one's output
            shaped, metrics = SHAPERS[name](rewards, signals, **knobs)
            # the generic mechanism metric of every shaper: how far it moved the rewards
            self.add_mean(f"shaping/{name}_delta_abs", (shaped.double() - rewards.double()).abs().mean().item(),
                          len(rewards))
            for key, value in metrics.items():
                if value is not None:
                    self.add_mean(key, value, len(rewards))
            rewards = shaped
        if reference is not None:
            self.reference_sum += float(reference.double().sum().item())
            self.reference_n = (self.reference_n or 0.0) + float(len(reference))
        return replace(part, rewards=rewards.to(part.rewards.dtype))

    def after_step(self, parts: list[ScoredDraw], step: int) -> dict:
        """LASER-D's targets from every row drawn this step; the step's shaping metrics."""
        if self.laser_d is not None:
            lengths = torch.cat([p.rollout.lengths for p in parts])
            correct = torch.cat([p.correct for p in parts])
            groups = torch.cat([p.groups for p in parts])
            self.laser_d.update(step, lengths, correct, groups)
        metrics = {name: total / samples for name, (total, samples) in self.averages.items() if samples}
        if self.reference_n is not None:
            metrics["shaping/par_reference_reward"] = ratio(self.reference_sum, self.reference_n)
        self.averages, self.reference_sum, self.reference_n = {}, 0.0, None
        return metrics

    def checkpointed(self) -> dict:
        return {"laser_d": self.laser_d} if self.laser_d is not None else {}

    def describe(self) -> str:
        return f"shapers {'+'.join(self.shapers)}"


def _reference_rewards(ctx: StageContext, part: ScoredDraw, texts: list[str]) -> torch.Tensor:
    """(n,) the total reward of each sample's reference completion, scored once per group."""
    index, count = dense_ids(part.groups)
    first = torch.full((count,), len(texts),
                       dtype=torch.long).scatter_reduce(0, index, torch.arange(len(texts)), reduce="amin")
    rows = first.tolist()
    tokenizer = ctx.tokenizer
    ids = [tokenizer(texts[r], add_special_tokens=False)["input_ids"] for r in rows]
    prompt_ids = [part.rollout.prompt_ids[r][part.rollout.prompt_mask[r].bool()].tolist() for r in rows]
    reference = Rollout.from_ids(prompt_ids, Generation(ids, None, [True] * len(ids)), 1, tokenizer.pad_token_id,
                                 [texts[r] for r in rows])
    total, _, _ = ctx.score([part.prompts[r] for r in rows], reference, [part.rows[r] for r in rows])
    return total.double()[index]


@STAGES.register("shaping")
def shaping(settings: StageSettings) -> Shaping | None:
    algo = settings.algo
    if not algo.shapers:
        return None
    knobs = dict(vars(algo.shaping)) if not isinstance(algo.shaping, dict) else dict(algo.shaping)
    knobs["eps"] = algo.eps
    laser_d = (LaserDTargets(knobs["target_tokens"], knobs["target_candidates"], settings.group_size,
                             knobs["adapt_every"], knobs["expected_correct"])
               if any(SHAPERS.needs(name).length_targets for name in algo.shapers) else None)
    return Shaping(list(algo.shapers), knobs, settings.accuracy_weight, laser_d)
