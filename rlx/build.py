"""The one builder: from the config, every part a training loop starts from.

`LOOPS` maps `algorithm.family` to its loop; `NEEDS` says what each family needs built; `build_parts` builds
the optimizers and schedules, the reference, the critic, the rollout generator, the checkpointer, the metrics
log and the evaluator, in the order the RNG draws and Accelerate's bookkeeping depend on.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlx.algorithms.advantages import group_count
from rlx.algorithms.mixture import build_mixer
from rlx.algorithms.preference import REFERENCE_FREE
from rlx.config.async_rules import gathers_to_publish, rank_zero_reason
from rlx.config.schema import TrainConfig
from rlx.data.sources import prompt_source
from rlx.engines.generator import policy_generator, resolved_rollout
from rlx.engines.lane import NO_LANE, SpeculativeLane
from rlx.envs import env_factory
from rlx.errors import EnvError, UserError
from rlx.evaluation.agents import episode_evaluator, player_for
from rlx.evaluation.tasks import task_eval_settings, task_evaluator
from rlx.fleet.backends import build_generator, eval_generator
from rlx.fleet.overlap import StepOverlap, rows_answered
from rlx.loops.agent_sft import train_agent_sft
from rlx.loops.common import (
    Components,
    Critic,
    NoMixer,
    NoReference,
    Parts,
    PolicyParts,
    PPOParts,
    PreferenceParts,
    ProducerParts,
    SamplingParts,
)
from rlx.loops.policy_gradient import train_policy_gradient
from rlx.loops.ppo import train_ppo
from rlx.loops.preference import load_pairs, train_preference
from rlx.loops.reward_model import train_reward_model
from rlx.loops.sft import train_sft
from rlx.models import lora, value
from rlx.rewards.overlong import with_overlong_penalty
from rlx.rollout.episodes import EpisodeProducer, EpisodeSettings
from rlx.rollout.partial import PartialProducer
from rlx.rollout.pipeline import pipelined, rollout_copy
from rlx.rollout.producers import AUTO, PRODUCERS
from rlx.rollout.rank_zero import FollowerGenerator, GatheredPublish, RankZeroProducer, rank_zero_eval
from rlx.rollout.rounds import Rounds
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
    every part the family's loop starts from (rlx.loops.common.Parts or the family's subclass), as declared in
    NEEDS, from the run's typed settings `s` (rlx/config/settings.py), which the loop then reads. One log line per
    part built; each part is built by a function that returns it, and the Parts are made once, at the end.

    Order (the RNG draws and Accelerate's bookkeeping depend on it): the critic (its fresh head draws
    from the global RNG), the preference pairs, the optimizers and schedules, the reference (a copy taken from
    the full, unprepared weights; under LoRA the policy with its adapter off, no copy), the generator, then
    one accelerate.prepare of policy, optimizer[, schedule][, critic, critic optimizer] (DeepSpeed and
    FSDP prepare a model with its optimizer; the checkpointer saves the adapter of the first model), the
    reference placed like the prepared policy, the sampling (producer and its wrappers), the checkpointer, the
    metrics log and the evaluator."""
    s = resolved_rollout(s, components.model)  # rollout.quantize=auto decided for this policy, once
    family = s.algorithm.family
    needs, algo, acc = NEEDS[family], s.algorithm, components.accelerator
    total_updates = s.steps * needs.updates_per_step(algo)
    critic = None
    if needs.value_model:
        critic = value.build_value_model(components.model, algo.value_model, s.model.dtype, s.model.trust_remote_code)
        log.info("built: value model (critic) from %s", algo.value_model or "the policy's backbone")
    pairs = load_pairs(s, components) if needs.pairs else None
    reference = lora.reference_model(components.model) if needs.reference(algo) else None
    optim = optimizer_settings(s.optim)
    optimizer, scheduler = build_optimizer(components.model, total_updates, **optim)
    log.info("built: %s over the trainable parameters, %s schedule for %d optimizer steps",
             type(optimizer).__name__, s.optim.schedule, total_updates)
    if needs.value_model:
        value_lr = value.value_learning_rate(algo.value_lr, algo.value_lr_ratio, s.optim.lr)
        critic_optimizer, critic_scheduler = build_optimizer(critic, total_updates, **{**optim, "lr": value_lr})
    follower = needs.producer is not None and rank_zero_samples(s, acc) and acc.process_index != 0
    sampler = build_sampler(s, components, needs, follower) if needs.generator else None
    prepared = [components.model, optimizer] + ([scheduler] if needs.prepare_scheduler else [])
    if needs.value_model:
        prepared += [critic, critic_optimizer]
    prepared = acc.prepare(*prepared)
    model, optimizer = prepared[0], prepared[1]
    checkpointed = {}
    if needs.prepare_scheduler:
        scheduler = prepared[2]
    else:
        checkpointed["scheduler"] = scheduler
    if needs.value_model:
        critic = Critic(prepared[-2], prepared[-1], critic_scheduler)
        checkpointed["value_scheduler"] = critic_scheduler
    reference = lora.place_reference(reference, acc)
    if reference is not None:
        log.info("built: frozen reference (%s)",
                 "the base with the adapter off" if lora.is_peft(acc.unwrap_model(model)) else "a copy of the starting "
                 "policy")
    common = dict(settings=s, accelerator=acc, model=model, tokenizer=components.tokenizer,
                  train_rows=components.train_rows, eval_rows=components.eval_rows, rewards=components.rewards,
                  run_dir=components.run_dir, optimizer=optimizer, scheduler=scheduler,
                  checkpointer=Checkpointer.from_config(s, acc, components.run_dir, lora=lora),  # a LoRA adapter each
                  metrics_log=MetricsLog(components.run_dir, s.steps, s.log.progress, enabled=acc.is_main_process,
                                         tracker=acc),
                  checkpointed=checkpointed)
    reference = NoReference() if reference is None else reference
    if needs.pairs:
        return PreferenceParts(**common, pairs=pairs, reference=reference)
    if sampler is None:
        return Parts(**common)
    producer, generator = (build_sampling(s, components, model, sampler, needs.producer, follower)
                           if needs.producer is not None else (None, sampler.generator))
    generator = gathered_publish(s, acc, model, sampler, generator)
    run_eval = build_evaluator(s, components, model, generator, needs.evaluator, follower)
    if producer is None:
        return SamplingParts(**common, generator=generator, run_eval=run_eval)
    policy = dict(generator=generator, run_eval=run_eval, producer=producer, reference=reference,
                  mixer=build_mixture(s, components.train_rows) if family == "policy_gradient" else NoMixer())
    return PPOParts(**common, **policy, critic=critic) if needs.value_model else PolicyParts(**common, **policy)


def build_mixture(s, train_rows: list[dict]):
    """mixture.rule's per-objective loss weights (rlx/algorithms/mixture.py), or NoMixer."""
    mixer = build_mixer(s.mixture, train_rows) if getattr(s, "mixture", None) is not None else None
    if mixer is None:
        return NoMixer()
    log.info("built: mixture %s over objectives %s", s.mixture.rule, ", ".join(mixer.objectives))
    return mixer


def build_evaluator(s, components: Components, model, generator, kind: str, follower: bool):
    """The held-out evaluation of `kind` (EVALUATORS). Where rank 0 alone samples it evaluates every held-out row
    (episode) through its generator (the others have none) and broadcasts the metrics; the task evaluation draws a
    seed per row from the torch RNG, which the other ranks draw too."""
    acc = components.accelerator
    inputs = EvalInputs(s, components, model, generator)
    if rank_zero_samples(s, acc):
        run_eval = EVALUATORS[kind](inputs, alone=True) if not follower else None
        rows = len(components.eval_rows[: s.eval.size]) if kind == "task" else 0
        log.info("built: evaluator %s on rank 0", kind)
        return rank_zero_eval(acc, run_eval, rows)
    log.info("built: evaluator %s", kind)
    return EVALUATORS[kind](inputs)


@dataclass(frozen=True)
class Sampler:
    """What the sampling is built on: the generator (on the unprepared policy: Accelerate's prepare keeps the same
    module object), the model it samples (the policy, or its copy in pipeline mode), the producer's parts, and rank
    0's full CPU copy of the policy where publishing gathers sharded weights (None elsewhere)."""

    generator: object
    rollout_model: object
    parts: ProducerParts
    shadow: object


def build_sampler(s, components: Components, needs: FamilyNeeds, follower: bool) -> Sampler:
    """The generator and what it samples with: the policy itself, or in pipeline mode copies of the policy and the
    tokenizer (the producer thread's own: a fast tokenizer's padding settings are not thread-safe). With several
    processes and a server or a pipeline, rank 0 alone samples the global batch, without collectives, and
    broadcasts it (rlx/rollout/rank_zero.py): the producer's parts carry no accelerator, and the other ranks
    (`follower`) build no generator and no rollout copy. Taken before accelerate.prepare: the copy that sharded
    weights are gathered into must be taken before FSDP / ZeRO-3 shard the policy."""
    acc, model, tokenizer = components.accelerator, components.model, components.tokenizer
    rollout_model = model
    if follower:
        generator = FollowerGenerator()
        log.info("built: no generator on this rank (rank 0 samples every row and broadcasts them)")
    else:
        if needs.producer is not None and s.rollout.max_staleness:
            rollout_model, tokenizer = rollout_copy(model), copy.deepcopy(tokenizer)
        generator = build_generator(s.rollout, rollout_model, tokenizer, s.seed)
        log.info("built: generator rollout=%s (%s)%s", s.rollout.backend, type(generator).__name__,
                 " on a copy of the policy (pipeline mode)" if rollout_model is not model else "")
    shadow = None
    if gathers_to_publish(s) and acc.process_index == 0:
        shadow = copy.deepcopy(model).eval().requires_grad_(False).cpu()
    parts = ProducerParts(generator, tokenizer, components.train_rows, components.eval_rows, components.rewards,
                          components.run_dir, None if rank_zero_samples(s, acc) else acc)
    return Sampler(generator, rollout_model, parts, shadow)


def gathered_publish(s, acc, model, sampler: Sampler, generator):
    """`generator`, or where sharded weights are published (FSDP / ZeRO-3 with a server) the gather around it: it
    reads the prepared `model` (DeepSpeed's engine gathers ZeRO-3's shards) into rank 0's CPU copy and publishes
    that. Outermost, on the trainer thread; the producer samples through what it wraps."""
    if not gathers_to_publish(s):
        return generator
    log.info("built: publishing gathers the full weights from the shards into rank 0's CPU copy of the policy")
    return GatheredPublish(generator, acc, sampler.shadow, model)


def build_sampling(s, components: Components, model, sampler: Sampler, kind: str, follower: bool) -> tuple:
    """(producer, generator) of the run, composed in this order: the producer of `kind` (BUILT_IN_PRODUCERS, or
    rollout.producer's) on the sampler's parts; pipeline mode samples it ahead in a thread (rlx/rollout/pipeline.py)
    and the trainer publishes to the pipeline's generator; rank 0 broadcasts the batch. The gather of sharded
    weights (gathered_publish) goes around the returned generator."""
    acc = components.accelerator
    own = s.rollout.producer != AUTO
    lane: SpeculativeLane = NO_LANE
    overlap = getattr(getattr(s.rollout, "server", None), "overlap_steps", False)  # rounds of two steps at once
    if overlap and s.rollout.max_staleness and not follower and not own:
        # the lane draws step+1's rounds with the weights the pipeline (built below around the producer, which takes
        # the lane) loads ahead: it reaches them through this function's `pipeline`, bound once the pipeline is built
        lane = StepOverlap(sampler.generator, lambda step: pipeline.weights_ahead(step),
                           s.rollout.server.per_server_concurrency)
        log.info("built: rounds overlap across steps on servers of two weight versions (rollout.server.overlap_steps)")
    # the loop checks the rows of its first batch (rlx/loops/credit.py require_rows)
    if own:
        producer = PRODUCERS[s.rollout.producer](s, sampler.parts)
    elif kind == "single_turn":
        producer = single_turn_producer(s, sampler.parts, lane)
    else:
        producer = BUILT_IN_PRODUCERS[kind](s, sampler.parts)
    log.info("built: producer %s", s.rollout.producer if own else kind)
    generator = sampler.generator
    if s.rollout.max_staleness and not follower:
        policy = acc.unwrap_model(model)
        # sharded weights: the pipeline's producer thread samples with its own copy and never joins the gather, which
        # stays outermost on the trainer thread; evaluation samples rank 0's gathered copy of the current policy
        current = policy_generator(sampler.shadow if gathers_to_publish(s) else policy, components.tokenizer,
                                   s.rollout)
        pipeline, generator = pipelined(s.rollout, producer, generator, sampler.rollout_model, policy, current,
                                        s.steps)
        producer = pipeline
        log.info("built: pipeline, batches sampled up to %d update(s) behind the trainer", s.rollout.max_staleness)
    if rank_zero_samples(s, acc):
        producer = RankZeroProducer(producer, acc, ["pipeline"] if s.rollout.max_staleness else None)
        log.info("built: rank 0 samples the global batch and broadcasts it (%s); each rank trains its shard",
                 rank_zero_reason(s, acc.num_processes))
    return producer, generator


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


def single_turn_producer(s, parts: ProducerParts,
                         lane: SpeculativeLane = NO_LANE) -> SingleTurnProducer | PartialProducer:
    """The single-turn producer of the settings `s`, or partial rollouts (rollout.partial) with `lane` drawing the
    next step's rounds ahead (rollout.server.overlap_steps; NO_LANE: none)."""
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
        served = rows_answered(parts.generator) if roll.backend == "server" else dict  # journal information only
        rounds = Rounds(int(roll.segment_tokens), journal, served, lane)
        return PartialProducer(parts.generator, parts.tokenizer, source, rewards, single_turn_settings(s, group_size),
                               oversample=roll.partial_oversample, stages=stages, rounds=rounds)
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


def seed_stages(s, parts: ProducerParts, rewards, group_size: int):
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


def episode_producer(s, parts: ProducerParts) -> EpisodeProducer:
    play_fn, extra_metrics = player_for(s.env)  # env=harness: the user's program through the gateway
    settings = EpisodeSettings(group_size=s.rollout.samples_per_prompt, prompts_per_step=s.prompts_per_step,
                               seed=s.seed, use_chat_template=s.model.chat_template)
    return EpisodeProducer(parts.generator, parts.tokenizer, environment_factory(s.env), s.env, settings,
                           acc=parts.accelerator, play_fn=play_fn, extra_metrics=extra_metrics)


@dataclass(frozen=True)
class EvalInputs:
    """What a held-out evaluator is built from: the settings, the loaded components, the prepared policy and the
    run's generator (outermost: with sharded weights the gather, which holds rank 0's full copy)."""

    settings: TrainConfig
    components: Components
    model: object
    generator: object


def task_eval(inputs: EvalInputs, *, alone: bool = False):
    """Held-out task rows decoded through the generator of rollout.backend (eval_generator), greedily; `alone`: this
    process evaluates every row, without collectives (rank 0 when it alone samples; with sharded weights it decodes
    its gathered copy of the current policy, whose forward is no collective)."""
    s, c, generator = inputs.settings, inputs.components, inputs.generator
    gathered = isinstance(generator, GatheredPublish) and generator.shadow is not None and alone
    policy = generator.shadow if gathered else c.accelerator.unwrap_model(inputs.model)
    decoder = eval_generator(s.rollout.backend, generator, policy, c.tokenizer, s.eval.batch_size)
    return task_evaluator(None if alone else c.accelerator, decoder, c.tokenizer, c.eval_rows[: s.eval.size],
                          c.rewards, task_eval_settings(s))


def episode_eval(inputs: EvalInputs, *, alone: bool = False):
    """Held-out episodes of the env; `alone`: this process plays every one, without collectives (rank 0 when it
    alone samples)."""
    s, c = inputs.settings, inputs.components
    play_fn, extra_metrics = player_for(s.env)
    return episode_evaluator(None if alone else c.accelerator, inputs.generator, c.tokenizer,
                             environment_factory(s.env), s.env,
                             use_chat_template=s.model.chat_template, play_fn=play_fn, extra_metrics=extra_metrics)


# the rows a loop trains on (rollout.producer=auto), and its held-out evaluation: FamilyNeeds.producer / .evaluator ->
# fn(settings, ProducerParts) / fn(EvalInputs); a user's producer comes from rlx.rollout.producers.PRODUCERS
# (rollout.producer=NAME)
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


