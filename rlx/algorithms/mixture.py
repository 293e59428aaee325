"""Training on several objectives at once with per-objective loss weights: a fixed mixture, or RECAP's weights
that move online (mixture.rule; docs/algorithms/mixture.md).

An objective is a value of one row column (mixture.key; `task` for reasoning-gym mixes, data.task=[a,b]). Each
step the loop hands the mixer every objective's mean reward over its rows of the step; the mixer returns one
weight per objective, and the policy-gradient term of each row is scaled by its objective's weight (the weights
scale losses, so they sum to K, the number of objectives: equal weights are exactly plain training).

RECAP (Phan et al. 2025, "Beyond Reasoning Gains: Mitigating General Capabilities Forgetting in Large Reasoning
Models", arXiv 2510.21978) moves the weights from short-horizon signals of convergence and instability, away from
saturated objectives and toward lagging or volatile ones. Its exact formula was not in the material available
when this was written (the abstract and third-party summaries only), so `recap_priorities` is rlx's
reconstruction from that description, and departs from the paper where the paper may differ:
  - the signal is each objective's per-step mean reward (the paper monitors the objectives' losses);
  - convergence and instability are the relative trend and relative spread of that signal over a window of the
    last `window` steps in which the objective had rows;
  - the priority adds them (p = c + s), so a flat signal (saturated, c = s = 0) ranks lowest. The ratio
    (s + eps) / (c + eps) suggested in the issue was not used: any plateau with a little sampling noise gets
    p >> 1 under it (tiny c), i.e. weight moves TOWARD saturated objectives, the opposite of the paper's aim;
  - weights are a softmax of p / temperature mixed with a floor share, so no objective starves.
For rewards in [0, 1] the relative spread (a coefficient of variation) is also larger for objectives the model
mostly fails (a Bernoulli reward of pass rate q has sd / mean = sqrt((1 - q) / q)), so lagging objectives gain too.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from rlx.errors import UserError
from rlx.registry import Registry, publish

EPS = 1e-8  # keeps the relative measures finite when an objective's mean reward is 0


def window_signals(values) -> tuple[float, float]:
    """(convergence c, instability s) of one objective's window of per-step signals x_1..x_n (oldest first):

        m = mean(x)
        c = |b| (n - 1) / (|m| + eps)     b: the least-squares slope of x against the step index, so b (n - 1)
                                          is the change over the window the trend explains (relative to m)
        s = sd(x) / (|m| + eps)           sd: population standard deviation (ddof 0), a coefficient of variation
    Fewer than 2 values: (0, 0), no signal yet. Example: x = [0.2, 0.4, 0.6, 0.8]: m = 0.5, b = 0.2 ->
    c = 0.6 / 0.5 = 1.2; sd = sqrt(0.05) = 0.2236 -> s = 0.4472."""
    x = [float(v) for v in values]
    if len(x) < 2:
        return 0.0, 0.0
    scale = abs(statistics.fmean(x)) + EPS
    slope = statistics.linear_regression(range(len(x)), x).slope
    return abs(slope) * (len(x) - 1) / scale, statistics.pstdev(x) / scale


def recap_priorities(signals: list[tuple[float, float]]) -> list[float]:
    """p_k = c_k + s_k for each objective's (convergence, instability): saturated (flat) objectives lowest,
    moving or volatile ones highest (rlx's reconstruction; see the module docstring)."""
    return [c + s for c, s in signals]


def floored_softmax_weights(priorities, temperature: float, floor: float) -> list[float]:
    """Loss weights of K objectives from their priorities:

        q = softmax(p / temperature)
        w = K ((1 - K floor) q + floor)
    Each objective's share w_k / K is at least `floor` (K floor <= 1), the weights sum to K (mean 1: equal
    priorities give every objective weight 1). Example: p = [0, 1.32], temperature 1, floor 0.3:
    q = [1, e^1.32] / (1 + e^1.32) = [0.21082, 0.78918] -> shares 0.4 q + 0.3 = [0.38433, 0.61567] ->
    w = [0.76865, 1.23135]."""
    p = [float(v) / temperature for v in priorities]
    k = len(p)
    if k * floor > 1 + 1e-12:
        raise ValueError(f"floor {floor} x {k} objectives exceeds 1")
    top = max(p)
    q = [math.exp(v - top) for v in p]
    total = math.fsum(q)
    return [k * ((1.0 - k * floor) * v / total + floor) for v in q]


def normalised_weights(weights) -> list[float]:
    """Fixed weights rescaled to sum to K (their mean 1), so that a mixture changes the balance between
    objectives, not the step size: [1, 3] -> [0.5, 1.5]."""
    w = [float(v) for v in weights]
    total = math.fsum(w)
    return [v * len(w) / total for v in w]


class Mixer:
    """The weights of K named objectives and what moves them: observe(step's mean rewards) then weights().
    state_dict/load_state_dict hold everything that decides later weights (checkpointed with the run)."""

    def __init__(self, objectives: list[str], settings):
        self.objectives = list(objectives)
        self.settings = settings
        self.last_rewards: dict[str, float] = {}

    def observe(self, rewards: dict[str, float]) -> None:
        """This step's mean reward of each objective that had rows (an absent objective is not in `rewards`)."""
        self.last_rewards = dict(rewards)

    def weights(self) -> list[float]:
        raise NotImplementedError

    def signals(self) -> dict[str, float]:
        """mixture/signal/<objective>/<name> values beyond the reward (none for a fixed mixture)."""
        return {}

    def metrics(self) -> dict[str, float]:
        out = {}
        for name, weight in zip(self.objectives, self.weights()):
            out[f"mixture/weight/{name}"] = float(weight)
        for name in self.objectives:
            if name in self.last_rewards:
                out[f"mixture/signal/{name}/reward"] = float(self.last_rewards[name])
        out.update(self.signals())
        return out

    def state_dict(self) -> dict:
        return {"last_rewards": dict(self.last_rewards)}

    def load_state_dict(self, state: dict) -> None:
        self.last_rewards = dict(state["last_rewards"])


# mixture.rule: class(objectives, settings) -> Mixer
MIXING_RULES = publish("mixing_rule", Registry("mixture.rule"))


@MIXING_RULES.register("fixed")
class FixedMixer(Mixer):
    """Constant weights: mixture.weights (objective -> weight; an objective not named weighs 1), rescaled to sum
    to K (normalised_weights)."""

    def __init__(self, objectives: list[str], settings):
        super().__init__(objectives, settings)
        given = dict(settings.weights or {})
        self._weights = normalised_weights([float(given.get(name, 1.0)) for name in self.objectives])

    def weights(self) -> list[float]:
        return self._weights


@MIXING_RULES.register("recap")
class RecapMixer(Mixer):
    """RECAP-style dynamic weights: a window of each objective's last `mixture.window` per-step mean rewards ->
    (convergence, instability) -> priorities -> floored softmax weights (recap_priorities,
    floored_softmax_weights). Until an objective has 2 values its signals are 0."""

    def __init__(self, objectives: list[str], settings):
        super().__init__(objectives, settings)
        self.windows = {name: deque(maxlen=settings.window) for name in self.objectives}

    def observe(self, rewards: dict[str, float]) -> None:
        super().observe(rewards)
        for name, value in rewards.items():
            self.windows[name].append(float(value))

    def _signals(self) -> list[tuple[float, float]]:
        return [window_signals(self.windows[name]) for name in self.objectives]

    def weights(self) -> list[float]:
        return floored_softmax_weights(recap_priorities(self._signals()), self.settings.temperature,
                                       self.settings.floor)

    def signals(self) -> dict[str, float]:
        out = {}
        for name, (c, s) in zip(self.objectives, self._signals()):
            out[f"mixture/signal/{name}/convergence"] = c
            out[f"mixture/signal/{name}/instability"] = s
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "windows": {name: list(w) for name, w in self.windows.items()}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for name, values in state["windows"].items():
            self.windows[name] = deque(values, maxlen=self.settings.window)


def objectives_of(rows: list[dict], key: str) -> list[str]:
    """The distinct values of column `key` over the training rows, in order of first appearance."""
    seen: dict[str, None] = {}
    for index, row in enumerate(rows):
        if key not in row:
            raise UserError(f"training row {index} has no column '{key}' to name its objective; set mixture.key to a "
                            f"column every row has (reasoning-gym rows: task)")
        seen.setdefault(str(row[key]), None)
    return list(seen)


def build_mixer(settings, rows: list[dict]) -> Mixer | None:
    """The mixer of mixture.rule (None for `none`) over the objectives the training rows name. Bad settings:
    one line naming the fix (UserError)."""
    if settings.rule == "none":
        return None
    objectives = objectives_of(rows, settings.key)
    stray = sorted(set(settings.weights or {}) - set(objectives))
    if stray:
        raise UserError(f"mixture.weights names '{stray[0]}', which is not an objective of this run (the values of "
                        f"column '{settings.key}': {', '.join(objectives)}); fix or remove that entry")
    bad = [name for name, value in (settings.weights or {}).items()
           if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0]
    if bad:
        raise UserError(f"mixture.weights.{bad[0]}={settings.weights[bad[0]]!r} is not valid: each weight must be a "
                        f"number > 0")
    if len(objectives) * settings.floor > 1:
        raise UserError(f"mixture.floor={settings.floor} x {len(objectives)} objectives exceeds 1; set mixture.floor "
                        f"<= {1 / len(objectives):.4g}")
    return MIXING_RULES[settings.rule](objectives, settings)
