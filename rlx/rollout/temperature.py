"""Per-token sampling temperature within a generation (`rollout.temperature_schedule`).

    TEMPERATURE_SCHEDULES[mode](positions (T,) long, step, base, **knobs) -> temperatures (T,)

positions are completion positions 0, 1, ... (the t-th sampled token); step is the training step;
base is rollout.temperature. The hf decoder samples token t at temperature tau_t and must record the
sampler's log-prob at tau_t (`tempered_logprobs`), while the trainer scores the target policy at the
base temperature: the two differ on purpose, and the off-policy correction (rollout.correction=tis,
truncated importance sampling) corrects the gradient for it, as the EAD paper does. Torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from rlx.registry import Registry, publish

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
