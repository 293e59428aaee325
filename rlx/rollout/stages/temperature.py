"""Per-token sampling temperature within a generation (rollout.temperature_schedule; EAD): the schedules and the
stage that hands the step's per-position temperatures to the decoder, the stages that sample again (hints) and the
update (per-token temperatures on each row).

    TEMPERATURE_SCHEDULES[mode](positions (T,) long, step, base, **knobs) -> temperatures (T,)

positions are completion positions 0, 1, ... (the t-th sampled token); step is the training step;
base is rollout.temperature. The hf decoder samples token t at temperature tau_t and must record the
sampler's log-prob at tau_t (`tempered_logprobs`), while the trainer scores the target policy at the
base temperature: the two differ on purpose, and the off-policy correction (rollout.correction=tis,
truncated importance sampling) corrects the gradient for it, as the EAD paper does.

Metrics: rollout/temperature_mean (the mean temperature over the sampled tokens of the step's rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from rlx.registry import Registry, publish
from rlx.rollout.stages.base import STAGES, ScoredDraw, Stage, StageContext, StageSettings, ratio

TEMPERATURE_SCHEDULES = publish("temperature_schedule", Registry("temperature schedule"))


@TEMPERATURE_SCHEDULES.register("constant")
def constant_temperature(positions: torch.Tensor, step: int, base: float, **_) -> torch.Tensor:
    """tau_t = rollout.temperature at every position (rlx's default)."""
    return torch.full(positions.shape, float(base), dtype=torch.float64)


def ead_decay(step: int, decay_d0: float, decay_per_step: float = 5.0, decay_max: float = 40000.0) -> float:
    """EAD's step-aware decay rate d_s = min(d_0 + 5 s, 40000) (the paper's constants as defaults): the hot
    phase lengthens as responses grow during training."""
    return min(decay_d0 + decay_per_step * step, decay_max)


@dataclass(frozen=True)
class EADSettings:
    """The knobs of the ead schedule, named as rollout.temperature_schedule's keys (conf/rollout/*.yaml holds the
    run's values; these defaults, the paper's constants and rlx's d_0, are only for direct calls)."""

    tau_max: float = 1.2
    tau_min: float = 0.1
    warmup_tokens: int = 0
    decay_d0: float = 20.0
    decay_per_step: float = 5.0
    decay_max: float = 40000.0

    @classmethod
    def from_knobs(cls, knobs: dict) -> EADSettings:
        """The settings among the schedule knobs (the others are other schedules')."""
        return cls(**{f.name: knobs[f.name] for f in fields(cls) if f.name in knobs})


@TEMPERATURE_SCHEDULES.register("ead")
def ead_schedule(positions: torch.Tensor, step: int, base: float, **knobs) -> torch.Tensor:
    """The registry entry of mode=ead: the schedule's knobs by keyword -> EADSettings -> ead_temperature."""
    return ead_temperature(positions, step, base, EADSettings.from_knobs(knobs))


def ead_temperature(positions: torch.Tensor, step: int, base: float,
                    settings: EADSettings = EADSettings()) -> torch.Tensor:
    """Exploratory Annealed Decoding (Yang et al. 2025, "Let it Calm: Exploratory Annealed Decoding for
    Verifiable Reinforcement Learning", arXiv 2510.05251):
        tau_t = max(1 + tau_max - exp(t / d_s), tau_min)   for t >= c,
        tau_t = base                                         for t < c  (template tokens; the paper: 1)
    hot at the start (tau_0 = tau_max), cooling to tau_min after about d_s * ln(1 + tau_max - tau_min)
    tokens. c = warmup_tokens, d_s = ead_decay(step, ...) (settings: EADSettings). The paper illustrates
    c = 10, tau_max = 1.2, tau_min = 0.1; its d_0 suits thousand-token answers, rlx's default 20 suits the tiny
    model's ~10. rlx departs: t counts from the first completion token (the paper does not say whether the
    schedule restarts after the c template tokens). Returns (T,) float64."""
    s = settings
    decay = ead_decay(step, s.decay_d0, s.decay_per_step, s.decay_max)
    hot = 1.0 + s.tau_max - torch.exp(positions.double() / decay)
    schedule = torch.clamp(hot, min=s.tau_min)
    return torch.where(positions < s.warmup_tokens, torch.full_like(schedule, float(base)), schedule)


def temperature_schedule(mode: str, length: int, step: int, base: float, knobs: dict | None = None) -> torch.Tensor:
    """(length,) temperatures of completion positions 0..length-1 under `mode`."""
    return TEMPERATURE_SCHEDULES[mode](torch.arange(length), step, base, **(knobs or {}))


def tempered_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """log softmax(z_t / tau_t)[y_t]: the log-prob the sampler drew y_t with, at a per-position temperature.
    logits: (N, T, V); tokens: (N, T); temperatures: (T,) or (N, T), all > 0. Returns (N, T) float32."""
    tau = temperatures.to(torch.float32)
    tau = tau.unsqueeze(0).expand(tokens.shape) if tau.dim() == 1 else tau  # (N, T)
    scaled = logits.float() / tau.clamp(min=1e-8).unsqueeze(-1)
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def hot_tokens(tau_max: float, tau_min: float, decay: float) -> int:
    """How many leading positions sample above tau_min: t < d ln(1 + tau_max - tau_min) (for sizing d_0).
    Example: tau_max 1.2, tau_min 0.1, d 20 -> 20 ln 2.1 = 14.8 -> 15 tokens."""
    return max(0, math.ceil(decay * math.log(1.0 + tau_max - tau_min)))



class TemperatureSchedule(Stage):
    name = "temperature_schedule"

    def __init__(self, mode: str, base: float, knobs: dict):
        self.mode, self.base, self.knobs = mode, base, knobs
        self.tau_sum, self.tau_tokens = 0.0, None  # None: no row carried temperatures this step

    def schedule(self, step: int, max_new_tokens: int) -> list[float]:
        return temperature_schedule(self.mode, max_new_tokens, step, self.base, self.knobs).tolist()

    def after_scoring(self, part: ScoredDraw, ctx: StageContext, first_index: int) -> ScoredDraw:
        taus = part.rollout.temperatures
        if ctx.schedule is not None and part.rollout.scheduled:
            sampled = part.rollout.loss_mask.bool()
            self.tau_sum += float(taus[sampled].double().sum().item())
            self.tau_tokens = (self.tau_tokens or 0.0) + float(int(sampled.sum()))
        return part

    def after_step(self, parts: list[ScoredDraw], step: int) -> dict:
        metrics = {} if self.tau_tokens is None else {"rollout/temperature_mean": ratio(self.tau_sum, self.tau_tokens)}
        self.tau_sum, self.tau_tokens = 0.0, None
        return metrics

    def describe(self) -> str:
        return f"temperature {self.mode}"


@STAGES.register("temperature_schedule")
def temperature(settings: StageSettings) -> TemperatureSchedule | None:
    knobs = settings.roll.temperature_schedule
    if knobs.mode == "constant":
        return None
    return TemperatureSchedule(knobs.mode, settings.roll.temperature,
                               {k: v for k, v in vars(knobs).items() if k != "mode"})
