"""The one builder: from the config, every part a training loop starts from.

`LOOPS` maps `algorithm.family` to its loop; `NEEDS` says what each family needs built; `build_parts` builds
the optimizers and schedules, the reference, the critic, the rollout generator, the checkpointer, the metrics
log and the evaluator, in the order the RNG draws and Accelerate's bookkeeping depend on.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from rlx.algorithms.advantages import group_count
from rlx.algorithms.mixture import build_mixer
from rlx.algorithms.preference import REFERENCE_FREE
from rlx.config.async_rules import gathers_to_publish, rank_zero_reason
from rlx.config.schema import TrainConfig
from rlx.data.sources import prompt_source
from rlx.engines.generator import policy_generator
from rlx.envs import env_factory
from rlx.errors import EnvError, UserError
from rlx.evaluation.agents import episode_evaluator, player_for
from rlx.evaluation.tasks import task_eval_settings, task_evaluator
from rlx.fleet.backends import build_generator, eval_generator
from rlx.loops.agent_sft import train_agent_sft
from rlx.loops.common import Components, Parts
from rlx.loops.policy_gradient import train_policy_gradient
from rlx.loops.ppo import train_ppo
from rlx.loops.preference import load_pairs, train_preference
from rlx.loops.reward_model import train_reward_model
from rlx.loops.sft import train_sft
from rlx.models import lora, value
from rlx.rewards.overlong import with_overlong_penalty
from rlx.rollout.episodes import EpisodeProducer, EpisodeSettings
from rlx.rollout.overlap import StepOverlap
from rlx.rollout.partial import PartialProducer, Rounds
from rlx.rollout.pipeline import pipelined, rollout_copy
from rlx.rollout.producers import AUTO, PRODUCERS
from rlx.rollout.rank_zero import FollowerGenerator, GatheredPublish, RankZeroProducer, rank_zero_eval
from rlx.rollout.single_turn import SingleTurnProducer, SingleTurnSettings
from rlx.rollout.stages import StagePipeline, StageSettings, build_stages
from rlx.runtime.checkpoint import Checkpointer
from rlx.runtime.optim import build_optimizer, optimizer_settings
from rlx.runtime.rundir import MetricsLog

log = logging.getLogger("rlx")

# algorithm.family -> its training loop; the agent family is the policy-gradient loop on episodes
LOOPS = {
    "policy_gradient": train_policy_gradient,
    "ppo": train_ppo,
    "sft": train_sft,
    "preference": train_preference,
    "reward_model": train_reward_model,
    "agent": train_policy_gradient,
    "agent_sft": train_agent_sft,
}
FAMILIES = tuple(LOOPS)


def _one(algo) -> int:
    return 1


def _epochs_x_mini_batches(algo) -> int:
    return algo.epochs * algo.mini_batches


def _never(algo) -> bool:
    return False


def _kl_reference(algo) -> bool:  # the frozen starting policy of the KL term: not built when kl_coef is 0
    return algo.kl_coef > 0


def _preference_reference(algo) -> bool:  # reference=precompute keeps log-probs, not a model
    return algo.loss_type not in REFERENCE_FREE and algo.reference == "model"


@dataclass(frozen=True)
class FamilyNeeds:
    """What build_parts builds for a family. updates_per_step: optimizer steps per training step (the
    length of the learning-rate schedule is steps x that); reference: whether a frozen reference model
    is kept; value_model: PPO's critic; producer: the rows the loop trains on ("single_turn" | "episodes" |
    None: the loop reads its own data); generator: a Generator is built (rollout.backend); evaluator: the
    held-out evaluation ("task" | "episodes" | None: the loop's own); prepare_scheduler: the schedule goes
    through accelerate.prepare (DeepSpeed then steps and saves it) rather than to the Checkpointer; pairs:
    the preference pairs are tokenized (and their reference log-probs precomputed) on the unprepared policy."""

    updates_per_step: Callable = _one
    reference: Callable = _never
    value_model: bool = False
    producer: str | None = None
    generator: bool = False
    evaluator: str | None = None
    prepare_scheduler: bool = True
    pairs: bool = False


NEEDS = {
    "policy_gradient": FamilyNeeds(_epochs_x_mini_batches, _kl_reference, producer="single_turn", generator=True,
                                   evaluator="task"),
    "ppo": FamilyNeeds(_epochs_x_mini_batches, _kl_reference, value_model=True, producer="single_turn", generator=True,
                       evaluator="task", prepare_scheduler=False),
    "agent": FamilyNeeds(_epochs_x_mini_batches, _kl_reference, producer="episodes", generator=True,
                         evaluator="episodes", prepare_scheduler=False),
    "agent_sft": FamilyNeeds(generator=True, evaluator="episodes", prepare_scheduler=False),
    "sft": FamilyNeeds(),
    "preference": FamilyNeeds(reference=_preference_reference, pairs=True),
    "reward_model": FamilyNeeds(),
}
assert set(NEEDS) == set(LOOPS)


def build_parts(s: TrainConfig, components: Components) -> Parts:
    """The one builder: from the loaded model, tokenizer, data and rewards (rlx.loops.common.Components),
    every part the family's loop starts from (rlx.loops.common.Parts), as declared in NEEDS, from the run's typed
    settings `s` (rlx/config/settings.py), which the loop then reads. One log line per part built.

    Order (the RNG draws and Accelerate's bookkeeping depend on it): the critic (its fresh head draws
    from the global RNG), the preference pairs, the optimizers and schedules, the reference (a copy taken from
    the full, unprepared weights; under LoRA the policy with its adapter off, no copy), the generator, then
    one accelerate.prepare of policy, optimizer[, schedule][, critic, critic optimizer] (DeepSpeed and
    FSDP prepare a model with its optimizer; the checkpointer saves the adapter of the first model), the
    reference placed like the prepared policy, the producer, the checkpointer, the metrics log and the evaluator."""
    family = s.algorithm.family
    needs, algo, acc = NEEDS[family], s.algorithm, components.accelerator
    parts = Parts(s, acc, components.model, components.tokenizer, components.train_rows, components.eval_rows,
                  components.rewards, components.run_dir)
    total_updates = s.steps * needs.updates_per_step(algo)
    if needs.value_model:
        parts.value_model = value.build_value_model(parts.model, algo.value_model, s.model.dtype,
                                                    s.model.trust_remote_code)
        log.info("built: value model (critic) from %s", algo.value_model or "the policy's backbone")
    if needs.pairs:
        parts.pairs = load_pairs(s, parts)
    reference = lora.reference_model(parts.model) if needs.reference(algo) else None
    optim = optimizer_settings(s.optim)
    parts.optimizer, parts.scheduler = build_optimizer(parts.model, total_updates, **optim)
    log.info("built: %s over the trainable parameters, %s schedule for %d optimizer steps",
             type(parts.optimizer).__name__, s.optim.schedule, total_updates)
    if needs.value_model:
        value_lr = value.value_learning_rate(algo.value_lr, algo.value_lr_ratio, s.optim.lr)
        parts.value_optimizer, parts.value_scheduler = build_optimizer(parts.value_model, total_updates,
                                                                       **{**optim, "lr": value_lr})
    follower = needs.producer is not None and rank_zero_samples(s, acc) and acc.process_index != 0
    rollout_model, rollout_parts = build_sampler(s, parts, needs, follower)
    prepared = [parts.model, parts.optimizer] + ([parts.scheduler] if needs.prepare_scheduler else [])
    if needs.value_model:
        prepared += [parts.value_model, parts.value_optimizer]
    prepared = acc.prepare(*prepared)
    parts.model, parts.optimizer = prepared[0], prepared[1]
    if needs.prepare_scheduler:
        parts.scheduler = prepared[2]
    else:
        parts.checkpointed["scheduler"] = parts.scheduler
    if needs.value_model:
        parts.value_model, parts.value_optimizer = prepared[-2], prepared[-1]
        parts.checkpointed["value_scheduler"] = parts.value_scheduler
    if isinstance(parts.generator, GatheredPublish):
        parts.generator.prepared = parts.model  # the gather reads the prepared model (DeepSpeed's engine)
    parts.reference = lora.place_reference(reference, acc)
    if reference is not None:
        log.info("built: frozen reference (%s)",
                 "the base with the adapter off" if lora.is_peft(acc.unwrap_model(parts.model))
                 else "a copy of the starting policy")
    if needs.producer is not None:
        build_producer(s, parts, needs.producer, (rollout_model, rollout_parts), follower)
    if family == "policy_gradient" and getattr(s, "mixture", None) is not None:
        parts.mixer = build_mixer(s.mixture, parts.train_rows)
        if parts.mixer is not None:
            log.info("built: mixture %s over objectives %s", s.mixture.rule, ", ".join(parts.mixer.objectives))
    parts.checkpointer = Checkpointer.from_config(s, acc, parts.run_dir, lora=lora)  # a LoRA adapter in each checkpoint
    parts.metrics_log = MetricsLog(parts.run_dir, s.steps, s.log.progress, enabled=acc.is_main_process, tracker=acc)
    if needs.evaluator is not None and rank_zero_samples(s, acc):
        # rank 0 evaluates every held-out row (episode) through its generator (the others have none) and broadcasts
        # the metrics; the task evaluation draws a seed per row from the torch RNG, which the other ranks draw too
        run_eval = EVALUATORS[needs.evaluator](s, parts, alone=True) if not follower else None
        rows = len(parts.eval_rows[: s.eval.size]) if needs.evaluator == "task" else 0
        parts.run_eval = rank_zero_eval(acc, run_eval, rows)
        log.info("built: evaluator %s on rank 0", needs.evaluator)
    elif needs.evaluator is not None:
        parts.run_eval = EVALUATORS[needs.evaluator](s, parts)
        log.info("built: evaluator %s", needs.evaluator)
    return parts


def build_sampler(s, parts: Parts, needs: FamilyNeeds, follower: bool) -> tuple:
    """The generator (parts.generator) and what it samples with: (the rollout model, the parts the producer is
    built from). The policy itself, or in pipeline mode copies of the policy and the tokenizer (the producer
    thread's own: a fast tokenizer's padding settings are not thread-safe). With several processes and a server
    or a pipeline, rank 0 alone samples the global batch, without collectives, and broadcasts it
    (rlx/rollout/rank_zero.py): the producer's parts carry no accelerator, and the other ranks (`follower`) build
    no generator and no rollout copy."""
    acc = parts.accelerator
    rollout_model, rollout_parts = parts.model, parts
    if rank_zero_samples(s, acc):
        rollout_parts = replace(parts, accelerator=None)
    if needs.generator and follower:
        parts.generator = FollowerGenerator()
        log.info("built: no generator on this rank (rank 0 samples every row and broadcasts them)")
    elif needs.generator:  # on the unprepared policy: Accelerate's prepare keeps the same module object
        if needs.producer is not None and s.rollout.max_staleness:
            rollout_model = rollout_copy(parts.model)
            rollout_parts = replace(rollout_parts, tokenizer=copy.deepcopy(parts.tokenizer))
        parts.generator = build_generator(s.rollout, rollout_model, rollout_parts.tokenizer, s.seed)
        log.info("built: generator rollout=%s (%s)%s", s.rollout.backend, type(parts.generator).__name__,
                 " on a copy of the policy (pipeline mode)" if rollout_model is not parts.model else "")
    if needs.generator and gathers_to_publish(s):  # the copy is taken before FSDP / ZeRO-3 shard the policy
        shadow = copy.deepcopy(parts.model).eval().requires_grad_(False).cpu() if acc.process_index == 0 else None
        parts.generator = GatheredPublish(parts.generator, acc, shadow)
        log.info("built: publishing gathers the full weights from the shards into rank 0's CPU copy of the policy")
    return rollout_model, rollout_parts


def build_producer(s, parts: Parts, kind: str, sampler: tuple, follower: bool) -> None:
    """parts.producer of `kind` (BUILT_IN_PRODUCERS, or rollout.producer's) on the sampler's parts, then wrapped:
    pipeline mode samples ahead in a thread (rlx/rollout/pipeline.py; parts.generator becomes the pipeline's), rank 0
    broadcasts the batch."""
    acc = parts.accelerator
    rollout_model, rollout_parts = sampler
    # the producer samples through the generator itself; the gather around it (GatheredPublish) is the trainer's publish
    rollout_parts.generator = parts.generator.inner if isinstance(parts.generator, GatheredPublish) else parts.generator
    own = s.rollout.producer != AUTO
    # the loop checks the rows of its first batch (rlx/loops/credit.py require_rows)
    parts.producer = (PRODUCERS[s.rollout.producer] if own else BUILT_IN_PRODUCERS[kind])(s, rollout_parts)
    log.info("built: producer %s", s.rollout.producer if own else kind)
    if s.rollout.max_staleness and not follower:
        policy = acc.unwrap_model(parts.model)
        gathered = parts.generator if isinstance(parts.generator, GatheredPublish) else None
        # sharded weights: the pipeline's producer thread samples with its own copy and never joins the gather, which
        # stays outermost on the trainer thread; evaluation samples rank 0's gathered copy of the current policy
        current = policy_generator(gathered.shadow if gathered else policy, parts.tokenizer, s.rollout)
        inner, sampler_generator = parts.producer, gathered.inner if gathered else parts.generator
        parts.producer, parts.generator = pipelined(s.rollout, inner, sampler_generator, rollout_model, policy, current,
                                                    s.steps)
        if getattr(getattr(s.rollout, "server", None), "overlap_steps", False):  # rounds of two steps at once
            inner.overlap = StepOverlap(sampler_generator, parts.producer.weights_ahead,
                                        s.rollout.server.per_server_concurrency)
            log.info("built: rounds overlap across steps on servers of two weight versions "
                     "(rollout.server.overlap_steps)")
        if gathered is not None:
            gathered.inner, parts.generator = parts.generator, gathered
        log.info("built: pipeline, batches sampled up to %d update(s) behind the trainer", s.rollout.max_staleness)
    if rank_zero_samples(s, acc):
        parts.producer = RankZeroProducer(parts.producer, acc, ["pipeline"] if s.rollout.max_staleness else None)
        log.info("built: rank 0 samples the global batch and broadcasts it (%s); each rank trains its shard",
                 rank_zero_reason(s, acc.num_processes))


def rank_zero_samples(s, acc) -> bool:
    """True when rank 0 alone samples and broadcasts each step's batch (rlx/rollout/rank_zero.py): several processes
    with rollout=server, pipeline mode, partial rollouts, or the producer's group stages (rank_zero_reason in
    rlx/config/async_rules.py; the config rules allow it for the single-turn families under DDP)."""
    return rank_zero_reason(s, acc.num_processes) is not None


def environment_factory(env):
    """A zero-argument callable making a fresh environment of the `env` settings (one line for a bad one)."""
    try:
        return env_factory(env.name, env.target, env.kwargs)
    except EnvError as exc:
        raise UserError(str(exc)) from None


def single_turn_producer(s, parts: Parts) -> SingleTurnProducer | PartialProducer:
    algo, roll = s.algorithm, s.rollout
    # the completions per prompt: an estimator's declared extra samples too (median's pivot, left out of the gradient)
    group_size = group_count(roll.samples_per_prompt, algo.advantage)
    rewards = with_overlong_penalty(parts.rewards, algo.overlong_buffer, algo.overlong_weight, roll.max_new_tokens)
    stages, source = seed_stages(s, parts, rewards, group_size)
    if roll.partial:  # partial rollouts: groups carried across steps (rlx/rollout/partial.py); the stages run on the
        # groups each step finishes (the temperature schedule and prompt sampling are refused:
        # rlx/config/async_rules.py)
        # rank 0 alone produces where it samples for every rank (no accelerator here), so only it writes the journal
        main = parts.accelerator is None or parts.accelerator.is_main_process
        journal = parts.run_dir / "rounds.jsonl" if roll.segment_tokens and main else None
        return PartialProducer(parts.generator, parts.tokenizer, source, rewards, single_turn_settings(s, group_size),
                               oversample=roll.partial_oversample, stages=stages,
                               rounds=Rounds(int(roll.segment_tokens), journal))
    return SingleTurnProducer(parts.generator, parts.tokenizer, source, rewards, single_turn_settings(s, group_size),
                              acc=parts.accelerator, stages=stages)


def single_turn_settings(s, group_size: int) -> SingleTurnSettings:
    """The SingleTurnSettings of the typed settings, with `group_size` completions per prompt."""
    roll, algo = s.rollout, s.algorithm
    return SingleTurnSettings(
        group_size=group_size, prompts_per_step=s.prompts_per_step, max_new_tokens=roll.max_new_tokens,
        min_new_tokens=roll.min_new_tokens, seed=s.seed, use_chat_template=s.model.chat_template,
        system_prompt=s.data.system_prompt, on_error=s.reward.on_error, accuracy_key=s.reward.accuracy,
        total_steps=s.steps, dynamic_sampling=algo.dynamic_sampling, max_draws=algo.max_sample_batches,
        completion_template=s.data.completion_template)


def seed_stages(s, parts: Parts, rewards, group_size: int):
    """The seed ideas' group stages of the single-turn producer (rlx/rollout/stages/; None when all are
    off) and the prompt source (rlx/data/sources.py, algorithm.prompt_sampling.source: the shuffled stream, the
    difficulty-aware sampler, or a plugin's)."""
    algo = s.algorithm
    weight = next((c.weight for c in rewards if c.name == s.reward.accuracy), 1.0)
    stages = StagePipeline(build_stages(StageSettings(algo, s.rollout, s.reward.accuracy, weight, group_size),
                                        algo.stages),
                           algo.dynamic_sampling_drop)
    name, source = prompt_source(parts.train_rows, s)
    if name != "stream":
        log.info("built: prompt source %s over %d training rows", name, len(parts.train_rows))
    if not stages.active:
        return None, source
    log.info("built: group stages (%s)", ", ".join(stages.describe()))
    return stages, source


def episode_producer(s, parts: Parts) -> EpisodeProducer:
    play_fn, extra_metrics = player_for(s.env)  # env=harness: the user's program through the gateway
    settings = EpisodeSettings(group_size=s.rollout.samples_per_prompt, prompts_per_step=s.prompts_per_step,
                               seed=s.seed, use_chat_template=s.model.chat_template)
    return EpisodeProducer(parts.generator, parts.tokenizer, environment_factory(s.env), s.env, settings,
                           acc=parts.accelerator, play_fn=play_fn, extra_metrics=extra_metrics)


def task_eval(s, parts: Parts, *, alone: bool = False):
    """Held-out task rows decoded through the generator of rollout.backend (eval_generator), greedily; `alone`: this
    process evaluates every row, without collectives (rank 0 when it alone samples; with sharded weights it decodes
    its gathered copy of the current policy, whose forward is no collective)."""
    gathered = isinstance(parts.generator, GatheredPublish) and parts.generator.shadow is not None and alone
    policy = parts.generator.shadow if gathered else parts.accelerator.unwrap_model(parts.model)
    generator = eval_generator(s.rollout.backend, parts.generator, policy, parts.tokenizer, s.eval.batch_size)
    return task_evaluator(None if alone else parts.accelerator, generator, parts.tokenizer,
                          parts.eval_rows[: s.eval.size], parts.rewards, task_eval_settings(s))


def episode_eval(s, parts: Parts, *, alone: bool = False):
    """Held-out episodes of the env; `alone`: this process plays every one, without collectives (rank 0 when it
    alone samples)."""
    play_fn, extra_metrics = player_for(s.env)
    return episode_evaluator(None if alone else parts.accelerator, parts.generator, parts.tokenizer,
                             environment_factory(s.env), s.env,
                             use_chat_template=s.model.chat_template, play_fn=play_fn, extra_metrics=extra_metrics)


# the rows a loop trains on (rollout.producer=auto), and its held-out evaluation: FamilyNeeds.producer / .evaluator ->
# fn(settings, parts); a user's producer comes from rlx.rollout.producers.PRODUCERS (rollout.producer=NAME)
BUILT_IN_PRODUCERS = {"single_turn": single_turn_producer, "episodes": episode_producer}
EVALUATORS = {"task": task_eval, "episodes": episode_eval}


def deepspeed_plugin(s: TrainConfig, accumulation: int):
    """Accelerate's DeepSpeedPlugin with rlx's own config (rlx.runtime.parallel.deepspeed_config), or None."""
    hw = s.hardware
    if hw.distributed != "deepspeed":
        return None
    from accelerate.utils import DeepSpeedPlugin

    from rlx.runtime import launch
    from rlx.runtime.parallel import ZeroSettings, deepspeed_config

    ds = hw.deepspeed
    zero = ZeroSettings(ds.zero_stage, ds.offload_optimizer_device, ds.offload_param_device,
                        ds.param_persistence_threshold)
    config = deepspeed_config(zero, s.micro_batch_size, accumulation, launch.world_size(hw), s.optim.max_grad_norm,
                              hw.mixed_precision)
    return DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=bool(ds.zero3_init_flag and ds.zero_stage == 3))


def process_group_kwargs(s: TrainConfig) -> list:
    """DeepSpeed without a GPU: Accelerate finds no backend for hardware.cpu=false, so name gloo."""
    if s.hardware.distributed != "deepspeed" or torch.cuda.is_available():
        return []
    from accelerate.utils import InitProcessGroupKwargs

    return [InitProcessGroupKwargs(backend="gloo")]


def describe_data_source(data_cfg) -> str:
    """How error messages name the data: the file or hub id a row came from."""
    for key in ("train_path", "id", "task"):
        if getattr(data_cfg, key, None):
            return f"data.{key}={getattr(data_cfg, key)}"
    return f"data.source={getattr(data_cfg, 'source', None)}"


def build_model_and_tokenizer(cfg: TrainConfig, train_rows: list[dict]):
    from rlx.models.loading import load_causal_lm, load_tokenizer
    from rlx.rollout.prompts import format_prompts

    if cfg.model.build is not None:  # a fresh tiny model whose tokenizer learns the task's own text
        from rlx.models.tiny import build_model, build_tokenizer

        build = cfg.model.build
        rows = train_rows[: build.corpus_size]
        probe = build_tokenizer(["x"], 300)  # only its chat template is used to render the corpus
        prompts = format_prompts(probe, rows, cfg.model.chat_template, cfg.data.system_prompt)
        targets = [cfg.data.completion_template.format(answer=r["answer"]) for r in rows]
        tokenizer = build_tokenizer([p + t for p, t in zip(prompts, targets)], build.vocab_size)
        model = build_model(
            tokenizer, hidden_size=build.hidden_size, num_layers=build.num_layers, num_heads=build.num_heads,
            intermediate_size=build.intermediate_size, max_position_embeddings=build.max_position_embeddings,
            seed=cfg.seed,
        )
        return model, tokenizer
    if cfg.model.path is None:
        raise UserError("model.path is null and model.build is not set; pick model=tiny or set model.path")
    tokenizer = load_tokenizer(cfg.model.path, cfg.model.revision, cfg.model.trust_remote_code)
    if cfg.algorithm.family == "reward_model":  # scalar head on the same backbone (fresh when it is a causal LM)
        from rlx.rewards.model import load_sequence_classifier

        model = load_sequence_classifier(cfg.model.path, cfg.model.dtype, pad_token_id=tokenizer.pad_token_id)
    else:
        model = load_causal_lm(cfg.model.path, cfg.model.dtype, cfg.model.revision, cfg.model.trust_remote_code)
    return model, tokenizer


