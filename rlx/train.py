"""`rlx train`: build every component from the config (the one place that instantiates) and run a loop.

The loop is picked by `algorithm.family`: policy_gradient (GRPO family), ppo (with a critic), agent
(multi-turn environments), sft,
preference (DPO family, SimPO, ORPO) or reward_model (Bradley-Terry).
"""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from rlx.checkpoint import CheckpointDamaged, CheckpointWriteError, NonFiniteError, TrainingInterrupted
from rlx.config import CONF_DIR, UserError, fail
from rlx.rewards import RewardError
from rlx.run import RunInUse

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


def check_settings(cfg: DictConfig) -> None:
    """Combinations that make no sense stop the run before any work, naming the settings."""
    from rlx.config_schema import check_knobs

    check_knobs(cfg)  # every knob's type and range first: the rules below compare them
    family = cfg.algorithm.family
    if family not in FAMILIES:
        raise UserError(f"unknown algorithm.family '{family}'; valid choices: {', '.join(FAMILIES)}")
    if cfg.steps < 1:
        raise UserError(f"steps={cfg.steps} must be at least 1")
    if cfg.micro_batch_size < 1:
        raise UserError(f"micro_batch_size={cfg.micro_batch_size} must be at least 1")
    if family in ("policy_gradient", "ppo"):
        check_policy_gradient_settings(cfg)
    if family in ("policy_gradient", "ppo"):
        algo = cfg.algorithm
        if cfg.rollout.samples_per_prompt < 1 or cfg.prompts_per_step < 1:
            raise UserError("rollout.samples_per_prompt and prompts_per_step must be at least 1")
        if algo.clip_low < 0 or algo.clip_high < 0:
            raise UserError(f"algorithm.clip_low={algo.clip_low} and clip_high={algo.clip_high} must be >= 0")
        batch = cfg.prompts_per_step * (cfg.rollout.samples_per_prompt + (algo.advantage == "median"))
        if algo.mini_batches < 1 or batch % algo.mini_batches:
            raise UserError(
                f"algorithm.mini_batches={algo.mini_batches} must divide the rollout batch "
                f"prompts_per_step x rollout.samples_per_prompt = {batch}"
            )
    if family in ("preference", "reward_model"):
        check_preference_settings(cfg)
    if family == "agent":
        check_agent_settings(cfg)
    if family == "agent_sft" and cfg.get("env") is None:
        raise UserError("algorithm=agent_sft imitates demonstrations in an environment: add env=grid (or corridor, ...)")
    if family == "agent_sft":
        from rlx.envs import EnvError, env_factory

        try:
            env_factory(cfg.env.name, cfg.env.get("target"), cfg.env.get("kwargs"))
        except EnvError as exc:
            raise UserError(str(exc)) from None
    for name, spec in cfg.reward.components.items():
        if spec.get("_target_") == "rlx.rewards.model.model_reward" and not spec.get("path"):
            raise UserError(f"reward component '{name}' needs a reward model: set reward.components.{name}.path=PATH "
                            f"(an rlx reward-model run directory, a save_pretrained folder or a hub id; a list is an ensemble)")


def check_preference_settings(cfg: DictConfig) -> None:
    """Preference data present, and the loss settings valid for the chosen loss_type."""
    algo = cfg.algorithm
    if cfg.data.get("pairs") is None:
        raise UserError(f"algorithm={algo.name} trains on preference pairs; add data=prefs (the embedded chain_sum pairs) "
                        f"or data=prefs_file data.pairs.path=FILE or data=prefs_hub data.pairs.id=ORG/NAME")
    if algo.batch_size < 1:
        raise UserError(f"algorithm.batch_size={algo.batch_size} must be at least 1")
    if algo.family == "preference":
        from rlx.algorithms.preference import REFERENCE_FREE, preference_loss

        if algo.reference not in ("precompute", "model"):
            raise UserError(f"unknown algorithm.reference '{algo.reference}'; valid choices: precompute, model")
        one = torch.zeros(1)
        ref = None if algo.loss_type in REFERENCE_FREE else one
        try:  # the loss validates its own arguments; run it once on a dummy pair
            preference_loss(-one, -one, ref, ref, loss_type=algo.loss_type, beta=algo.beta, label_smoothing=algo.label_smoothing,
                            gamma=algo.gamma, chosen_lengths=one + 1, rejected_lengths=one + 1,
                            length_normalize=algo.length_normalize)
        except ValueError as exc:
            raise UserError(f"algorithm settings: {exc}") from None


def check_agent_settings(cfg: DictConfig) -> None:
    """The multi-turn loop (rlx/loops/agent.py) needs an environment and a known credit estimator."""
    from rlx.algorithms.gigpo import CREDIT, SCALES

    algo, env = cfg.algorithm, cfg.get("env")
    if env is None:
        raise UserError(f"algorithm={algo.name} plays an environment: add env=grid (or guess_number, corridor, tool_use, "
                        f"custom env.target=my_module.MyEnv)")
    from rlx.envs import EnvError, env_factory

    try:  # builds one environment: a wrong name, target or kwargs stops here, before any model is loaded
        env_factory(env.name, env.get("target"), env.get("kwargs"))
    except EnvError as exc:
        raise UserError(str(exc)) from None
    if cfg.rollout.get("tis_cap") is not None:
        raise UserError("rollout.tis_cap (truncated importance sampling) is implemented for the policy-gradient "
                        "family (GRPO, RLOO, ...), not the agent loop; unset it")
    if algo.credit not in CREDIT:
        raise UserError(f"unknown algorithm.credit '{algo.credit}'; valid choices: {', '.join(CREDIT)}")
    if algo.scale not in SCALES:
        raise UserError(f"algorithm.scale={algo.scale} is not available to the agent loop; valid choices: {', '.join(SCALES)}")
    if cfg.rollout.samples_per_prompt < 2 or cfg.prompts_per_step < 1:
        raise UserError(f"algorithm.family=agent compares the episodes of a task: rollout.samples_per_prompt="
                        f"{cfg.rollout.samples_per_prompt} must be at least 2 (and prompts_per_step at least 1)")
    if algo.clip_high < algo.clip_low or algo.clip_low < 0:
        raise UserError(f"algorithm.clip_low={algo.clip_low} must be >= 0 and clip_high={algo.clip_high} >= clip_low")
    if algo.mini_batches < 1 or (cfg.prompts_per_step * cfg.rollout.samples_per_prompt) % algo.mini_batches:
        raise UserError(f"algorithm.mini_batches={algo.mini_batches} must divide prompts_per_step x rollout.samples_per_prompt")
    if env.max_turns < 1 or env.max_new_tokens < 1 or env.max_total_tokens < 2:
        raise UserError("env.max_turns, env.max_new_tokens and env.max_total_tokens must be at least 1")
    if not 0 <= algo.gamma <= 1:
        raise UserError(f"algorithm.gamma={algo.gamma} must be in [0, 1]")


def check_policy_gradient_settings(cfg: DictConfig) -> None:
    """Conflicting knobs of the policy-gradient and PPO families (see conf/algorithm/grpo.yaml)."""
    from rlx.algorithms.advantages import ESTIMATORS, GROUP_BASELINES, SCALES
    from rlx.algorithms.kl import KL_ESTIMATORS, KL_PLACEMENTS
    from rlx.algorithms.losses import LOSS_AGGREGATIONS, RATIO_LEVELS

    algo, family, samples = cfg.algorithm, cfg.algorithm.family, cfg.rollout.samples_per_prompt
    for key, value, valid in (("advantage", algo.advantage, ESTIMATORS), ("scale", algo.scale, SCALES),
                              ("loss_agg", algo.loss_agg, LOSS_AGGREGATIONS), ("ratio_level", algo.ratio_level, RATIO_LEVELS),
                              ("kl_estimator", algo.kl_estimator, KL_ESTIMATORS), ("kl_in", algo.kl_in, KL_PLACEMENTS)):
        if value not in valid:
            raise UserError(f"unknown algorithm.{key} '{value}'; valid choices: {', '.join(valid)}")
    if algo.advantage == "gae" and family != "ppo":
        raise UserError("algorithm.advantage=gae needs a value model: use algorithm=ppo (algorithm.family=ppo)")
    if family == "ppo" and algo.advantage != "gae":
        raise UserError(f"algorithm.family=ppo trains a critic for algorithm.advantage=gae, got '{algo.advantage}'")
    if algo.advantage in GROUP_BASELINES and algo.advantage != "median" and samples < 2:
        raise UserError(f"algorithm.advantage={algo.advantage} compares samples of a prompt: "
                        f"rollout.samples_per_prompt={samples} must be at least 2")
    if algo.advantage == "median" and (samples < 2 or samples % 2):
        raise UserError(f"algorithm.advantage=median samples G+1 completions so that the median is one of them: "
                        f"rollout.samples_per_prompt={samples} must be even and at least 2")
    if cfg.rollout.temperature <= 0:
        raise UserError(f"rollout.temperature={cfg.rollout.temperature} must be > 0: training samples the completions "
                        f"it scores (greedy decoding gives every sample of a group the same completion)")
    if algo.clip_high < algo.clip_low:
        raise UserError(f"algorithm.clip_high={algo.clip_high} is below algorithm.clip_low={algo.clip_low}; "
                        f"clip-higher needs clip_high >= clip_low")
    if algo.dual_clip is not None and algo.dual_clip <= 1:
        raise UserError(f"algorithm.dual_clip={algo.dual_clip} must be > 1 (or null to turn it off)")
    if not 0 < algo.forking_rho <= 1:
        raise UserError(f"algorithm.forking_rho={algo.forking_rho} must be in (0, 1]")
    if algo.kl_coef < 0 or algo.entropy_coef < 0:
        raise UserError("algorithm.kl_coef and algorithm.entropy_coef must be >= 0")
    if algo.kl_in == "reward" and algo.kl_estimator != "k1":
        raise UserError(f"algorithm.kl_in=reward uses the k1 estimator; set algorithm.kl_estimator=k1 "
                        f"(got {algo.kl_estimator})")
    if algo.kl_coef == 0 and (algo.kl_target is not None or algo.ref_reset_every):
        raise UserError("algorithm.kl_target / algorithm.ref_reset_every need a reference: set algorithm.kl_coef > 0")
    if algo.ref_reset_every and cfg.model.lora.enabled:
        raise UserError("algorithm.ref_reset_every copies the policy into the reference, but under LoRA the reference is "
                        "the base with the adapter off; set algorithm.ref_reset_every=0 or model.lora.enabled=false")
    if algo.kl_target is not None and algo.kl_target <= 0:
        raise UserError(f"algorithm.kl_target={algo.kl_target} must be > 0 (or null for a fixed kl_coef)")
    if algo.dynamic_sampling and algo.advantage not in GROUP_BASELINES:
        raise UserError(f"algorithm.dynamic_sampling drops groups with tied rewards, which only carry no signal "
                        f"under a group baseline; algorithm.advantage={algo.advantage} is not one")
    if algo.dynamic_sampling and algo.max_sample_batches < 1:
        raise UserError(f"algorithm.max_sample_batches={algo.max_sample_batches} must be at least 1")
    if algo.overlong_buffer < 0 or algo.overlong_buffer > cfg.rollout.max_new_tokens:
        raise UserError(f"algorithm.overlong_buffer={algo.overlong_buffer} must be in 0..rollout.max_new_tokens="
                        f"{cfg.rollout.max_new_tokens}")
    if algo.positive_weight < 0 or algo.negative_weight < 0:
        raise UserError("algorithm.positive_weight and algorithm.negative_weight must be >= 0")
    if family == "ppo" and not (0 <= algo.gamma <= 1 and 0 <= algo.lam <= 1):
        raise UserError(f"algorithm.gamma={algo.gamma} and algorithm.lam={algo.lam} must be in [0, 1]")


def check_sharded_settings(cfg: DictConfig) -> None:
    """What the sharded engines do not run (yet), stopped before any work."""
    hw = cfg.hardware
    engine = {"fsdp": "FSDP", "deepspeed": "DeepSpeed"}.get(hw.get("distributed"))
    if engine is not None:  # what neither sharded engine runs
        if cfg.algorithm.family in ("agent", "agent_sft"):
            raise UserError(f"algorithm={cfg.algorithm.name} plays episodes whose turn counts differ between processes, "
                            f"which {engine}'s collective forward passes do not allow yet; use hardware=ddp")
        if cfg.algorithm.family == "ppo":
            why = "Accelerate's FSDP2 prepares one" if engine == "FSDP" else "which rlx does not prepare under DeepSpeed"
            raise UserError(f"algorithm=ppo trains two models (policy and critic), {why}; use hardware=ddp or a "
                            f"critic-free algorithm (grpo, rloo, ...)")
        if cfg.rollout.backend != "hf":
            raise UserError(f"rollout=vllm reads the full policy weights after each update, not run under {engine} yet; "
                            f"use rollout=hf or hardware=ddp")
    if hw.get("distributed") == "fsdp":
        if cfg.model.dtype in ("bfloat16", "float16") and hw.mixed_precision == "no":
            raise UserError(f"hardware=fsdp with model.dtype={cfg.model.dtype} and hardware.mixed_precision=no would step "
                            f"{cfg.model.dtype} weights without fp32 master copies; set hardware.mixed_precision=bf16 "
                            f"(FSDP2 then trains fp32 masters and computes in bf16) or model.dtype=float32")
        if cfg.model.lora.enabled and cfg.model.lora.save_merged:
            raise UserError("model.lora.save_merged=true merges a copy of the policy, not done between FSDP shards; "
                            "set model.lora.save_merged=false (final/ holds the adapter) or use hardware=ddp")
    if hw.get("distributed") != "deepspeed":
        return
    if hw.deepspeed.zero_stage == 3 and cfg.algorithm.get("ref_reset_every"):
        raise UserError("algorithm.ref_reset_every copies the policy into the reference, not done between ZeRO-3 shards; "
                        "set algorithm.ref_reset_every=0 or hardware=deepspeed_zero2")
    lora = cfg.model.get("lora")
    if (hw.deepspeed.zero_stage == 3 and hw.deepspeed.zero3_init_flag and cfg.algorithm.get("kl_coef", 0) > 0
            and not (lora is not None and lora.enabled)):
        raise UserError("hardware.deepspeed.zero3_init_flag=true loads the policy already partitioned, so the KL reference "
                        "cannot be copied from it; set hardware.deepspeed.zero3_init_flag=false or use model.lora.enabled=true")


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

    check_settings(cfg)
    launch.check_batch(cfg, launch.world_size(cfg.hardware))
    launch.check_strategy(cfg.hardware)
    launch.check_device(cfg.hardware)
    check_sharded_settings(cfg)
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

    local_batch = launch.check_batch(cfg, launch.world_size(cfg.hardware))
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
    result = loop(cfg, parts)

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
    from omegaconf import OmegaConf

    from rlx.checkpoint import latest_checkpoint
    from rlx.run import record_resume

    before = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    found = latest_checkpoint(run_dir)
    record_resume(run_dir, before, OmegaConf.to_container(cfg, resolve=True), found[0] if found else 0, overrides)


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

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
        if isinstance(exc, (UserError, RunInUse)):
            fail(str(exc))
        if isinstance(exc, (RewardError, NonFiniteError, CheckpointWriteError, CheckpointDamaged)):
            fail(str(exc), code=1)
        raise
    if final is None:  # nothing ran here (already finished, final/ rebuilt, parent or non-main worker)
        return None
    write_result(run_dir, final, cfg.optimized_metric)
    if cfg.optimized_metric not in final:
        log.warning("optimized_metric '%s' is not a final metric; valid choices: %s", cfg.optimized_metric, ", ".join(final))
    return final.get(cfg.optimized_metric)
