"""Stop a run whose environment fails every episode (issue 31).

An environment that raises, or returns a reward that is not a number, ends its own episode with `Episode.error`
set and the other episodes go on (rlx/rollout/env.py): one flaky episode costs one row. (One whose observation is
not text stops the run at once there: a mistake in its code, not bad luck.) When
every episode of `env.stop_after_failed_steps` consecutive training steps failed, the run has nothing to learn
from (every row is empty, every update skipped) and would otherwise go on for its whole length: it stops with
one line quoting the first error of the streak, the environment's class and how many episodes failed the same
way (EpisodesFailed, exit code 1; the metrics rows of the earlier steps, env/errors included, stay written).
0 turns the check off. The same watch serves any producer of episodes (environments, the harness, agent SFT).

It also stops a step that has no token to train on although not every episode failed (issue 36): every episode
ended before its first turn (no room left in env.max_total_tokens, or an error) or sampled nothing. Such a step
would take an update on an empty loss, and a run of them exits 0 having trained nothing: one line instead
(UserError, exit code 2), counting the episodes by cause.
"""

from __future__ import annotations

from collections.abc import Callable

from rlx.errors import EpisodesFailed, UserError


def error_kind(error: str) -> str:
    """`reset: ValueError: reset() returned ...` -> `reset: ValueError` (where it failed, and the exception type)."""
    return ": ".join(error.split(": ")[:2])


def environment_name(factory: Callable | None) -> str:
    """`module.Class` of the environments `factory` makes ('an unknown environment' when it cannot make one)."""
    try:
        kind = type(factory())
    except Exception:
        return "an unknown environment"
    return f"{kind.__module__}.{kind.__qualname__}"


def trainable_tokens(episode) -> int:
    """Tokens of `episode` in the loss (its own and its fork rows')."""
    return sum(episode.loss_mask) + sum(sum(fork.loss_mask) for fork in getattr(episode, "forks", ()))


def no_tokens_message(step: int, episodes: list, environment: str) -> str:
    """One line: why none of a step's episodes has a token to train on, counted by cause."""
    failed = [e.error for e in episodes if e.error is not None]
    cut = sum(e.error is None and bool(getattr(e, "budget_cut", False)) for e in episodes)
    empty = len(episodes) - len(failed) - cut
    causes = [f"{cut} had no room for a first turn within env.max_total_tokens"] if cut else []
    if failed:
        causes.append(f"{len(failed)} ended in an error (the first: {(failed[0].splitlines() or [''])[0]})")
    if empty:
        causes.append(f"{empty} sampled no token")
    fix = ("raise env.max_total_tokens or shorten the environment's observations" if cut else
           "fix the environment" if failed else "check the model's stop tokens and env.max_new_tokens")
    return (f"step {step} has no token to train on: none of its {len(episodes)} episodes of {environment} sampled a "
            f"token the loss keeps ({'; '.join(causes)}); an update would learn nothing, so the run stops: {fix}")


class EpisodeFailureWatch:
    """Counts consecutive training steps in which every episode failed; raises EpisodesFailed at `patience`, and
    UserError at once for a step with no token to train on that not every failure explains.
    factory: makes one environment, only to name its class in the message."""

    def __init__(self, patience: int | None, factory: Callable | None = None):
        self.patience = int(patience or 0)
        self.factory = factory
        self.streak: list[tuple[int, list[str]]] = []  # (step, the errors of its episodes), consecutive steps

    def observe(self, step: int, episodes: list) -> None:
        """Record one step's episodes (all processes' episodes, so every process stops at the same step)."""
        errors = [episode.error for episode in episodes]
        if not errors or any(error is None for error in errors):
            self.streak = []
            if errors and not any(map(trainable_tokens, episodes)):  # the one place a step's loss is judged empty
                raise UserError(no_tokens_message(step, episodes, environment_name(self.factory)))
            return
        if not self.patience:  # every episode failed, and the user chose to train on regardless
            return
        self.streak.append((step, errors))
        if len(self.streak) >= self.patience:
            raise EpisodesFailed(self.message())

    def message(self) -> str:
        first_step, first_errors = self.streak[0]
        first = (first_errors[0].splitlines() or [""])[0]
        every = [error for _, errors in self.streak for error in errors]
        same = sum(error_kind(error) == error_kind(first) for error in every)
        steps = f"step {first_step}" if len(self.streak) == 1 else f"steps {first_step}-{self.streak[-1][0]}"
        return (f"every episode of {steps} failed ({len(every)} episodes; "
                f"env.stop_after_failed_steps={self.patience}): the first, at step {first_step}, in "
                f"{environment_name(self.factory)}: {first}; {same} of {len(every)} episodes failed with "
                f"{error_kind(first)}. Nothing can be learned from failed episodes: fix the environment, or set "
                "env.stop_after_failed_steps=0 to train on regardless")
