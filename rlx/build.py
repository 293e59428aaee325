"""The one builder: from the config, every part a training loop starts from.

`LOOPS` maps `algorithm.family` to its loop; `NEEDS` says what each family needs built; `build_parts` builds
the optimizers and schedules, the reference, the critic, the rollout generator, the checkpointer, the metrics
log and the evaluator, in the order the RNG draws and Accelerate's bookkeeping depend on.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig

from rlx.errors import UserError

if TYPE_CHECKING:
    from rlx.loops.common import Components, Parts

log = logging.getLogger("rlx")

# algorithm.family -> its training loop (imported when chosen: a run loads only its own family's code)
LOOPS = {
    "policy_gradient": "rlx.loops.policy_gradient:train_policy_gradient",
    "ppo": "rlx.loops.ppo:train_ppo",
    "sft": "rlx.loops.sft:train_sft",
    "preference": "rlx.loops.preference:train_preference",
    "reward_model": "rlx.loops.reward_model:train_reward_model",
    "agent": "rlx.loops.agent:train_agent",
    "agent_sft": "rlx.loops.agent_sft:train_agent_sft",
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
    from rlx.algorithms.preference import REFERENCE_FREE

    return algo.loss_type not in REFERENCE_FREE and algo.reference == "model"


@dataclass(frozen=True)
class FamilyNeeds:
    """What build_parts builds for a family. updates_per_step: optimizer steps per training step (the
    length of the learning-rate schedule is steps x that); reference: whether a frozen reference model
    is kept; prepare_scheduler: the schedule goes through accelerate.prepare (DeepSpeed then steps and
    saves it) rather than to the Checkpointer; before_prepare: "module:function" run on the unprepared
    policy, fn(cfg, parts) with parts.model not yet prepared (its results go to parts.extras)."""

    updates_per_step: Callable = _one
    reference: Callable = _never
    value_model: bool = False
    rollout_engine: bool = False
    prepare_scheduler: bool = True
    task_evaluator: bool = False
    before_prepare: str | None = None


NEEDS = {
    "policy_gradient": FamilyNeeds(_epochs_x_mini_batches, _kl_reference, rollout_engine=True, task_evaluator=True),
    "ppo": FamilyNeeds(_epochs_x_mini_batches, _kl_reference, value_model=True, rollout_engine=True,
                       prepare_scheduler=False, task_evaluator=True),
    "agent": FamilyNeeds(_epochs_x_mini_batches, _kl_reference, rollout_engine=True, prepare_scheduler=False),
    "agent_sft": FamilyNeeds(prepare_scheduler=False),
    "sft": FamilyNeeds(),
    "preference": FamilyNeeds(reference=_preference_reference, before_prepare="rlx.loops.preference:load_pairs"),
    "reward_model": FamilyNeeds(),
}
assert set(NEEDS) == set(LOOPS)


def build_parts(cfg: DictConfig, components: Components) -> Parts:
    """The one builder: from the loaded model, tokenizer, data and rewards (rlx.loops.common.Components),
    every part the family's loop starts from (rlx.loops.common.Parts), as declared in NEEDS.

    Order (the RNG draws and Accelerate's bookkeeping depend on it): the critic (its fresh head draws
    from the global RNG), the optimizers and schedules, the reference (a copy taken from the full,
    unprepared weights; under LoRA the policy with its adapter off, no copy), the rollout engine, then
    one accelerate.prepare of policy, optimizer[, schedule][, critic, critic optimizer] (DeepSpeed and
    FSDP prepare a model with its optimizer; the checkpointer saves the adapter of the first model), the
    reference placed like the prepared policy, the checkpointer, the metrics log and the evaluator."""
    from rlx.loops import common
    from rlx.models import lora, value
    from rlx.rollout.vllm import build_engine
    from rlx.runtime.checkpoint import Checkpointer
    from rlx.runtime.rundir import MetricsLog

    needs, algo, acc = NEEDS[cfg.algorithm.family], cfg.algorithm, components.accelerator
    parts = common.Parts(acc, components.model, components.tokenizer, components.train_rows, components.eval_rows,
                         components.rewards, components.run_dir, optimizer=None, scheduler=None, checkpointer=None,
                         metrics_log=None, extras=dict(components.extras))
    total_updates = cfg.steps * needs.updates_per_step(algo)
    if needs.value_model:
        parts.value_model = value.build_value_model(parts.model, algo.value_model, cfg.model.dtype, cfg.model.trust_remote_code)
    if needs.before_prepare is not None:
        module, function = needs.before_prepare.split(":")
        getattr(importlib.import_module(module), function)(cfg, parts)
    reference = lora.reference_model(parts.model) if needs.reference(algo) else None
    settings = common.optimizer_settings(cfg.optim)
    parts.optimizer, parts.scheduler = common.build_optimizer(parts.model, total_updates, **settings)
    if needs.value_model:
        value_lr = value.value_learning_rate(algo.value_lr, algo.value_lr_ratio, cfg.optim.lr)
        parts.value_optimizer, parts.value_scheduler = common.build_optimizer(parts.value_model, total_updates,
                                                                              **{**settings, "lr": value_lr})
    if needs.rollout_engine:  # None: generate with the policy (rollout=hf)
        parts.engine = build_engine(cfg.rollout, parts.model, parts.tokenizer, cfg.seed)
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
    parts.reference = lora.place_reference(reference, acc)
    parts.checkpointer = Checkpointer.from_config(cfg, acc, parts.run_dir)
    parts.metrics_log = MetricsLog(parts.run_dir, cfg.steps, cfg.log.progress, enabled=acc.is_main_process, tracker=acc)
    if needs.task_evaluator:
        parts.run_eval = common.task_evaluator(acc, parts.model, parts.tokenizer, parts.eval_rows[: cfg.eval.size],
                                               parts.rewards, common.eval_settings(cfg))
    return parts


def deepspeed_plugin(cfg: DictConfig, accumulation: int):
    """Accelerate's DeepSpeedPlugin with rlx's own config (rlx.runtime.parallel.deepspeed_config), or None."""
    hw = cfg.hardware
    if hw.get("distributed") != "deepspeed":
        return None
    from accelerate.utils import DeepSpeedPlugin

    from rlx.runtime import launch
    from rlx.runtime.parallel import deepspeed_config

    ds = hw.deepspeed
    config = deepspeed_config(ds.zero_stage, cfg.micro_batch_size, accumulation, launch.world_size(hw),
                              cfg.optim.max_grad_norm, hw.mixed_precision, ds.offload_optimizer_device, ds.offload_param_device,
                              ds.get("param_persistence_threshold"))
    return DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=bool(ds.zero3_init_flag and ds.zero_stage == 3))


def process_group_kwargs(cfg: DictConfig) -> list:
    """DeepSpeed without a GPU: Accelerate finds no backend for hardware.cpu=false, so name gloo."""
    if cfg.hardware.get("distributed") != "deepspeed" or torch.cuda.is_available():
        return []
    from accelerate.utils import InitProcessGroupKwargs

    return [InitProcessGroupKwargs(backend="gloo")]


def describe_data_source(data_cfg) -> str:
    """How error messages name the data: the file or hub id a row came from."""
    for key in ("train_path", "id", "task"):
        if data_cfg.get(key):
            return f"data.{key}={data_cfg.get(key)}"
    return f"data.source={data_cfg.get('source')}"


def build_model_and_tokenizer(cfg: DictConfig, train_rows: list[dict]):
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
            intermediate_size=build.intermediate_size, max_position_embeddings=build.max_position_embeddings, seed=cfg.seed,
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


