"""`rlx train`: build every component from the config (the one place that instantiates) and run a loop.

The loop is picked by `algorithm.family`: policy_gradient (GRPO family) or sft.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from rlx.checkpoint import TrainingInterrupted
from rlx.config import CONF_DIR, UserError, fail
from rlx.rewards import RewardError

log = logging.getLogger("rlx")

FAMILIES = ("policy_gradient", "sft")


def check_settings(cfg: DictConfig) -> None:
    """Combinations that make no sense stop the run before any work, naming the settings."""
    family = cfg.algorithm.family
    if family not in FAMILIES:
        raise UserError(f"unknown algorithm.family '{family}'; valid choices: {', '.join(FAMILIES)}")
    if cfg.steps < 1:
        raise UserError(f"steps={cfg.steps} must be at least 1")
    if cfg.micro_batch_size < 1:
        raise UserError(f"micro_batch_size={cfg.micro_batch_size} must be at least 1")
    if family == "policy_gradient":
        algo = cfg.algorithm
        if cfg.rollout.samples_per_prompt < 1 or cfg.prompts_per_step < 1:
            raise UserError("rollout.samples_per_prompt and prompts_per_step must be at least 1")
        if algo.clip_low < 0 or algo.clip_high < 0:
            raise UserError(f"algorithm.clip_low={algo.clip_low} and clip_high={algo.clip_high} must be >= 0")
        batch = cfg.prompts_per_step * cfg.rollout.samples_per_prompt
        if algo.mini_batches < 1 or batch % algo.mini_batches:
            raise UserError(
                f"algorithm.mini_batches={algo.mini_batches} must divide the rollout batch "
                f"prompts_per_step x rollout.samples_per_prompt = {batch}"
            )


def build_model_and_tokenizer(cfg: DictConfig, train_rows: list[dict]):
    from rlx.loops.common import format_prompts
    from rlx.models.loading import load_causal_lm, load_tokenizer

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
    model = load_causal_lm(cfg.model.path, cfg.model.dtype, cfg.model.revision, cfg.model.trust_remote_code)
    return model, tokenizer


def run(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict:
    """Train according to cfg, writing everything into run_dir. Returns the final evaluation metrics."""
    from accelerate import Accelerator

    from rlx import launch, tracking
    from rlx.checkpoint import latest_checkpoint
    from rlx.data.tasks import load_rows
    from rlx.loops.common import Components, seed_everything
    from rlx.models.lora import prepare_policy, save_final
    from rlx.rewards import build_rewards
    from rlx.run import plot_run, write_run_files

    check_settings(cfg)
    launch.check_batch(cfg, launch.world_size(cfg.hardware))
    if cfg.resume is not None:  # the cli pointed the run directory at the run being resumed
        found = latest_checkpoint(run_dir)
        if found is not None and found[0] >= cfg.steps:
            log.info("run %s already finished (checkpoint at step %d, steps=%d): nothing to train", run_dir, found[0], cfg.steps)
            return {}
    if launch.needs_launch(cfg.hardware):  # parent of a multi-process run: write the run files, start workers
        write_run_files(run_dir, cfg, overrides)
        tracking.write_env_info(run_dir, launch.world_size(cfg.hardware))
        code = launch.launch_workers(cfg.hardware, run_dir, overrides)
        if code:
            raise SystemExit(code)
        return {}
    if cfg.hardware.num_threads:
        torch.set_num_threads(cfg.hardware.num_threads)
    trackers = tracking.tracker_names(cfg.logger)
    tracking.tracker_environment(cfg.logger, run_dir)
    accelerator = Accelerator(cpu=cfg.hardware.cpu, mixed_precision=cfg.hardware.mixed_precision,
                              log_with=trackers or None, project_dir=str(run_dir))
    if accelerator.num_processes != launch.world_size(cfg.hardware):
        raise UserError(f"{accelerator.num_processes} processes are running but hardware.num_processes x num_machines = "
                        f"{launch.world_size(cfg.hardware)}; start runs with `rlx train`, not `accelerate launch`")
    if accelerator.is_main_process and not launch.is_worker():
        write_run_files(run_dir, cfg, overrides)
        tracking.write_env_info(run_dir, accelerator.num_processes)
    if not accelerator.is_main_process:
        logging.getLogger("rlx").setLevel(logging.WARNING)  # one process reports
    tracking.start_trackers(accelerator, cfg, run_dir)
    seed_everything(cfg.seed)
    train_rows, eval_rows = load_rows(cfg.data, cfg.seed)
    rewards = build_rewards(cfg.reward)
    model, tokenizer = build_model_and_tokenizer(cfg, train_rows)
    model = prepare_policy(model, cfg.model, cfg.hardware)
    log.info("run directory: %s", run_dir)
    log.info("model: %s (%.2fM parameters), %d train / %d held-out rows", cfg.model.path or "built from scratch",
             sum(p.numel() for p in model.parameters()) / 1e6, len(train_rows), len(eval_rows))
    parts = Components(accelerator, model, tokenizer, train_rows, eval_rows, rewards, run_dir)

    if cfg.algorithm.family == "sft":
        from rlx.loops.sft import train_sft as loop
    else:
        from rlx.loops.policy_gradient import train_policy_gradient as loop
    result = loop(cfg, parts)

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if cfg.save.final:
            save_final(accelerator.unwrap_model(result["model"]), tokenizer, run_dir, cfg.model.lora.save_merged)
        if cfg.save.plot:
            plot_run(run_dir)
        summary = {k: v for k, v in result["final_eval"].items()}
        log.info("done: %s", "  ".join(f"{k}={v:.4f}" for k, v in summary.items() if isinstance(v, float)))
    accelerator.end_training()
    return result["final_eval"]


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        final = run(cfg, run_dir, list(hydra_cfg.overrides.task))
    except TrainingInterrupted as exc:
        log.warning("stopped after step %d; checkpoint written. Continue with: rlx train resume=%s", exc.step, run_dir)
        raise SystemExit(130) from None
    except UserError as exc:
        fail(str(exc))
    except RewardError as exc:
        fail(str(exc), code=1)
    return final.get("eval/accuracy")
