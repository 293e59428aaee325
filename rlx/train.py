"""`rlx train`: build every component from the config (the one place that instantiates) and run a loop.

The loop is picked by `algorithm.family`: policy_gradient (GRPO family), ppo (with a critic), agent
(multi-turn environments), sft,
preference (DPO family, SimPO, ORPO) or reward_model (Bradley-Terry).
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from rlx.checkpoint import CheckpointDamaged, CheckpointWriteError, NonFiniteError, TrainingInterrupted
from rlx.config import CONF_DIR, UserError, fail
from rlx.config_checks import check_batch, check_run
from rlx.rewards import RewardError
from rlx.rollout.server_process import RolloutServerError
from rlx.run import RunInUse

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
    from rlx.checkpoint import Checkpointer
    from rlx.loops import common
    from rlx.models import lora, value
    from rlx.rollout.vllm import build_engine
    from rlx.run import MetricsLog

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
    """Accelerate's DeepSpeedPlugin with rlx's own config (rlx.parallel.deepspeed_config), or None."""
    hw = cfg.hardware
    if hw.get("distributed") != "deepspeed":
        return None
    from accelerate.utils import DeepSpeedPlugin

    from rlx import launch
    from rlx.parallel import deepspeed_config

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


def run(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict:
    """Train according to cfg, writing everything into run_dir. Returns the final evaluation metrics."""
    from rlx import launch
    from rlx.run import RunLock

    check_run(cfg)
    # one process (tree) per run directory; machine 0's launcher holds it for a multi-node run
    lock = None if launch.is_worker() or cfg.hardware.machine_rank != 0 else RunLock(run_dir).acquire()
    try:
        return _run_locked(cfg, run_dir, overrides)
    finally:
        if lock is not None:
            lock.release()


def _run_locked(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict | None:
    from accelerate import Accelerator

    from rlx import launch, tracking
    from rlx.checkpoint import latest_checkpoint
    from rlx.data.tasks import load_rows
    from rlx.loops.common import Components, seed_everything
    from rlx.models.lora import final_is_complete, prepare_policy, save_final
    from rlx.parallel import fsdp_plugin, full_state_dict, micro_batches_per_step, use_fsdp_on_cpu
    from rlx.rewards import build_rewards
    from rlx.run import plot_run, write_run_files

    local_batch = check_batch(cfg, launch.world_size(cfg.hardware))
    rebuild_final = False
    if cfg.resume is not None:  # the cli pointed the run directory at the run being resumed
        found = latest_checkpoint(run_dir)
        if found is not None and found[0] >= cfg.steps:
            if not cfg.save.final or final_is_complete(run_dir, cfg.model.lora.save_merged):
                log.info("run %s already finished (checkpoint at step %d, steps=%d): nothing to train", run_dir,
                         found[0], cfg.steps)
                return None  # nothing in the run directory is touched
            log.warning("run %s finished but final/ is missing or partial: rebuilding it from checkpoint step %d",
                        run_dir, found[0])
            rebuild_final = True
    if launch.needs_launch(cfg.hardware):  # parent of a multi-process run: write the run files, start workers
        if not rebuild_final and cfg.hardware.machine_rank == 0:  # machine 0 writes the shared run directory's files
            if cfg.resume is not None:
                _record_resume(cfg, run_dir, overrides)
            write_run_files(run_dir, cfg, overrides)
            tracking.write_env_info(run_dir, launch.world_size(cfg.hardware))
        code = launch.launch_workers(cfg.hardware, run_dir, overrides)
        if code:
            raise SystemExit(code)
        return None  # the main worker wrote the results
    if cfg.hardware.num_threads:
        torch.set_num_threads(cfg.hardware.num_threads)
    trackers = tracking.tracker_names(cfg.logger)
    tracking.tracker_environment(cfg.logger, run_dir)
    accumulation = micro_batches_per_step(local_batch, cfg.micro_batch_size)
    fsdp = fsdp_plugin(cfg.hardware.fsdp, cfg.hardware.mixed_precision) if cfg.hardware.get("distributed") == "fsdp" else None
    # the schedule steps once per optimizer step (a prepared scheduler would otherwise step N times)
    accelerator = Accelerator(cpu=cfg.hardware.cpu, mixed_precision=cfg.hardware.mixed_precision,
                              log_with=trackers or None, project_dir=str(run_dir), gradient_accumulation_steps=accumulation,
                              step_scheduler_with_optimizer=False, deepspeed_plugin=deepspeed_plugin(cfg, accumulation),
                              fsdp_plugin=fsdp, kwargs_handlers=process_group_kwargs(cfg))
    if fsdp is not None and cfg.hardware.cpu:
        use_fsdp_on_cpu(accelerator, fsdp)  # Accelerate drops the plugin on the CPU; torch's FSDP2 runs there (gloo)
    if cfg.hardware.get("distributed") == "deepspeed" and not accelerator.state.deepspeed_plugin.zero3_init_flag:
        # Accelerate registers its stage-3 config with transformers even when zero3_init_flag is off, and
        # from_pretrained would then load the weights already partitioned (and the reference copy empty)
        from transformers.integrations import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    if accelerator.num_processes != launch.world_size(cfg.hardware):
        raise UserError(f"{accelerator.num_processes} processes are running but hardware.num_processes x num_machines = "
                        f"{launch.world_size(cfg.hardware)}; start runs with `rlx train`, not `accelerate launch`")
    # a resume rewrites the run files only once its data and model have loaded (just before the loop), so a
    # failed attempt leaves the run as it was
    writes_run_files = accelerator.is_main_process and not launch.is_worker() and not rebuild_final
    if writes_run_files and cfg.resume is None:
        write_run_files(run_dir, cfg, overrides)
        tracking.write_env_info(run_dir, accelerator.num_processes)
    if not accelerator.is_main_process:
        logging.getLogger("rlx").setLevel(logging.WARNING)  # one process reports
    tracking.start_trackers(accelerator, cfg, run_dir)
    seed_everything(cfg.seed)
    # data.source none: preference data without a verifiable task (no eval/accuracy)
    train_rows, eval_rows = load_rows(cfg.data, cfg.seed) if cfg.data.source != "none" else ([], [])
    rewards = build_rewards(cfg.reward)
    model, tokenizer = build_model_and_tokenizer(cfg, train_rows)
    model = prepare_policy(model, cfg.model, cfg.hardware)
    if cfg.algorithm.family in ("policy_gradient", "ppo") and cfg.data.get("max_prompt_length") is not None:
        from rlx.loops.common import limit_prompt_length

        train_rows, counts = limit_prompt_length(tokenizer, train_rows, cfg.data.max_prompt_length,
                                                 cfg.data.get("overlong_prompts", "drop"), cfg.model.chat_template,
                                                 cfg.data.system_prompt)
        log.info("data.max_prompt_length=%d: %d of %d training prompts longer (%d dropped, %d truncated)",
                 cfg.data.max_prompt_length, counts["over_length"], counts["prompts"], counts["dropped"], counts["truncated"])
        if accelerator.is_main_process:
            (run_dir / "prompt_length.json").write_text(json.dumps(dict(counts, max_prompt_length=cfg.data.max_prompt_length)) + "\n")
    if cfg.algorithm.family in ("policy_gradient", "ppo"):
        from rlx.loops.common import check_context, model_context

        source = describe_data_source(cfg.data)
        for rows, split in ((train_rows, "training"), (eval_rows, "held-out")):
            check_context(tokenizer, rows, model_context(model), cfg.rollout.max_new_tokens, cfg.model.chat_template,
                          cfg.data.system_prompt, f"{source} ({split})")
    log.info("run directory: %s", run_dir)
    log.info("model: %s (%.2fM parameters), %d train / %d held-out rows", cfg.model.path or "built from scratch",
             sum(p.numel() for p in model.parameters()) / 1e6, len(train_rows), len(eval_rows))
    parts = Components(accelerator, model, tokenizer, train_rows, eval_rows, rewards, run_dir)
    if writes_run_files and cfg.resume is not None:
        _record_resume(cfg, run_dir, overrides)
        write_run_files(run_dir, cfg, overrides)

    module, function = LOOPS[cfg.algorithm.family].split(":")
    loop = getattr(importlib.import_module(module), function)
    result = loop(cfg, build_parts(cfg, parts))

    accelerator.wait_for_everyone()
    # every process takes part in gathering the full weights of a sharded policy; the main one writes them
    state = full_state_dict(accelerator, result["model"]) if cfg.save.final else None
    if rebuild_final:  # the loop restored the last checkpoint and had nothing to train
        if accelerator.is_main_process:
            save_final(accelerator.unwrap_model(result["model"]), tokenizer, run_dir, cfg.model.lora.save_merged, cfg.steps,
                       state, base_name=cfg.model.path)
            log.info("final/ rebuilt from the last checkpoint")
        accelerator.end_training()
        return None
    if accelerator.is_main_process:
        if cfg.save.final:
            save_final(accelerator.unwrap_model(result["model"]), tokenizer, run_dir, cfg.model.lora.save_merged,
                       cfg.steps, state, base_name=cfg.model.path)
        if cfg.save.plot:
            plot_run(run_dir)
        summary = {k: v for k, v in result["final_eval"].items()}
        log.info("done: %s", "  ".join(f"{k}={v:.4f}" for k, v in summary.items() if isinstance(v, float)))
    accelerator.end_training()
    return result["final_eval"] if accelerator.is_main_process else None


def _record_resume(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> None:

    from rlx.checkpoint import latest_checkpoint
    from rlx.run import record_resume

    before = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    found = latest_checkpoint(run_dir)
    record_resume(run_dir, before, OmegaConf.to_container(cfg, resolve=True), found[0] if found else 0, overrides)


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from rlx import launch
    from rlx.sweep import is_multirun, record_failure, write_result

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        final = run(cfg, run_dir, list(hydra_cfg.overrides.task))
    except TrainingInterrupted as exc:
        log.warning("stopped after step %d; checkpoint written. Continue with: rlx train resume=%s", exc.step, run_dir)
        raise SystemExit(130) from None
    except (Exception, SystemExit) as exc:
        if is_multirun(hydra_cfg):  # one crashing trial is recorded and the sweep goes on
            return record_failure(run_dir, exc, hydra_cfg)
        known = {UserError: 2, RunInUse: 2, RewardError: 1, NonFiniteError: 1, CheckpointWriteError: 1, CheckpointDamaged: 1,
                 RolloutServerError: 1}
        code = next((c for kind, c in known.items() if isinstance(exc, kind)), None)
        if launch.is_worker() and (code is not None or launch.is_peer_failure(exc)):
            # the parent prints each distinct error once; a rank that only saw another one die stays silent
            log.debug("worker stopped: %r", exc)
            launch.record_worker_error(str(exc) if code is not None else None, code or 1)
            raise SystemExit(code or 1) from None
        if code is not None:
            fail(exc.for_run(run_dir) if isinstance(exc, RolloutServerError) else str(exc), code=code)
        raise
    if final is None:  # nothing ran here (already finished, final/ rebuilt, parent or non-main worker)
        return None
    write_result(run_dir, final, cfg.optimized_metric)
    if cfg.optimized_metric not in final:
        log.warning("optimized_metric '%s' is not a final metric; valid choices: %s", cfg.optimized_metric, ", ".join(final))
    return final.get(cfg.optimized_metric)
