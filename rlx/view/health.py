"""Health flags: what a researcher checks first in an RL run, read from the run's own metrics.

Each flag is a small pure function of the run's curves and config (a MetricsTail and a dict), registered by
name with @flag; it returns a one-line reason or None. docs/view.md#health-flags has one section per flag
(the `anchor`), with the thresholds below and what to do.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from rlx.runtime.rundir import ENTROPY_FLOOR, NO_SIGNAL_STEPS

ENTROPY_DROP = 0.1  # entropy at or below this fraction of its first value counts as collapsed too
ACCURACY_DROP = 0.05  # held-out accuracy this far below its best while the reward still rises
BUDGET_FRACTION = 0.5  # mean truncated fraction over the last BUDGET_WINDOW steps at or above this
BUDGET_WINDOW = 5
KL_SPIKE_RATIO = 10.0  # a KL value this many times the median of the values before it ...
KL_SPIKE_MIN = 0.01  # ... and at least this large (nats / token)
KL_HISTORY = 5  # values needed before a spike can be told
KL_WINDOW = 50  # the median is over at most this many values before (stays fast on a long run)


@dataclass
class Flag:
    name: str
    anchor: str  # the section of docs/view.md
    step: int | None  # the step the flag points at
    reason: str


FLAGS: dict[str, tuple[str, Callable]] = {}


def flag(name: str, anchor: str):
    def add(fn):
        FLAGS[name] = (anchor, fn)
        return fn

    return add


def _config_get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


@flag("entropy collapse", "entropy-collapse")
def entropy_collapse(tail, config: dict):
    """train/entropy below ENTROPY_FLOOR (the trainer's own warning) or at most ENTROPY_DROP x its first value."""
    steps, values = tail.curve("train/entropy")
    if len(values) < 2:
        return None
    first, last = values[0], values[-1]
    if last < ENTROPY_FLOOR or (first > 0 and last <= ENTROPY_DROP * first):
        return steps[-1], (f"train/entropy fell from {first:.3g} (step {steps[0]}) to {last:.3g} (step {steps[-1]}): "
                           f"the policy samples nearly one answer")
    return None


@flag("reward up, held-out accuracy down", "reward-up-held-out-down")
def reward_up_heldout_down(tail, config: dict):
    """After the best held-out evaluation, the training reward's mean rose while held-out accuracy ended at
    least ACCURACY_DROP below its best: the policy learns the training reward, not the task (reward hacking
    or overfitting the training prompts)."""
    for held_out in ("eval/accuracy", "eval/success"):
        eval_steps, accuracy = tail.curve(held_out)
        if len(accuracy) >= 3:
            break
    else:
        return None
    best = max(range(len(accuracy)), key=lambda i: accuracy[i])
    if accuracy[-1] > accuracy[best] - ACCURACY_DROP:
        return None
    reward_steps, reward = tail.curve("reward/total")
    before = [r for s, r in zip(reward_steps, reward) if s <= eval_steps[best]]
    after = [r for s, r in zip(reward_steps, reward) if s > eval_steps[best]]
    if not before or not after or statistics.fmean(after) <= statistics.fmean(before):
        return None
    return eval_steps[-1], (f"reward/total rose (mean {statistics.fmean(before):.3g} -> {statistics.fmean(after):.3g}) "
                            f"after step {eval_steps[best]} while {held_out} fell from {accuracy[best]:.3g} to "
                            f"{accuracy[-1]:.3g}")


@flag("length at the budget", "length-at-the-budget")
def length_at_budget(tail, config: dict):
    """completions/truncated_frac averaging at least BUDGET_FRACTION over the last BUDGET_WINDOW steps:
    completions run into rollout.max_new_tokens and are cut before they answer."""
    steps, values = tail.curve("completions/truncated_frac")
    if not values:
        return None
    window = values[-BUDGET_WINDOW:]
    mean = statistics.fmean(window)
    if mean < BUDGET_FRACTION:
        return None
    budget = _config_get(config, "rollout.max_new_tokens")
    return steps[-1], (f"{mean:.0%} of completions were cut at the budget over the last {len(window)} logged steps"
                       + (f" (rollout.max_new_tokens={budget})" if budget is not None else ""))


@flag("KL spike", "kl-spike")
def kl_spike(tail, config: dict):
    """A KL value (train/kl_ref, else train/approx_kl) above KL_SPIKE_RATIO x the median of the (at most KL_WINDOW)
    values before it and above KL_SPIKE_MIN: one update moved the policy far (a bad batch, a learning rate too high)."""
    for name in ("train/kl_ref", "train/approx_kl"):
        steps, values = tail.curve(name)
        if len(values) > KL_HISTORY:
            break
    else:
        return None
    for i in range(KL_HISTORY, len(values)):
        median = statistics.median(values[max(0, i - KL_WINDOW):i])
        if values[i] > KL_SPIKE_MIN and values[i] > KL_SPIKE_RATIO * median:
            return steps[i], (f"{name} jumped to {values[i]:.3g} at step {steps[i]}, "
                              f"{KL_SPIKE_RATIO:.0f}x above the median {median:.3g} of the steps before")
    return None


@flag("groups all tied", "groups-all-tied")
def groups_all_tied(tail, config: dict):
    """train/frac_zero_std_groups at 1 for NO_SIGNAL_STEPS logged steps in a row (the trainer's own warning):
    every group's rewards are equal, every advantage is 0, nothing is learned."""
    steps, values = tail.curve("train/frac_zero_std_groups")
    streak = 0
    for step, value in zip(steps, values):
        streak = streak + 1 if value >= 1.0 else 0
        if streak >= NO_SIGNAL_STEPS:
            return step, f"every group had identical rewards for {streak} steps in a row (up to step {step})"
    return None


@flag("non-finite values", "non-finite-values")
def non_finite(tail, config: dict):
    """NaN or inf in metrics.jsonl: those values are left out of the curves; the first one usually marks
    where training broke."""
    if not tail.nonfinite:
        return None
    first = min(tail.first_nonfinite, key=lambda k: (tail.first_nonfinite[k], k))
    total = sum(tail.nonfinite.values())
    return tail.first_nonfinite[first], (f"{total} non-finite value(s) in {len(tail.nonfinite)} metric(s) skipped in "
                                         f"the curves; the first: {first} at step {tail.first_nonfinite[first]}")


@flag("staleness above its bound", "staleness-above-its-bound")
def staleness_above_bound(tail, config: dict):
    """rollout/staleness_max above rollout.max_staleness: rows were trained on more updates after the
    weights that sampled them than the run allows."""
    bound = _config_get(config, "rollout.max_staleness")
    steps, values = tail.curve("rollout/staleness_max")
    if not isinstance(bound, (int, float)) or not values:
        return None
    for step, value in zip(steps, values):
        if value > bound:
            return step, f"rollout/staleness_max reached {value:g} at step {step}, above rollout.max_staleness={bound}"
    return None


def health_flags(tail, config: dict) -> list[Flag]:
    """Every raised flag of one run, in FLAGS order."""
    raised = []
    for name, (anchor, fn) in FLAGS.items():
        hit = fn(tail, config or {})
        if hit is not None:
            raised.append(Flag(name, anchor, hit[0], hit[1]))
    return raised
