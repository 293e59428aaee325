"""Reward components built from config, and their weighted sum.

reward.components maps a name to {_target_: dotted.path.to.fn, weight: w, **kwargs}; each component
is logged as reward/<name>. A component is called with TRL's reward-function contract (by keyword:
prompts=, completions=, completion_ids=, trainer_state=, and every data column under its own name) and
returns one float or None per completion. None scores (component does not apply) count as 0 in the
total and are left out of the component's mean.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from rlx.errors import RewardError, UserError
from rlx.tasks import completion_text  # noqa: F401  (re-exported: a reward function's helper)


@dataclass
class RewardComponent:
    name: str
    fn: object
    weight: float


def build_rewards(reward_cfg, given: Mapping[str, Callable] | None = None) -> list[RewardComponent]:
    """The configured reward components: each `_target_` imported (a component named in `given` takes that
    function of this process instead: rlx.fit's callables, whose `_target_` only records where they were
    defined), its other keys bound as keyword arguments, and its weight."""
    from rlx.config.plugins import import_target

    given = given or {}
    components = []
    for name, spec in reward_cfg.components.items():
        spec = dict(spec)
        target = spec.pop("_target_", None)
        weight = float(spec.pop("weight", 1.0))
        if target is None and name not in given:
            raise UserError(f"reward component '{name}' has no _target_ (a dotted path to a reward function)")
        fn = given[name] if name in given else import_target(target, f"reward component '{name}'")
        if not callable(fn):
            raise UserError(f"reward component '{name}': '{target}' is not a function")
        components.append(RewardComponent(name, functools.partial(fn, **spec) if spec else fn, weight))
    if reward_cfg.accuracy not in {c.name for c in components}:
        raise UserError(
            f"reward.accuracy '{reward_cfg.accuracy}' is not a component; valid choices: "
            f"{', '.join(c.name for c in components)}"
        )
    return components


@dataclass
class TrainerState:
    """The training progress a reward function may read, under the attribute names of transformers'
    TrainerState that TRL passes as `trainer_state` (global_step, max_steps)."""

    global_step: int = 0
    max_steps: int = 0


def token_lists(completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> list[list[int]]:
    """(N, C) padded completion ids and mask -> the N generated token-id lists (TRL's completion_ids)."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(completion_ids, completion_mask)]


def is_conversational(rows: list[dict]) -> bool:
    """Rows whose prompt is a chat message list ([{"role": ..., "content": ...}, ...]), as in TRL."""
    return bool(rows) and isinstance(rows[0].get("prompt"), list)


def reward_inputs(prompts: list[str], completions: list[str], rows: list[dict], system_prompt: str | None = None):
    """Prompts and completions in the form TRL gives reward functions: for string prompts each row's prompt
    column (the user message, as TRL passes `prompts`; the rendered model input where a row has none) and the
    completion text; for a conversational dataset the message list (the system prompt first when one is
    configured) and [{"role": "assistant", "content": text}]."""
    if not is_conversational(rows):
        return [row.get("prompt", text) if isinstance(row.get("prompt", text), str) else text
                for row, text in zip(rows, prompts)], completions
    messages = [with_system_prompt(row["prompt"], system_prompt) for row in rows]
    return messages, [[{"role": "assistant", "content": text}] for text in completions]


def with_system_prompt(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """A chat message list with the configured system prompt first, unless it already has one."""
    messages = [dict(m) for m in messages]
    if system_prompt and (not messages or messages[0].get("role") != "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def _call(comp: RewardComponent, prompts, completions, columns: dict, extra: dict):
    """One call with TRL's contract: everything by keyword, every column under its own name. `prompt_texts`
    (the model inputs as rendered, chat template applied) goes only to a function that names it."""
    if "prompt_texts" in extra and not _names(comp.fn, "prompt_texts"):
        extra = {k: v for k, v in extra.items() if k != "prompt_texts"}
    return comp.fn(prompts=prompts, completions=completions, **extra, **columns)


def _names(fn, parameter: str) -> bool:
    """Whether `fn` (a function or functools.partial) declares `parameter` by name (not only **kwargs)."""
    import inspect

    try:
        return parameter in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _subset(values, index: int):
    return values[index : index + 1] if isinstance(values, list) else values


FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_NOTHING_SCORED_WARNED = []


def _warn_nothing_scored(names: list[str], n: int) -> None:
    """Once per process: every component said None (not applicable) for a whole batch, so it scores 0 everywhere."""
    if _NOTHING_SCORED_WARNED:
        return
    _NOTHING_SCORED_WARNED.append(True)
    import logging

    logging.getLogger("rlx").warning(
        "every reward component (%s) returned None (not applicable) for all %d completions of a batch: they score 0 "
        "and carry no learning signal; check that the reward reads the right data columns (said once)",
        ", ".join(names), n)


def check_scores(name: str, scores, completions: list) -> list[float | None]:
    """The output of reward component `name`: one float (finite) or None per completion, else RewardError
    naming the component and an offending completion."""
    n = len(completions)
    if isinstance(scores, torch.Tensor):
        scores = scores.tolist()
    try:
        scores = list(scores)
    except TypeError:
        raise RewardError(f"reward '{name}' returned {type(scores).__name__}, not a list of scores (one float or None "
                          f"per completion)") from None
    if len(scores) != n:
        raise RewardError(f"reward '{name}' returned {len(scores)} scores for {n} completions (first completion: "
                          f"{_shown(completions[0]) if completions else ''})")
    checked = []
    for i, score in enumerate(scores):
        if score is None:
            checked.append(None)
            continue
        if isinstance(score, torch.Tensor) and score.numel() == 1:
            score = score.item()
        is_number = isinstance(score, (int, float)) or type(score).__module__ == "numpy" and hasattr(score, "item")
        if not is_number or isinstance(score, (str, bytes)):
            raise RewardError(f"reward '{name}' returned {type(score).__name__} {_shown(score, 40)} for completion "
                              f"{_shown(completions[i])}; a score is a float or None (not applicable)")
        value = float(score)
        if not math.isfinite(value):
            raise RewardError(f"reward '{name}' returned {value} for completion {_shown(completions[i])}; return a "
                              "finite float, or None when the reward does not apply")
        if abs(value) > FLOAT32_MAX:  # would turn inf in the float32 reward tensor, and ties or NaN after it
            raise RewardError(f"reward '{name}' returned {value:g} for completion {_shown(completions[i])}, beyond "
                              f"float32 (|score| <= {FLOAT32_MAX:.3g}); scale the reward down")
        checked.append(value)
    return checked


def _shown(value, limit: int = 120) -> str:
    text = repr(completion_text(value) if isinstance(value, list) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compute_rewards(
    components: list[RewardComponent], prompts: list, completions: list, rows: list[dict], on_error: str = "raise",
    *, completion_ids: list[list[int]] | None = None, state: TrainerState | None = None,
    system_prompt: str | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Score completions with every component, called as TRL calls reward functions:

        fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)

    where every data column except `prompt` arrives under its own name (one value per completion);
    prompts (each row's prompt column, as TRL passes it) and completions are strings, or message lists for a
    conversational dataset (`reward_inputs`); a function that names `prompt_texts` also gets `prompts` as given
    here (the model inputs, chat template applied).
    Returns total (N,) weighted sum, per-component scores {name: (N,) with nan for None}, and the
    number of completions whose scoring raised (scored 0 when on_error == "zero"). A component that
    returns anything but one finite float or None per completion raises RewardError, whatever on_error."""
    rendered = list(prompts)
    prompts, completions = reward_inputs(prompts, completions, rows, system_prompt)
    keys = list(dict.fromkeys(key for row in rows for key in row))
    columns = {key: [row.get(key) for row in rows] for key in keys
               if key not in ("prompt", "completion", "completion_ids")}
    n = len(completions)
    extra = {"completion_ids": completion_ids, "trainer_state": state or TrainerState(), "prompt_texts": rendered}
    total = torch.zeros(n)  # (N,)
    per_component, errors = {}, 0
    for comp in components:
        try:
            scores = _call(comp, prompts, completions, columns, extra)
        except Exception as exc:
            if on_error != "zero":
                raise RewardError(_describe_failure(comp, prompts, completions, columns, extra, exc)) from exc
            scores = []
            for i in range(n):  # score one by one to isolate the failing completions
                one = {k: _subset(v, i) for k, v in extra.items()}
                try:
                    scores.append(check_scores(comp.name, _call(comp, prompts[i : i + 1], completions[i : i + 1],
                                                                {k: v[i : i + 1] for k, v in columns.items()}, one),
                                               completions[i : i + 1])[0])
                except RewardError:
                    raise
                except Exception:
                    scores.append(0.0)
                    errors += 1
        scores = check_scores(comp.name, scores, completions)
        values = torch.tensor([math.nan if s is None else s for s in scores], dtype=torch.float32)  # (N,)
        per_component[comp.name] = values
        total += comp.weight * torch.nan_to_num(values, nan=0.0)
    if n and per_component and all(torch.isnan(v).all() for v in per_component.values()):
        _warn_nothing_scored(list(per_component), n)
    if not torch.isfinite(total).all():
        raise RewardError(f"the weighted reward total overflows float32 (components {', '.join(per_component)} with "
                          f"weights {', '.join(f'{c.weight:g}' for c in components)}); scale the rewards or weights "
                          "down")
    return total, per_component, errors


def _describe_failure(comp, prompts, completions, columns, extra, exc) -> str:
    for i in range(len(completions)):
        try:
            _call(comp, prompts[i : i + 1], completions[i : i + 1], {k: v[i : i + 1] for k, v in columns.items()},
                  {k: _subset(v, i) for k, v in extra.items()})
        except Exception as inner:
            return (
                f"reward '{comp.name}' raised {type(inner).__name__}: {inner} on completion {_shown(completions[i])} "
                f"(set reward.on_error=zero to score such completions 0 and count them)"
            )
    return f"reward '{comp.name}' raised {type(exc).__name__}: {exc} (set reward.on_error=zero to score failures 0)"
