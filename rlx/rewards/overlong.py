"""DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), as a reward component.

With L_max the generation budget and L_cache the buffer before it:
    R(y) = 0                                 if |y| <= L_max - L_cache
         = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
         = -1                                if |y| > L_max
so the penalty grows linearly from 0 to -1 across the buffer. |y| is the length of each completion's token ids,
which every reward function receives as `completion_ids` (TRL's convention).
"""

from __future__ import annotations

import functools

from rlx.rewards import RewardComponent


def overlong_penalty(prompts, completions, completion_ids=None, *, max_length: int, buffer: int,
                     **row) -> list[float | None]:
    """Example: L_max 16, buffer 4: 12 tokens -> 0, 14 -> -0.5, 16 -> -1, 17 -> -1.
    None (does not apply) when the token ids are not available."""
    if completion_ids is None:
        return [None] * len(completions)
    completion_tokens = [len(ids) for ids in completion_ids]
    if buffer <= 0 or buffer > max_length:
        raise ValueError(f"overlong buffer must be in 1..max_length={max_length}, got {buffer}")
    start = max_length - buffer
    scores = []
    for length in completion_tokens:
        if length <= start:
            scores.append(0.0)
        elif length <= max_length:
            scores.append((start - length) / buffer)
        else:
            scores.append(-1.0)
    return scores


def with_overlong_penalty(rewards: list, overlong_buffer: int, overlong_weight: float, max_new_tokens: int) -> list:
    """The reward components used in training: the configured ones, plus DAPO's overlong punishment as one more
    component ("overlong") when overlong_buffer > 0."""
    components = list(rewards)
    if overlong_buffer > 0:
        fn = functools.partial(overlong_penalty, max_length=max_new_tokens, buffer=overlong_buffer)
        components.append(RewardComponent("overlong", fn, float(overlong_weight)))
    return components
