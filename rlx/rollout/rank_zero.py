"""Rank 0 samples, every rank trains: the producer of a multi-process run whose rows come from a vLLM server
(rollout=server), from a pipeline's background thread (rollout.max_staleness > 0), from partial rollouts' pool of
carried groups (rollout.partial), or through the producer's group stages, dynamic sampling or the temperature
schedule, which read a step's whole set of groups (rlx/config/async_rules.py rank_zero_reason names the knob).

Why rank 0 alone. The server is one fleet the trainer drives over HTTP, and the pipeline's producer thread samples
while the trainer thread trains: a producer that gathered rewards across processes (the sharded single-turn path,
rlx/rollout/single_turn.py) would run its collectives on the producer thread while the update runs the update's
on the trainer thread, in an order no two ranks agree on. The stages, dynamic sampling and partial rollouts keep
state per prompt (a replay buffer, pass rates, carried groups) and decide over a step's groups together: run on
rank 0 over the global batch, they decide exactly what one process decides, and the other ranks wait for the
broadcast instead of sampling their shard (generation is then rank 0's alone; the update stays data-parallel). So the
producer runs on rank 0 only, built without an accelerator (no collective inside it: HTTP to the server, rewards scored
on rank 0, the step's metrics over the whole batch), and the trainer thread of every rank takes part in one collective
per step, `produce`: rank 0's Batch (the full global batch) is broadcast (torch.distributed.broadcast_object_list over
the run's process group) and each rank keeps its contiguous shard of the rows (`shard_batch`, the shard
runtime.parallel.shard gives the sharded path), with the rewards, groups and verdicts over the global batch, as the
loops expect.

Weights. The server generator (and its child server) exists on rank 0 only; the other ranks hold a
`FollowerGenerator` whose publish does nothing: under DDP every rank holds the full parameters, so rank 0 publishes
its own after each update. Under FSDP2 with rollout=server (`GatheredPublish`), every publish gathers the full
weights from the shards (a collective of every rank, parameter by parameter into rank 0's CPU memory), rank 0
loads them into its full CPU copy of the policy and publishes that. Rank 0 sampling with its own weights (the
policy generating, rollout=hf) under a sharded strategy, and DeepSpeed, are refused by the config rules
(rlx/config/async_rules.py). Evaluation: rank 0 evaluates every held-out row
through the run's generator and broadcasts the metrics (`rank_zero_eval`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlx.engines.generator import Continuation, QuietLifecycle
from rlx.engines.records import Generation
from rlx.rollout.types import Batch, EpisodeRows, HintedContext, PromptRows


def broadcast_object(obj, acc):
    """rank 0's `obj` on every rank (one broadcast_object_list over the run's default process group)."""
    import torch.distributed as dist

    box = [obj if acc.process_index == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shard_batch(batch: Batch, acc) -> Batch:
    """This rank's contiguous shard of a global Batch (rows r*n .. (r+1)*n of N = n x processes): the rollout,
    the rows' sources and sampling context; rewards, groups and verdicts stay global."""
    if isinstance(batch.source, EpisodeRows):
        return shard_episodes(batch, acc)
    total, processes = batch.rewards.numel(), acc.num_processes
    if total % processes or len(batch.rollout) != total:
        raise RuntimeError(f"rank 0's batch of {total} rows ({len(batch.rollout)} in its rollout) does not split "
                           f"over {processes} processes")
    per = total // processes
    local = slice(acc.process_index * per, (acc.process_index + 1) * per)
    index = torch.arange(local.start, local.stop)
    source = batch.source
    if not isinstance(source, PromptRows):
        raise RuntimeError(f"rank 0's producer hands {type(source).__name__}; only single-turn rows are sharded")
    context = batch.context
    if isinstance(context, HintedContext):
        context = HintedContext(context.rollout.select(index))
    return replace(batch, rollout=batch.rollout.select(index), local=local, context=context,
                   source=PromptRows(source.rows[local], source.prompts[local]))


def shard_episodes(batch: Batch, acc) -> Batch:
    """This rank's shard of a global batch of episodes: episodes r*n .. (r+1)*n (whole tasks: n is a multiple of the
    group size, as prompts_per_step splits over the processes), their rows in the order the sharded episode producer
    gives them (the episodes, then each one's fork rows), row_episode counted from the shard's first episode."""
    source, processes = batch.source, acc.num_processes
    episodes = len(source.episodes)
    if episodes % processes or batch.rewards.numel() != episodes:
        raise RuntimeError(f"rank 0's batch of {episodes} episodes does not split over {processes} processes")
    per = episodes // processes
    local = slice(acc.process_index * per, (acc.process_index + 1) * per)
    owner = source.row_episode  # (R,) the episode of each global row: the episodes first, then their forks
    mine = (owner >= local.start) & (owner < local.stop)
    index = torch.cat([torch.arange(local.start, local.stop), torch.nonzero(mine).flatten()[per:]])
    return replace(batch, rollout=batch.rollout.select(index), local=local,
                   source=EpisodeRows(source.episodes, owner[index] - local.start))


class _NotSaved:
    """A checkpointed object of ranks other than 0: checkpoints hold rank 0's producer state (Accelerate writes the
    main process's custom objects only), so these ranks save nothing and restore nothing."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class RankZeroProducer:
    """The producer interface around `inner`, which samples the GLOBAL batch on rank 0 (on the other ranks `inner`
    is never asked for a batch: it gives the loss width and the names of the checkpointed objects)."""

    def __init__(self, inner, acc, checkpoint_names: list[str] | None = None):
        self.inner, self.acc = inner, acc
        self.main = acc.process_index == 0
        self.names = list(checkpoint_names) if checkpoint_names is not None else list(inner.checkpointed())

    @property
    def loss_width(self) -> int:
        return self.inner.loss_width

    def checkpointed(self) -> dict:
        return self.inner.checkpointed() if self.main else {name: _NotSaved() for name in self.names}

    def produce(self, step: int) -> Batch:
        batch = self.inner.produce(step) if self.main else None
        return shard_batch(broadcast_object(batch, self.acc), self.acc)

    def records(self, batch: Batch, samples: list[dict], count: int) -> list[dict]:
        return self.inner.records(batch, samples, count)


class FollowerGenerator(QuietLifecycle):
    """The generator of a rank other than 0 when rank 0 alone samples: nothing to sample with, nothing to publish
    (rank 0 publishes its full DDP parameters), no metrics of its own (rank 0 writes the metrics rows)."""

    def __init__(self):
        self.version = 0

    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int], greedy: bool = False,
                     samples_per_prompt: int = 1, min_new_tokens: int = 0, continuation: Continuation | None = None,
                     schedule: list[float] | None = None) -> Generation:
        raise RuntimeError("only rank 0 samples in this run (rollout=server or pipeline mode with several processes)")

    def publish(self, model, version: int) -> None:
        self.version = version


class GatheredPublish:
    """The generator of every rank of an FSDP2 run whose rank 0 drives the servers: `publish` gathers the policy's
    full weights from the shards on every rank (runtime.parallel.full_state_dict, a collective), rank 0 loads them
    into `shadow`, its full CPU copy of the policy taken before FSDP sharded it, and publishes the copy through
    `inner` (the server generator); on the other ranks `shadow` is None and `inner` a FollowerGenerator. Everything
    else is `inner`'s: the Generator's members by name, the fleet's own (client, score...) through __getattr__."""

    def __init__(self, inner, acc, shadow, prepared):
        self.inner, self.acc, self.shadow = inner, acc, shadow
        self.prepared = prepared  # the prepared policy: DeepSpeed's engine gathers ZeRO-3's shards

    @property
    def version(self) -> int:
        return self.inner.version

    def generate_ids(self, prompts: list[list[int]], *, max_new_tokens: int, seeds: list[int], greedy: bool = False,
                     samples_per_prompt: int = 1, min_new_tokens: int = 0, continuation: Continuation | None = None,
                     schedule: list[float] | None = None) -> Generation:
        return self.inner.generate_ids(prompts, max_new_tokens=max_new_tokens, seeds=seeds, greedy=greedy,
                                       samples_per_prompt=samples_per_prompt, min_new_tokens=min_new_tokens,
                                       continuation=continuation, schedule=schedule)

    def publish(self, model, version: int) -> None:
        from rlx.runtime.parallel import full_state_dict

        # every rank takes part; rank 0 gets the full tensors
        state = full_state_dict(self.acc, self.prepared)
        if self.shadow is not None:
            missing, unexpected = self.shadow.load_state_dict(state, strict=False)
            tied = {name for name in missing if name.endswith(("lm_head.weight", "embed_out.weight"))}
            if unexpected or set(missing) - tied:  # a tied head appears once in the gathered dict
                raise RuntimeError(f"the gathered weights do not fit rank 0's copy of the policy: missing "
                                   f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
            self.inner.publish(self.shadow, version)
        else:
            self.inner.publish(model, version)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def rank_zero_eval(acc, run_eval, rows: int):
    """run_eval(step) -> metrics of every rank: rank 0 evaluates all `rows` held-out rows alone (`run_eval`, built
    without an accelerator) and broadcasts the metrics. The other ranks draw the rows' seeds as rank 0 does (the
    evaluation draws them from the torch RNG), so every rank's RNG moves as in a one-process run."""

    def evaluate(step: int) -> dict:
        if acc.process_index == 0:
            metrics = run_eval(step)
        else:
            metrics = None
            if rows:
                torch.randint(0, 2**31 - 1, (rows,))
        return broadcast_object(metrics, acc)

    return evaluate
