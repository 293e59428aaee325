"""The sampling temperature schedule (rollout.temperature_schedule; EAD): the step's per-position temperatures
(TEMPERATURE_SCHEDULES, rlx/rollout/temperature.py) handed to the decoder, the stages that sample again (hints)
and the update (per-token temperatures on each row).

Metrics: rollout/temperature_mean (the mean temperature over the sampled tokens of the step's rows).
"""

from __future__ import annotations

from rlx.rollout.stages.base import STAGES, Round, Stage, StageContext, StageSettings, ratio
from rlx.rollout.temperature import temperature_schedule


class TemperatureSchedule(Stage):
    name = "temperature_schedule"

    def __init__(self, mode: str, base: float, knobs: dict):
        self.mode, self.base, self.knobs = mode, base, knobs
        self.tau_sum, self.tau_tokens = 0.0, None  # None: no row carried temperatures this step

    def schedule(self, step: int, max_new_tokens: int) -> list[float]:
        return temperature_schedule(self.mode, max_new_tokens, step, self.base, self.knobs).tolist()

    def after_scoring(self, part: Round, ctx: StageContext, first_index: int) -> Round:
        taus = part.rollout.temperatures
        if ctx.schedule is not None and part.rollout.scheduled:
            sampled = part.rollout.loss_mask.bool()
            self.tau_sum += float(taus[sampled].double().sum().item())
            self.tau_tokens = (self.tau_tokens or 0.0) + float(int(sampled.sum()))
        return part

    def after_step(self, parts: list[Round], step: int) -> dict:
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
