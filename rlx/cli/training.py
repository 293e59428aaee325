"""A training run from start to end: lock the run directory, launch workers or set up Accelerate, load data and
model, build the parts (rlx/build.py), run the family's loop, save the final model.

The command's orchestration, above the builder: `rlx train`'s Hydra front (rlx/cli/train.py) calls `run`; nothing
below rlx/cli/ imports this module (tests/test_layers.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rlx.build import (
    LOOPS,
    build_model_and_tokenizer,
    build_parts,
    deepspeed_plugin,
    describe_data_source,
    process_group_kwargs,
)
from rlx.config.async_rules import check_async_settings
from rlx.config.rules import (
    check_batch,
    check_device,
    check_settings,
    check_sharded_settings,
    check_strategy,
)
from rlx.envs.registry import plays_through_gateway
from rlx.errors import UserError

log = logging.getLogger("rlx")


def check_run(cfg: DictConfig) -> None:
    """Every rule of a training run, in order: knobs, family, batch split, engine, device, sharding (the rules
    are rlx/config/; the command calls them, with what only the layers above config know: the process count,
    the server's own settings)."""
    from rlx.runtime.launch import world_size

    check_settings(cfg)
    check_batch(cfg, world_size(cfg.hardware))
    check_async_settings(cfg, world_size(cfg.hardware))
    if cfg.rollout.backend == "server":
        from rlx.rollout.server_process import check_server_settings

        check_server_settings(cfg.rollout, world_size(cfg.hardware))
    check_strategy(cfg.hardware)
    check_device(cfg.hardware)
    check_sharded_settings(cfg)


def run(cfg: DictConfig, run_dir: Path, overrides: list[str], rewards: Mapping[str, Callable] | None = None) -> dict:
    """Train according to cfg, writing everything into run_dir. Returns the final evaluation metrics. `rewards`:
    reward functions of this process by component name (rlx.fit), used instead of importing their `_target_`."""
    from rlx.runtime import launch
    from rlx.runtime.rundir import RunLock
    from rlx.runtime.storage import guard_log_files

    check_run(cfg)
    guard_log_files()  # train.log on a full disk: said once, not a traceback per line
    # one process (tree) per run directory; machine 0's launcher holds it for a multi-node run
    lock = None if launch.is_worker() or cfg.hardware.machine_rank != 0 else RunLock(run_dir).acquire()
    try:
        return _run_locked(cfg, run_dir, overrides, rewards or {})
    finally:
        if lock is not None:
            lock.release()


def _run_locked(cfg: DictConfig, run_dir: Path, overrides: list[str], rewards: Mapping[str, Callable]) -> dict | None:
    """The run, its directory locked: a finished run is left alone (or its final/ rebuilt), a multi-process run's
    parent launches the workers; otherwise set up Accelerate, load the data, rewards and model, build the parts,
    run the family's loop and save the final model. Returns the final evaluation metrics (main process)."""
    from rlx.loops.common import Components, seed_everything
    from rlx.runtime import launch, tracking
    from rlx.runtime.rundir import write_run_files

    local_batch = check_batch(cfg, launch.world_size(cfg.hardware))
    rebuild_final = _finished_run(cfg, run_dir)
    if rebuild_final is None:
        return None  # nothing else in the run directory is touched
    if launch.needs_launch(cfg.hardware):  # parent of a multi-process run: write the run files, start workers
        _launch_workers(cfg, run_dir, overrides, rebuild_final)
        return None  # the main worker wrote the results
    accelerator = _accelerator(cfg, run_dir, local_batch)
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
    train_rows, eval_rows, rewards, model, tokenizer = _load_inputs(cfg, accelerator, run_dir, rewards)
    log.info("run directory: %s", run_dir)
    log.info("model: %s (%.2fM parameters), %d train / %d held-out rows", cfg.model.path or "built from scratch",
             sum(p.numel() for p in model.parameters()) / 1e6, len(train_rows), len(eval_rows))
    parts = Components(accelerator, model, tokenizer, train_rows, eval_rows, rewards, run_dir)
    if writes_run_files and cfg.resume is not None:
        _record_resume(cfg, run_dir, overrides)
        write_run_files(run_dir, cfg, overrides)

    built = build_parts(cfg, parts)
    try:
        result = LOOPS[cfg.algorithm.family](built.settings, built)
    finally:  # a vLLM engine or server (and its child process) goes with the run, whatever ended it
        if built.generator is not None:
            built.generator.close()
    return _finish(cfg, run_dir, accelerator, result, tokenizer, rebuild_final)


def _finished_run(cfg: DictConfig, run_dir: Path) -> bool | None:
    """Whether a resumed run must rebuild its final/ (True: it finished, but final/ is missing or partial), or
    None when it finished with final/ complete (nothing to train: its result.json restored if missing)."""
    from rlx.models.lora import final_is_complete
    from rlx.runtime.checkpoint import latest_checkpoint

    if cfg.resume is None:  # the cli pointed the run directory at the run being resumed
        return False
    found = latest_checkpoint(run_dir)
    recorded = OmegaConf.load(run_dir / "config.yaml")
    if (not OmegaConf.select(recorded, "checkpoint.at_end", default=True) and (run_dir / "result.json").is_file()
            and (found is None or found[0] < recorded.steps)):  # it finished without a checkpoint at its last step
        if cfg.steps == recorded.steps and (not cfg.save.final or final_is_complete(run_dir, cfg.model.lora.save_merged)):
            log.info("run %s already finished (step %d of steps=%d, checkpoint.at_end=false): nothing to train",
                     run_dir, recorded.steps, cfg.steps)
            return None
        raise UserError(f"run {run_dir} finished with checkpoint.at_end=false, so no state of its last step is left to "
                        f"continue or rebuild from: start a new run (model.path={run_dir / 'final'} starts from its "
                        f"weights)")
    if found is None or found[0] < cfg.steps:
        return False
    if not cfg.save.final or final_is_complete(run_dir, cfg.model.lora.save_merged):
        log.info("run %s already finished (checkpoint at step %d, steps=%d): nothing to train", run_dir,
                 found[0], cfg.steps)
        _restore_result(cfg, run_dir)  # only when a storage fault kept result.json from being written
        return None
    log.warning("run %s finished but final/ is missing or partial: rebuilding it from checkpoint step %d",
                run_dir, found[0])
    return True


def _launch_workers(cfg: DictConfig, run_dir: Path, overrides: list[str], rebuild_final: bool) -> None:
    """The parent of a multi-process run: machine 0 writes the shared run directory's files, then the workers
    run; a worker's failure exits with its code."""
    from rlx.runtime import launch, tracking
    from rlx.runtime.rundir import write_run_files

    if not rebuild_final and cfg.hardware.machine_rank == 0:  # machine 0 writes the shared run directory's files
        if cfg.resume is not None:
            _record_resume(cfg, run_dir, overrides)
        write_run_files(run_dir, cfg, overrides)
        tracking.write_env_info(run_dir, launch.world_size(cfg.hardware))
    code = launch.launch_workers(cfg.hardware, run_dir, overrides)
    if code:
        raise SystemExit(code)


def _accelerator(cfg: DictConfig, run_dir: Path, local_batch: int):
    """This process's Accelerator (threads, trackers, gradient accumulation over `local_batch` rows, the
    DeepSpeed or FSDP plugin); refuses a process count other than the run's."""
    from accelerate import Accelerator

    from rlx.runtime import launch, tracking
    from rlx.runtime.parallel import fsdp_plugin, micro_batches_per_step, use_fsdp_on_cpu

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
    return accelerator


def _load_inputs(cfg: DictConfig, accelerator, run_dir: Path, given: Mapping[str, Callable]):
    """(train rows, held-out rows, reward components, prepared policy, tokenizer), with the rows checked against
    the rewards, the prompt-length limit applied and every prompt's (or episode's) token budget checked."""
    from rlx.data.tasks import load_rows
    from rlx.models.lora import prepare_policy
    from rlx.rewards import build_rewards

    # data.source none: preference data without a verifiable task (no eval/accuracy)
    train_rows, eval_rows = load_rows(cfg.data, cfg.seed) if cfg.data.source != "none" else ([], [])
    rewards = build_rewards(cfg.reward, given)
    if cfg.data.source != "none":
        from rlx.data.answers import check_answers

        check_answers(train_rows, rewards, cfg.algorithm.family)  # no answer column: only where nothing reads one
    model, tokenizer = build_model_and_tokenizer(cfg, train_rows)
    model = prepare_policy(model, cfg.model, cfg.hardware)
    if cfg.algorithm.family in ("policy_gradient", "ppo") and cfg.data.get("max_prompt_length") is not None:
        train_rows = _limit_prompt_length(cfg, accelerator, run_dir, tokenizer, train_rows)
    _check_budgets(cfg, model, tokenizer, train_rows, eval_rows)
    return train_rows, eval_rows, rewards, model, tokenizer


def _limit_prompt_length(cfg: DictConfig, accelerator, run_dir: Path, tokenizer, train_rows: list[dict]) -> list[dict]:
    """The training rows under data.max_prompt_length (data.overlong_prompts: dropped or truncated), the counts
    logged and written to prompt_length.json."""
    from rlx.rollout.prompt_limits import limit_prompt_length
    from rlx.runtime.rundir import atomic_write_text

    train_rows, counts = limit_prompt_length(tokenizer, train_rows, cfg.data.max_prompt_length,
                                             cfg.data.get("overlong_prompts", "drop"), cfg.model.chat_template,
                                             cfg.data.system_prompt)
    log.info("data.max_prompt_length=%d: %d of %d training prompts longer (%d dropped, %d truncated)",
             cfg.data.max_prompt_length, counts["over_length"], counts["prompts"], counts["dropped"], counts["truncated"])
    if accelerator.is_main_process:
        atomic_write_text(run_dir / "prompt_length.json",
                          json.dumps(dict(counts, max_prompt_length=cfg.data.max_prompt_length)) + "\n",
                          "the prompt-length counts (prompt_length.json)")
    return train_rows


def _check_budgets(cfg: DictConfig, model, tokenizer, train_rows: list[dict], eval_rows: list[dict]) -> None:
    """Every prompt fits the model's context with rollout.max_new_tokens (policy-gradient and PPO families), and
    an environment's first episodes can play a turn: else one line, before training starts."""
    if cfg.algorithm.family in ("policy_gradient", "ppo"):
        from rlx.rollout.prompt_limits import check_context, model_context

        source = describe_data_source(cfg.data)
        for rows, split in ((train_rows, "training"), (eval_rows, "held-out")):
            check_context(tokenizer, rows, model_context(model), cfg.rollout.max_new_tokens, cfg.model.chat_template,
                          cfg.data.system_prompt, f"{source} ({split})")
    if cfg.get("env") and not plays_through_gateway(cfg.env.name):  # an episode that cannot play a turn: stop now, one line
        from rlx.build import environment_factory
        from rlx.rollout.budgets import check_episode_budget
        from rlx.rollout.env import train_env_seed
        from rlx.rollout.prompt_limits import model_context

        check_episode_budget(cfg.env, environment_factory(cfg.env), tokenizer, model_context(model), cfg.model.path,
                             [train_env_seed(cfg.seed, 1, task) for task in range(cfg.prompts_per_step)],
                             cfg.model.chat_template)


def _finish(cfg: DictConfig, run_dir: Path, accelerator, result: dict, tokenizer, rebuild_final: bool) -> dict | None:
    """After the loop: the final model saved (its full weights gathered by every process), the run's plots, the
    trackers ended. Returns the final evaluation metrics on the main process, else None."""
    from rlx.models.lora import save_final
    from rlx.runtime.parallel import full_state_dict
    from rlx.runtime.rundir import plot_run

    accelerator.wait_for_everyone()
    # every process takes part in gathering the full weights of a sharded policy; the main one writes them
    state = full_state_dict(accelerator, result["model"]) if cfg.save.final else None
    if rebuild_final:  # the loop restored the last checkpoint and had nothing to train
        if accelerator.is_main_process:
            save_final(accelerator.unwrap_model(result["model"]), tokenizer, run_dir, cfg.model.lora.save_merged, cfg.steps,
                       state, base_name=cfg.model.path)
            log.info("final/ rebuilt from the last checkpoint")
            _restore_result(cfg, run_dir)
        accelerator.end_training()
        return None
    if accelerator.is_main_process:
        if cfg.save.final:
            save_final(accelerator.unwrap_model(result["model"]), tokenizer, run_dir, cfg.model.lora.save_merged,
                       cfg.steps, state, base_name=cfg.model.path)
        if cfg.save.plot:
            plot_run(run_dir)
        summary = {k: v for k, v in result["final_eval"].items()}
        log.info("done: %s  %s", run_dir, "  ".join(f"{k}={v:.4f}" for k, v in summary.items() if isinstance(v, float)))
    accelerator.end_training()
    return result["final_eval"] if accelerator.is_main_process else None


def _restore_result(cfg: DictConfig, run_dir: Path) -> None:
    """result.json of a finished run that lacks it, from its metrics (rlx.report.sweeps.restore_result)."""
    from rlx.config.rules import optimized_metric
    from rlx.report.sweeps import restore_result

    restore_result(run_dir, optimized_metric(cfg.optimized_metric, cfg.algorithm.family, cfg.data.source))


def _record_resume(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> None:

    from rlx.runtime.checkpoint import latest_checkpoint
    from rlx.runtime.rundir import record_resume

    before = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    found = latest_checkpoint(run_dir)
    record_resume(run_dir, before, OmegaConf.to_container(cfg, resolve=True), found[0] if found else 0, overrides)


