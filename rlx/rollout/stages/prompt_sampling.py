"""Difficulty-aware prompt sampling (algorithm.prompt_sampling; rlx/data/difficulty.py): after the step's rounds,
the sampler learns each drawn prompt's pass rate from its plain samples' verdicts as first drawn (before replay
and hints), and retires prompts solved every time. The sampler is the producer's prompt source, checkpointed
with it as "data".

Metrics: sampling/drawn_pass_estimate (the sampler's mean estimate over the prompts drawn, before this update),
sampling/retired (prompts retired so far).
"""

from __future__ import annotations

import torch

from rlx.rollout.stages.base import STAGES, Round, Stage, StageSettings


class PromptSampling(Stage):
    name = "prompt_sampling"

    def __init__(self, mode: str):
        self.mode = mode

    def after_step(self, parts: list[Round], stream, step: int) -> dict:
        if not (hasattr(stream, "update") and hasattr(stream, "drawn")):
            return {}
        rates, solved = [], []
        for part in parts:
            plain = ~part.hinted if part.hinted is not None else torch.ones(len(part.groups), dtype=torch.bool)
            groups, correct = part.groups[plain], part.first_correct[plain].double()
            for g in torch.unique_consecutive(groups).tolist():
                chosen = correct[groups == g]
                rates.append(chosen.mean().item())
                solved.append(bool(chosen.all()))
        drawn = list(stream.drawn)
        estimates = stream.pass_rates[torch.tensor(drawn, dtype=torch.long)] if drawn else torch.zeros(0)
        metrics = {"sampling/drawn_pass_estimate": estimates.mean().item() if drawn else 0.0}
        stream.update(drawn, torch.tensor(rates, dtype=torch.float64), torch.tensor(solved, dtype=torch.bool))
        metrics["sampling/retired"] = int(stream.retired.sum())
        return metrics

    def describe(self) -> str:
        return f"prompt sampling {self.mode}"


@STAGES.register("prompt_sampling")
def prompt_sampling(settings: StageSettings) -> PromptSampling | None:
    mode = settings.algo.prompt_sampling.mode
    return PromptSampling(mode) if mode != "uniform" else None
