"""A training run from start to end: lock the run directory, launch workers or set up Accelerate, load data and
model, build the parts (rlx/build.py), run the family's loop, save the final model.

The command's orchestration, above the builder: `rlx train`'s Hydra front (rlx/cli/train.py) calls `run`; nothing
below rlx/cli/ imports this module (tests/test_layers.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
from rlx.config.schema import TrainConfig
from rlx.config.settings import checked_settings
from rlx.envs.registry import plays_through_gateway
from rlx.errors import UserError

log = logging.getLogger("rlx")


def check_run(cfg: DictConfig) -> TrainConfig:
    """The composed config's knobs checked and made typed settings (rlx.config.settings.checked_settings), then every
    rule of a training run on those settings, in order: family, batch split, engine, device, sharding (the rules are
    rlx/config/; the command calls them, with what only the layers above config know: the process count, the
    server's own settings). Returns the settings the run goes on with."""
    from rlx.runtime.launch import world_size

    s = checked_settings(cfg)
    processes = world_size(s.hardware)
    check_settings(s)
    check_batch(s, processes)
    check_async_settings(s, processes)
    if s.rollout.backend == "server":
        from rlx.fleet.process import check_server_settings

        check_server_settings(s.rollout, processes)
    check_strategy(s.hardware)
    check_device(s.hardware)
    check_sharded_settings(s)
    return s


@dataclass(frozen=True)
class Command:
    """One `rlx train` in this process: `settings`, what everything from the rules on reads, and what the run
    directory records: `composed`, the composed config (config.yaml, and what a resume changed in resumes.jsonl),
    and `overrides`, the command line's (overrides.yaml; the worker processes compose their settings from them)."""

    settings: TrainConfig
    composed: DictConfig
    run_dir: Path
    overrides: list[str]


def run(cfg: DictConfig, run_dir: Path, overrides: list[str], rewards: Mapping[str, Callable] | None = None) -> dict:
    """Train according to the composed config `cfg`, writing everything into run_dir: the config becomes typed
    settings first (check_run), and the run reads only those. Returns the final evaluation metrics. `rewards`:
    reward functions of this process by component name (rlx.fit), used instead of importing their `_target_`."""
    from rlx.runtime import launch
    from rlx.runtime.rundir import RunLock
    from rlx.runtime.storage import guard_log_files

    command = Command(check_run(cfg), cfg, run_dir, list(overrides))
    guard_log_files()  # train.log on a full disk: said once, not a traceback per line
    # one process (tree) per run directory; machine 0's launcher holds it for a multi-node run
    lock = None if launch.is_worker() or command.settings.hardware.machine_rank != 0 else RunLock(run_dir).acquire()
    try:
        return _run_locked(command, rewards or {})
    finally:
        if lock is not None:
            lock.release()


def _run_locked(command: Command, rewards: Mapping[str, Callable]) -> dict | None:
    """The run, its directory locked: a finished run is left alone (or its final/ rebuilt), a multi-process run's
    parent launches the workers; otherwise set up Accelerate, load the data, rewards and model, build the parts,
    run the family's loop and save the final model. Returns the final evaluation metrics (main process)."""
    from rlx.loops.common import Components, seed_everything
    from rlx.runtime import launch, tracking
    from rlx.runtime.rundir import write_run_files

    s, run_dir = command.settings, command.run_dir
    local_batch = check_batch(s, launch.world_size(s.hardware))
    rebuild_final = _finished_run(s, run_dir)
    if rebuild_final is None:
        return None  # nothing else in the run directory is touched
    if launch.needs_launch(s.hardware):  # parent of a multi-process run: write the run files, start workers
        _launch_workers(command, rebuild_final)
        return None  # the main worker wrote the results
    accelerator = _accelerator(s, run_dir, local_batch)
    # a resume rewrites the run files only once its data and model have loaded (just before the loop), so a
    # failed attempt leaves the run as it was
    writes_run_files = accelerator.is_main_process and not launch.is_worker() and not rebuild_final
    if writes_run_files and s.resume is None:
        write_run_files(run_dir, command.composed, command.overrides)
        tracking.write_env_info(run_dir, accelerator.num_processes)
    if not accelerator.is_main_process:
        logging.getLogger("rlx").setLevel(logging.WARNING)  # one process reports
    tracking.start_trackers(accelerator, s, run_dir)
    seed_everything(s.seed)
    train_rows, eval_rows, rewards, model, tokenizer = _load_inputs(s, accelerator, run_dir, rewards)
    log.info("run directory: %s", run_dir)
    log.info("model: %s (%.2fM parameters), %d train / %d held-out rows", s.model.path or "built from scratch",
             sum(p.numel() for p in model.parameters()) / 1e6, len(train_rows), len(eval_rows))
    parts = Components(accelerator, model, tokenizer, train_rows, eval_rows, rewards, run_dir)
    if writes_run_files and s.resume is not None:
        _record_resume(command)
        write_run_files(run_dir, command.composed, command.overrides)

    built = build_parts(s, parts)
    try:
        result = LOOPS[s.algorithm.family](built.settings, built)
    finally:  # a vLLM engine or server (and its child process) goes with the run, whatever ended it
        built.close()
    return _finish(s, run_dir, accelerator, result, tokenizer, rebuild_final)


def _finished_run(s: TrainConfig, run_dir: Path) -> bool | None:
    """Whether a resumed run must rebuild its final/ (True: it finished, but final/ is missing or partial), or
    None when it finished with final/ complete (nothing to train: its result.json restored if missing)."""
    from rlx.models.lora import final_is_complete
    from rlx.runtime.checkpoint import latest_checkpoint

    if s.resume is None:  # the cli pointed the run directory at the run being resumed
        return False
    found = latest_checkpoint(run_dir)
    recorded = OmegaConf.load(run_dir / "config.yaml")
    if (not OmegaConf.select(recorded, "checkpoint.at_end", default=True) and (run_dir / "result.json").is_file()
            and (found is None or found[0] < recorded.steps)):  # it finished without a checkpoint at its last step
        if s.steps == recorded.steps and (not s.save.final or final_is_complete(run_dir, s.model.lora.save_merged)):
            log.info("run %s already finished (step %d of steps=%d, checkpoint.at_end=false): nothing to train",
                     run_dir, recorded.steps, s.steps)
            return None
        raise UserError(f"run {run_dir} finished with checkpoint.at_end=false, so no state of its last step is left to "
                        f"continue or rebuild from: start a new run (model.path={run_dir / 'final'} starts from its "
                        f"weights)")
    if found is None or found[0] < s.steps:
        return False
    if not s.save.final or final_is_complete(run_dir, s.model.lora.save_merged):
        log.info("run %s already finished (checkpoint at step %d, steps=%d): nothing to train", run_dir,
                 found[0], s.steps)
        _restore_result(s, run_dir)  # only when a storage fault kept result.json from being written
        return None
    log.warning("run %s finished but final/ is missing or partial: rebuilding it from checkpoint step %d",
                run_dir, found[0])
    return True


def _launch_workers(command: Command, rebuild_final: bool) -> None:
    """The parent of a multi-process run: machine 0 writes the shared run directory's files, then the workers
    run; a worker's failure exits with its code."""
    from rlx.runtime import launch, tracking
    from rlx.runtime.rundir import write_run_files

    s, run_dir = command.settings, command.run_dir
    if not rebuild_final and s.hardware.machine_rank == 0:  # machine 0 writes the shared run directory's files
        if s.resume is not None:
            _record_resume(command)
        write_run_files(run_dir, command.composed, command.overrides)
        tracking.write_env_info(run_dir, launch.world_size(s.hardware))
    code = launch.launch_workers(s.hardware, run_dir, command.overrides)
    if code:
        raise SystemExit(code)


def _accelerator(s: TrainConfig, run_dir: Path, local_batch: int):
    """This process's Accelerator (threads, trackers, gradient accumulation over `local_batch` rows, the
    DeepSpeed or FSDP plugin); refuses a process count other than the run's."""
    from accelerate import Accelerator

    from rlx.runtime import launch, tracking
    from rlx.runtime.parallel import fsdp_plugin, micro_batches_per_step, use_fsdp_on_cpu

    if s.hardware.num_threads:
        torch.set_num_threads(s.hardware.num_threads)
    trackers = tracking.tracker_names(s.logger)
    tracking.tracker_environment(s.logger, run_dir)
    accumulation = micro_batches_per_step(local_batch, s.micro_batch_size)
    fsdp = fsdp_plugin(s.hardware.fsdp, s.hardware.mixed_precision) if s.hardware.distributed == "fsdp" else None
    # the schedule steps once per optimizer step (a prepared scheduler would otherwise step N times)
    accelerator = Accelerator(cpu=s.hardware.cpu, mixed_precision=s.hardware.mixed_precision,
                              log_with=trackers or None, project_dir=str(run_dir),
                              gradient_accumulation_steps=accumulation,
                              step_scheduler_with_optimizer=False, deepspeed_plugin=deepspeed_plugin(s, accumulation),
                              fsdp_plugin=fsdp, kwargs_handlers=process_group_kwargs(s))
    if fsdp is not None and s.hardware.cpu:
        use_fsdp_on_cpu(accelerator, fsdp)  # Accelerate drops the plugin on the CPU; torch's FSDP2 runs there (gloo)
    if s.hardware.distributed == "deepspeed" and not accelerator.state.deepspeed_plugin.zero3_init_flag:
        # Accelerate registers its stage-3 config with transformers even when zero3_init_flag is off, and
        # from_pretrained would then load the weights already partitioned (and the reference copy empty)
        from transformers.integrations import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    if accelerator.num_processes != launch.world_size(s.hardware):
        raise UserError(f"{accelerator.num_processes} processes are running but hardware.num_processes x num_machines "
                        f"= {launch.world_size(s.hardware)}; start runs with `rlx train`, not `accelerate launch`")
    return accelerator


def _load_inputs(s: TrainConfig, accelerator, run_dir: Path, given: Mapping[str, Callable]):
    """(train rows, held-out rows, reward components, prepared policy, tokenizer), with the rows checked against
    the rewards, the prompt-length limit applied and every prompt's (or episode's) token budget checked."""
    from rlx.data.tasks import load_rows
    from rlx.models.lora import prepare_policy
    from rlx.rewards import build_rewards

    # data.source none: preference data without a verifiable task (no eval/accuracy)
    train_rows, eval_rows = load_rows(s.data, s.seed) if s.data.source != "none" else ([], [])
    rewards = build_rewards(s.reward, given)
    if s.data.source != "none":
        from rlx.data.answers import check_answers

        check_answers(train_rows, rewards, s.algorithm.family)  # no answer column: only where nothing reads one
    model, tokenizer = build_model_and_tokenizer(s, train_rows)
    model = prepare_policy(model, s.model, s.hardware)
    if s.algorithm.family in ("policy_gradient", "ppo") and s.data.max_prompt_length is not None:
        train_rows = _limit_prompt_length(s, accelerator, run_dir, tokenizer, train_rows)
    _check_budgets(s, model, tokenizer, train_rows, eval_rows)
    return train_rows, eval_rows, rewards, model, tokenizer


def _limit_prompt_length(s: TrainConfig, accelerator, run_dir: Path, tokenizer, train_rows: list[dict]) -> list[dict]:
    """The training rows under data.max_prompt_length (data.overlong_prompts: dropped or truncated), the counts
    logged and written to prompt_length.json."""
    from rlx.rollout.prompt_limits import limit_prompt_length
    from rlx.runtime.rundir import atomic_write_text

    train_rows, counts = limit_prompt_length(tokenizer, train_rows, s.data.max_prompt_length,
                                             s.data.overlong_prompts, s.model.chat_template,
                                             s.data.system_prompt)
    log.info("data.max_prompt_length=%d: %d of %d training prompts longer (%d dropped, %d truncated)",
             s.data.max_prompt_length, counts["over_length"], counts["prompts"], counts["dropped"], counts["truncated"])
    if accelerator.is_main_process:
        atomic_write_text(run_dir / "prompt_length.json",
                          json.dumps(dict(counts, max_prompt_length=s.data.max_prompt_length)) + "\n",
                          "the prompt-length counts (prompt_length.json)")
    return train_rows


def _check_budgets(s: TrainConfig, model, tokenizer, train_rows: list[dict], eval_rows: list[dict]) -> None:
    """Every prompt fits the model's context with rollout.max_new_tokens (policy-gradient and PPO families), and
    an environment's first episodes can play a turn: else one line, before training starts."""
    if s.algorithm.family in ("policy_gradient", "ppo"):
        from rlx.rollout.prompt_limits import check_context, model_context

        source = describe_data_source(s.data)
        for rows, split in ((train_rows, "training"), (eval_rows, "held-out")):
            check_context(tokenizer, rows, model_context(model), s.rollout.max_new_tokens, s.model.chat_template,
                          s.data.system_prompt, f"{source} ({split})")
    # an episode that cannot play a turn: stop now, one line
    if s.env is not None and not plays_through_gateway(s.env.name):
        from rlx.build import environment_factory
        from rlx.rollout.budgets import check_episode_budget
        from rlx.rollout.env import train_env_seed
        from rlx.rollout.prompt_limits import model_context

        check_episode_budget(s.env, environment_factory(s.env), tokenizer, model_context(model), s.model.path,
                             [train_env_seed(s.seed, 1, task) for task in range(s.prompts_per_step)],
                             s.model.chat_template)


def _finish(s: TrainConfig, run_dir: Path, accelerator, result: dict, tokenizer, rebuild_final: bool) -> dict | None:
    """After the loop: the final model saved (its full weights gathered by every process), the run's plots, the
    trackers ended. Returns the final evaluation metrics on the main process, else None."""
    from rlx.models.lora import save_final
    from rlx.runtime.parallel import full_state_dict
    from rlx.runtime.rundir import plot_run

    accelerator.wait_for_everyone()
    # every process takes part in gathering the full weights of a sharded policy; the main one writes them
    state = full_state_dict(accelerator, result["model"]) if s.save.final else None
    if rebuild_final:  # the loop restored the last checkpoint and had nothing to train
        if accelerator.is_main_process:
            save_final(accelerator.unwrap_model(result["model"]), tokenizer, run_dir, s.model.lora.save_merged, s.steps,
                       state, base_name=s.model.path)
            log.info("final/ rebuilt from the last checkpoint")
            _restore_result(s, run_dir)
        accelerator.end_training()
        return None
    if accelerator.is_main_process:
        if s.save.final:
            save_final(accelerator.unwrap_model(result["model"]), tokenizer, run_dir, s.model.lora.save_merged,
                       s.steps, state, base_name=s.model.path)
        if s.save.plot:
            plot_run(run_dir)
        summary = {k: v for k, v in result["final_eval"].items()}
        log.info("done: %s  %s", run_dir, "  ".join(f"{k}={v:.4f}" for k, v in summary.items() if isinstance(v, float)))
    accelerator.end_training()
    return result["final_eval"] if accelerator.is_main_process else None


def _restore_result(s: TrainConfig, run_dir: Path) -> None:
    """result.json of a finished run that lacks it, from its metrics (rlx.report.sweeps.restore_result)."""
    from rlx.config.rules import optimized_metric
    from rlx.report.sweeps import restore_result

    restore_result(run_dir, optimized_metric(s.optimized_metric, s.algorithm.family, s.data.source))


def _record_resume(command: Command) -> None:
    """resumes.jsonl: what the resume changed against the recorded config.yaml, and from which checkpoint step."""
    from rlx.runtime.checkpoint import latest_checkpoint
    from rlx.runtime.rundir import record_resume

    run_dir = command.run_dir
    before = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    found = latest_checkpoint(run_dir)
    record_resume(run_dir, before, OmegaConf.to_container(command.composed, resolve=True), found[0] if found else 0,
                  command.overrides)
