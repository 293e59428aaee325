"""The episode producer: each step, `prompts_per_step` tasks (environment seeds) with G episodes each, played
turn by turn through the generator (rlx/rollout/env.py), handed to the policy-gradient loop as a `Batch` around
one `Rollout` (the multi-turn counterpart of rollout/single_turn.py). With several processes each plays its
contiguous shard of the tasks (all G episodes of a task on one process; an episode depends only on its seeds),
and the episodes are gathered so the credit rule sees the global batch. Built without an accelerator (acc None:
rank 0 alone plays the global batch for every rank, rlx/rollout/rank_zero.py), it plays every task, no collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate.utils import gather_object

from rlx.algorithms.grouping import fixed_groups
from rlx.engines.records import Episode, Rollout
from rlx.engines.sampling import sample_seed
from rlx.rollout.budgets import BudgetWatch, budget_cut_frac
from rlx.rollout.env import TurnDecoding, play, train_env_seed
from rlx.rollout.failures import EpisodeFailureWatch
from rlx.rollout.types import Batch, EpisodeRows, SameContext, no_verdicts
from rlx.runtime.parallel import shard


def episode_metrics(episodes: list[Episode], prefix: str) -> dict:
    """<prefix>/success|return|turns|invalid_actions|truncated_frac (means over episodes) and errors (count)."""
    n = max(len(episodes), 1)
    return {
        f"{prefix}/success": sum(e.success for e in episodes) / n,
        f"{prefix}/return": sum(sum(e.step_rewards) for e in episodes) / n,
        f"{prefix}/turns": sum(len(e.step_rewards) for e in episodes) / n,
        f"{prefix}/invalid_actions": sum(e.valid.count(False) for e in episodes) / n,
        f"{prefix}/truncated_frac": sum(e.truncated for e in episodes) / n,
        f"{prefix}/errors": sum(e.error is not None for e in episodes),
    }


def episode_records(episodes: list[Episode], count: int, extra: list[dict] | None = None) -> list[dict]:
    """Readable samples files: what the model saw and did in each episode."""
    return [{"observations": e.observations, "actions": e.actions, "rewards": e.step_rewards, "success": e.success,
             "truncated": e.truncated, "error": e.error, **(extra[i] if extra else {})}
            for i, e in enumerate(episodes[:count])]


def training_rows(episodes: list[Episode]) -> tuple[list[Episode], torch.Tensor]:
    """The sequences an update trains: the episodes themselves first (row i is episode i), then every fork
    row of every episode. Returns (rows, owner) with owner (R,) long: the episode each row belongs to."""
    rows, owner = list(episodes), list(range(len(episodes)))
    for i, e in enumerate(episodes):
        rows += e.forks
        owner += [i] * len(e.forks)
    return rows, torch.tensor(owner, dtype=torch.long)


@dataclass(frozen=True)
class EpisodeSettings:
    """What the episode producer plays each step: `prompts_per_step` tasks with `group_size` episodes each, seeded
    from the run's `seed`, the first prompt in the chat template or as plain text."""

    group_size: int
    prompts_per_step: int
    seed: int
    use_chat_template: bool


class EpisodeProducer:
    """Episodes of environments from `factory` (a zero-argument callable making a fresh environment), limits
    from the `env` settings (max_turns, max_new_tokens, max_total_tokens, system_prompt), what to play each step
    from `settings` (EpisodeSettings); play_fn: the env's `play` (rlx.evaluation.agents.player_for)."""

    def __init__(self, generator, tokenizer, factory, limits, settings: EpisodeSettings, *, acc, play_fn=play,
                 extra_metrics=None):
        self.generator, self.tokenizer, self.factory, self.limits = generator, tokenizer, factory, limits
        self.group_size, self.prompts_per_step, self.seed = (settings.group_size, settings.prompts_per_step,
                                                             settings.seed)
        self.use_chat_template, self.acc = settings.use_chat_template, acc
        self.play, self.extra_metrics = play_fn, extra_metrics  # env=harness: its sessions (rlx/gateway/harness.py)
        self.failures = EpisodeFailureWatch(limits.stop_after_failed_steps, factory)  # issue 31: a broken environment
        self.budget_watch = BudgetWatch(limits.max_total_tokens)  # warns once when the budget ends most episodes

    @property
    def loss_width(self) -> int:
        """The longest sequence a row can hold (Dr. GRPO's constant normaliser)."""
        return int(self.limits.max_total_tokens)

    def checkpointed(self) -> dict:
        return {}  # an episode depends only on (seed, step, index): nothing to save

    def produce(self, step: int) -> Batch:
        group = self.group_size
        tasks = shard(self.prompts_per_step, self.acc) if self.acc is not None else slice(0, self.prompts_per_step)
        mine = range(tasks.start * group, tasks.stop * group)  # this process's global episode indices
        env_seeds = [train_env_seed(self.seed, step, i // group) for i in mine]
        sample_seeds = [sample_seed(self.seed, step, i) for i in mine]
        episodes = self.play(self.generator, self.tokenizer, self.factory, self.limits, env_seeds, sample_seeds,
                             TurnDecoding(greedy=False, use_chat_template=self.use_chat_template))
        all_episodes = gather_object(episodes) if self.acc is not None else episodes  # global order
        version = self.generator.version
        rows, row_episode = training_rows(episodes)  # a harness session's fork rows join the batch
        rollout = Rollout.from_episodes(rows, self.tokenizer.pad_token_id, [version] * len(rows))
        self.failures.observe(step, all_episodes)  # every episode failing for several steps stops the run
        returns = torch.tensor([float(sum(e.step_rewards)) for e in all_episodes])  # (N,)
        n = max(len(all_episodes), 1)
        metrics = {
            **episode_metrics(all_episodes, "env"),
            "env/turn_truncated": sum(e.turn_truncated for e in all_episodes) / n,
            "env/budget_cut_frac": budget_cut_frac(all_episodes),
            "completions/tokens_per_episode": sum(sum(e.loss_mask) for e in all_episodes) / n,
            **(self.extra_metrics(all_episodes, "env") if self.extra_metrics is not None else {}),
        }
        if self.acc is None or self.acc.is_main_process:
            self.budget_watch.observe(step, all_episodes)
        return Batch(rollout, returns, group, fixed_groups(returns.numel(), group), no_verdicts(),
                     EpisodeRows(all_episodes, row_episode), SameContext(), slice(mine.start, mine.stop), metrics)

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        """The samples file rows of this process's first `count` episodes (the main process's are the first)."""
        local = batch.source.episodes[batch.local]
        return episode_records(local, count, samples)
