"""Verifier noise (algorithm.verifier_noise): the accuracy component's verdict flipped at the configured rates,
one counter-based uniform per sample, for controlled studies of noisy verifiers. The total reward moves by
accuracy_weight x (observed - clean) on a flipped sample.

Metrics: noise/flipped_frac (flipped samples / samples), noise/observed_accuracy (observed correct / samples).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlx.algorithms.shaping import correct_from_accuracy, inject_verifier_noise
from rlx.engines.sampling import row_uniforms, sample_seed
from rlx.rollout.stages.base import STAGES, ScoredDraw, Stage, StageContext, StageSettings, ratio

NOISE_POSITION = 1 << 20  # the noise uniform of sample i is row_uniforms(seed_i, this): no decoder position reaches it


class VerifierNoise(Stage):
    name = "verifier_noise"
    phase = "verdict"  # the prompt sampler learns from the verdict as observed

    def __init__(self, fn_rate: float, fp_rate: float, accuracy_key: str, accuracy_weight: float):
        self.fn_rate, self.fp_rate = fn_rate, fp_rate
        self.accuracy_key, self.accuracy_weight = accuracy_key, accuracy_weight
        self.flipped, self.samples, self.observed = 0.0, 0.0, 0.0

    def after_scoring(self, part: ScoredDraw, ctx: StageContext, first_index: int) -> ScoredDraw:
        accuracy = part.components[self.accuracy_key]
        clean = correct_from_accuracy(accuracy)
        seeds = torch.tensor([sample_seed(ctx.seed, ctx.step, first_index + i) for i in range(len(clean))],
                             dtype=torch.int64)
        observed = inject_verifier_noise(clean, self.fn_rate, self.fp_rate, row_uniforms(seeds, NOISE_POSITION))
        flipped = observed != clean
        delta = self.accuracy_weight * (observed.double() - torch.nan_to_num(accuracy.double(), nan=0.0))
        rewards = torch.where(flipped, part.rewards + delta.to(part.rewards.dtype), part.rewards)
        self.flipped += float(int(flipped.sum()))
        self.samples += float(len(clean))
        self.observed += float(int(observed.sum()))
        return replace(part, rewards=rewards, correct=observed)

    def after_step(self, parts: list[ScoredDraw], step: int) -> dict:
        metrics = {"noise/flipped_frac": ratio(self.flipped, self.samples),
                   "noise/observed_accuracy": ratio(self.observed, self.samples)}
        self.flipped, self.samples, self.observed = 0.0, 0.0, 0.0
        return metrics

    def describe(self) -> str:
        return "verifier noise"


@STAGES.register("verifier_noise")
def verifier_noise(settings: StageSettings) -> VerifierNoise | None:
    noise = settings.algo.verifier_noise
    if not (noise.fn_rate or noise.fp_rate):
        return None
    return VerifierNoise(noise.fn_rate, noise.fp_rate, settings.accuracy_key, settings.accuracy_weight)
