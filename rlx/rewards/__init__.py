"""Reward components built from config, and their weighted sum.

reward.components maps a name to {_target_: dotted.path.to.fn, weight: w, **kwargs}; each component
is logged as reward/<name>. None scores (component does not apply) count as 0 in the total and are
left out of the component's mean.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from rlx.config import UserError


@dataclass
class RewardComponent:
    name: str
    fn: object
    weight: float


def build_rewards(reward_cfg) -> list[RewardComponent]:
    from hydra.utils import get_method

    components = []
    for name, spec in reward_cfg.components.items():
        spec = dict(spec)
        target = spec.pop("_target_", None)
        weight = float(spec.pop("weight", 1.0))
        if target is None:
            raise UserError(f"reward component '{name}' has no _target_ (a dotted path to a reward function)")
        try:
            fn = get_method(target)
        except Exception:
            raise UserError(f"reward component '{name}': cannot import '{target}'") from None
        components.append(RewardComponent(name, functools.partial(fn, **spec) if spec else fn, weight))
    if reward_cfg.accuracy not in {c.name for c in components}:
        raise UserError(
            f"reward.accuracy '{reward_cfg.accuracy}' is not a component; valid choices: {', '.join(c.name for c in components)}"
        )
    return components


class RewardError(Exception):
    pass


def compute_rewards(
    components: list[RewardComponent], prompts: list[str], completions: list[str], rows: list[dict], on_error: str = "raise"
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Score completions with every component.

    Returns total (N,) weighted sum, per-component scores {name: (N,) with nan for None}, and the
    number of completions whose scoring raised (scored 0 when on_error == "zero")."""
    columns = {key: [row.get(key) for row in rows] for key in rows[0]} if rows else {}
    columns.pop("prompt", None)
    n = len(completions)
    total = torch.zeros(n)  # (N,)
    per_component, errors = {}, 0
    for comp in components:
        try:
            scores = list(comp.fn(prompts, completions, **columns))
            if len(scores) != n:
                raise RewardError(f"returned {len(scores)} scores for {n} completions")
        except Exception as exc:
            if on_error != "zero":
                raise RewardError(_describe_failure(comp, prompts, completions, columns, exc)) from exc
            scores = []
            for i in range(n):  # score one by one to isolate the failing completions
                try:
                    scores.append(comp.fn(prompts[i : i + 1], completions[i : i + 1], **{k: v[i : i + 1] for k, v in columns.items()})[0])
                except Exception:
                    scores.append(0.0)
                    errors += 1
        values = torch.tensor([math.nan if s is None else float(s) for s in scores])  # (N,)
        per_component[comp.name] = values
        total += comp.weight * torch.nan_to_num(values, nan=0.0)
    return total, per_component, errors


def _describe_failure(comp, prompts, completions, columns, exc) -> str:
    for i in range(len(completions)):
        try:
            comp.fn(prompts[i : i + 1], completions[i : i + 1], **{k: v[i : i + 1] for k, v in columns.items()})
        except Exception as inner:
            return (
                f"reward '{comp.name}' raised {type(inner).__name__}: {inner} on completion {completions[i]!r} "
                f"(set reward.on_error=zero to score such completions 0 and count them)"
            )
    return f"reward '{comp.name}' raised {type(exc).__name__}: {exc} (set reward.on_error=zero to score failures 0)"
