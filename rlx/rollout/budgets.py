"""Token budgets of multi-turn episodes, checked where they can be: at start-up, the model's context against
`env.max_total_tokens` and the first observation against the budget; during the run, a warning (once) when the
budget, not `env.max_turns` or the environment, ends most episodes of a step.

An episode whose first observation alone fills `env.max_total_tokens` plays no turn at all, trains nothing and
scores 0, and a run of such episodes used to end with exit code 0 and `eval/success=0.0000`; a budget above the
model's position limit fails (or extrapolates) inside the model only when an episode gets that long.
"""

from __future__ import annotations

import logging

from rlx.errors import UserError

log = logging.getLogger("rlx")

CHECKED_RESETS = 4  # environments reset at start-up to measure first observations
MOST = 0.5          # the warning fires when more than this fraction of a step's episodes were cut by the budget


def check_context_budget(max_total_tokens: int, context: int | None, model_name: str | None) -> None:
    """env.max_total_tokens must fit the model's positions (max_position_embeddings); None: unknown, no check."""
    if context is not None and max_total_tokens > context:
        raise UserError(f"env.max_total_tokens={max_total_tokens} is more than the {context} positions of model "
                        f"{model_name or '(built)'}; set env.max_total_tokens={context} or less")


def first_prompt_lengths(factory, tokenizer, env_seeds: list[int], system_prompt: str | None,
                         use_chat_template: bool) -> list[int]:
    """Token length of the first prompt (chat template around the first observation, as the episode starts) of
    a fresh environment reset with each seed; a reset that raises is left out (the episode reports it), one that
    hands back no text observation stops here, before the model loads its first batch (UserError)."""
    from rlx.rollout.env import ChatFormat, checked_reset

    fmt = ChatFormat(tokenizer, system_prompt, use_chat_template)
    lengths = []
    for seed in env_seeds:
        try:
            observation, _ = checked_reset(factory(), seed)
        except UserError:
            raise
        except Exception:
            continue
        lengths.append(len(fmt.prompt_ids(observation)))
    return lengths


def check_first_observation(lengths: list[int], max_total_tokens: int, max_new_tokens: int, env_name: str,
                            context: int | None) -> None:
    """Stop when every measured first prompt leaves no token for a first turn; warn when the first turn cannot
    get its full env.max_new_tokens."""
    if not lengths:
        return
    room = f" (the model has {context} positions)" if context is not None else ""
    if min(lengths) >= max_total_tokens:
        needed = max(lengths) + max_new_tokens
        fix = (f"raise env.max_total_tokens to at least {needed}{room} or shorten the observation"
               if context is None or needed <= context else
               f"the model has only {context} positions, so shorten the observation (or use a model with a longer "
               f"context)")
        raise UserError(f"the first observation of env={env_name} takes {min(lengths)} tokens with the chat template, "
                        f"and env.max_total_tokens={max_total_tokens} leaves no room for a single turn; {fix}")
    if max(lengths) + max_new_tokens > max_total_tokens:
        log.warning("the first observation of env=%s takes up to %d tokens: with env.max_total_tokens=%d the first "
                    "turn gets %d of its env.max_new_tokens=%d; raise env.max_total_tokens%s", env_name, max(lengths),
                    max_total_tokens, max(max_total_tokens - max(lengths), 0), max_new_tokens, room)


def check_episode_budget(env, factory, tokenizer, context: int | None, model_name: str | None, env_seeds: list[int],
                         use_chat_template: bool) -> None:
    """Both start-up checks for the `env` settings (max_total_tokens, max_new_tokens, system_prompt)."""
    check_context_budget(int(env.max_total_tokens), context, model_name)
    name = str(getattr(env, "target", None) or env.name).rpartition(".")[2] if env.name == "custom" else env.name
    lengths = first_prompt_lengths(factory, tokenizer, env_seeds[:CHECKED_RESETS], getattr(env, "system_prompt", None),
                                   use_chat_template)
    check_first_observation(lengths, int(env.max_total_tokens), int(env.max_new_tokens), name, context)


def budget_cut_frac(episodes) -> float:
    """Fraction of episodes ended because no token of env.max_total_tokens was left for another turn."""
    return sum(bool(getattr(e, "budget_cut", False)) for e in episodes) / max(len(episodes), 1)


class BudgetWatch:
    """Warns once per run when more than MOST of a step's episodes were ended by env.max_total_tokens."""

    def __init__(self, max_total_tokens: int):
        self.max_total_tokens, self.warned = int(max_total_tokens), False

    def observe(self, step: int, episodes) -> str | None:
        fraction = budget_cut_frac(episodes)
        if self.warned or fraction <= MOST:
            return None
        self.warned = True
        cut = round(fraction * len(episodes))
        message = (f"step {step}: {cut} of {len(episodes)} episodes ran out of env.max_total_tokens="
                   f"{self.max_total_tokens} before the environment or env.max_turns ended them, so the budget, not "
                   f"the policy, decides how they end; raise env.max_total_tokens, lower env.max_new_tokens or "
                   f"shorten the observations (said once; env/budget_cut_frac in metrics.jsonl tracks it)")
        log.warning("%s", message)
        return message
