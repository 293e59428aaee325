"""Typed schemas of the config groups shared by `rlx train`, `rlx eval` and `rlx data prefs`, and of train.yaml's
own sections: one dataclass per group, a field per knob (its type and range; defaults live in YAML). The
algorithm families are in rlx/config/families.py, the primary configs and the check in rlx/config/schema.py.

Choice types: `choices(...)` for a fixed set of names, `registry_names(...)` for a registry's names, read when the
config is checked so that a plugin's entry is valid (rlx/config/fields.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlx.algorithms.advantages import ESTIMATORS, SCALES
from rlx.algorithms.gigpo import CREDIT
from rlx.algorithms.gigpo import SCALES as AGENT_SCALES
from rlx.algorithms.kl import KL_ESTIMATORS, KL_PLACEMENTS
from rlx.algorithms.losses import LOSS_AGGREGATIONS, RATIO_LEVELS
from rlx.algorithms.ngrpo import DROP_STRATEGIES
from rlx.algorithms.offpolicy import CORRECTION_LEVELS, CORRECTIONS
from rlx.algorithms.preference import PREFERENCE_LOSSES
from rlx.algorithms.shaping import SHAPERS
from rlx.algorithms.transforms import TRANSFORMS
from rlx.config.fields import choices, fraction, num, positive, registry_names
from rlx.config.gives import ROLLOUT_GIVES, RolloutGives  # noqa: F401  (their old home)
from rlx.registry import published

CUSTOM = "custom"  # env.name that loads env.target (rlx.envs.registry.CUSTOM; a test keeps them equal)

# registry-backed sets: the registry's names when the config is checked (plugins' entries included). The
# registries of the layers above config (tasks, data, envs, rollout, gateway) are read as they published
# themselves (rlx.registry.publish), never imported from here: the commands import them first (rlx/cli/registries.py)
Advantage = registry_names("Advantage", lambda: ESTIMATORS)
Scale = registry_names("Scale", lambda: SCALES)
AgentScale = registry_names("AgentScale", lambda: AGENT_SCALES)
Credit = registry_names("Credit", lambda: CREDIT)
LossAgg = registry_names("LossAgg", lambda: LOSS_AGGREGATIONS)
RatioLevel = registry_names("RatioLevel", lambda: RATIO_LEVELS)
KLEstimator = registry_names("KLEstimator", lambda: KL_ESTIMATORS)
KLPlacement = registry_names("KLPlacement", lambda: KL_PLACEMENTS)
PreferenceLoss = registry_names("PreferenceLoss", lambda: PREFERENCE_LOSSES)
Verifier = registry_names("Verifier", lambda: published("verifier"))
Reader = registry_names("Reader", lambda: published("reader"))  # model.answer.reader (rlx/tasks/readers.py)
# none: preference data without a task
DataSource = registry_names("DataSource", lambda: (*published("data_source"), "none"))
# custom: env.target names the class;
EnvName = registry_names("EnvName", lambda: (*published("env"), CUSTOM, "harness"))
# harness: the user's OpenAI-client program (rlx/gateway/)
ToolParser = registry_names("ToolParser", lambda: published("tool_parser"))
# the seed ideas (issue 29)
Shaper = registry_names("Shaper", lambda: SHAPERS)
Transform = registry_names("Transform", lambda: TRANSFORMS)
DropStrategy = registry_names("DropStrategy", lambda: DROP_STRATEGIES)
PromptSamplingMode = registry_names("PromptSamplingMode", lambda: published("prompt_sampling"))
# algorithm.prompt_sampling.source: auto (the stream, or the difficulty sampler when a mode is set) or a source
PromptSourceName = registry_names("PromptSourceName", lambda: ("auto", *published("prompt_source")))
ReplayTrigger = registry_names("ReplayTrigger", lambda: published("replay_trigger"))
TemperatureMode = registry_names("TemperatureMode", lambda: published("temperature_schedule"))
ProducerName = registry_names("ProducerName", lambda: ["auto", *published("producer")])  # rollout.producer
EngineName = registry_names("EngineName", lambda: ["builtin", *published("engine")])  # rollout.engine
StageName = registry_names("StageName", lambda: published("stage"))  # algorithm.stages: a user's own producer stages
Correction = registry_names("Correction", lambda: CORRECTIONS)  # rlx.algorithms.offpolicy.CORRECTIONS
CorrectionLevel = registry_names("CorrectionLevel", lambda: CORRECTION_LEVELS)
# fixed sets
Schedule = choices("Schedule", ("constant", "cosine", "linear"))  # rlx.loops.common.SCHEDULES (a test keeps them equal)
DType = choices("DType", ("float32", "bfloat16", "float16", "auto"))  # rlx.models.loading.DTYPES
Sampler = choices("Sampler", ("v1", "v2", "v3"))  # rlx.engines.sampling.SAMPLERS
# rlx.engines.fast_decode.QUANTIZE (rollout=hf), rlx.engines.vllm_quant (rollout=vllm: fp8), and auto (generator.py)
Quantize = choices("Quantize", ("auto", "none", "int8", "int8_layers", "fp8"))
Seeding = choices("Seeding", ("request", "batch"))  # rlx.engines.vllm.SEEDING
LoraPush = choices("LoraPush", ("adapter", "merged"))  # rlx.fleet.process.LORA_PUSH
# rollout.server.publisher: auto (lora_push decides) or a weight publisher (rlx.fleet.publishers.PUBLISHERS)
Publisher = registry_names("Publisher", lambda: ("auto", *published("weight_publisher")))
OnError = choices("OnError", ("raise", "zero"))
Distributed = choices("Distributed", ("no", "ddp", "fsdp", "deepspeed"))
MixedPrecision = choices("MixedPrecision", ("no", "bf16", "fp16", "fp8"))
Offload = choices("Offload", ("none", "cpu"))
OverlongPrompts = choices("OverlongPrompts", ("drop", "truncate"))
PairSource = choices("PairSource", ("file", "hub"))  # rlx.data.preferences.PAIR_SOURCES
PairLayout = choices("PairLayout", ("auto", "text", "messages"))  # rlx.data.preferences.LAYOUTS
Truncation = choices("Truncation", ("drop", "truncate_completion", "error"))  # rlx.data.preferences.TRUNCATION_MODES
OnInvalid = choices("OnInvalid", ("raise", "skip"))  # rlx.data.preferences.ON_INVALID
Reference = choices("Reference", ("precompute", "model"))
WandbMode = choices("WandbMode", ("online", "offline", "disabled"))
Progress = Literal["auto", True, False]
HintSource = choices("HintSource", ("answer", "column"))  # rlx.rollout.stages.hints.reference_solution
AnswerPrompt = choices("AnswerPrompt", ("tags", "bare"))  # rlx.config.ANSWER_PROMPTS (a test keeps them equal)
HintPlacement = choices("HintPlacement", ("prompt", "prefix"))  # rlx/rollout/stages/hints.py


# ------------------------------------------------------------------------------------------------
# rlx train: top-level sections of conf/train.yaml
# ------------------------------------------------------------------------------------------------


@dataclass
class Optim:
    """optim: the policy's AdamW and learning-rate schedule."""

    lr: float = positive()
    weight_decay: float = num(0)
    betas: list[float] = num(0, 1, high_open=True, length=2)
    eps: float = positive()
    warmup_steps: int = num(0)
    schedule: Schedule = field()
    max_grad_norm: float | None = positive()


@dataclass
class Eval:
    """eval: the greedy held-out evaluation during training."""

    every: int = num(0)
    at_start: bool = field()
    size: int = num(0)
    max_new_tokens: int = num(1)
    batch_size: int = num(1)


@dataclass
class Log:
    every: int = num(1)
    samples_every: int = num(0)
    num_samples: int = num(0)
    progress: Progress = field()


@dataclass
class Save:
    final: bool = field()
    plot: bool = field()


@dataclass
class Checkpoint:
    every: int = num(0)
    keep: int = num(1)
    at_end: bool = field()


# ------------------------------------------------------------------------------------------------
# groups shared by train, eval and data prefs
# ------------------------------------------------------------------------------------------------


@dataclass
class Lora:
    enabled: bool = field()
    rank: int = num(1)
    alpha: float = positive()
    dropout: float = fraction(high_open=True)
    target_modules: str | list[str] = field()
    save_merged: bool = field()
    lr: float | None = positive()


@dataclass
class ModelBuild:
    """model.build: a fresh tiny model (model=tiny_scratch)."""

    vocab_size: int = num(1)
    corpus_size: int = num(1)
    hidden_size: int = num(1)
    num_layers: int = num(1)
    num_heads: int = num(1)
    intermediate_size: int = num(1)
    max_position_embeddings: int = num(1)


@dataclass
class Answer:
    """model.answer: how a task's question is put to the model and where its answer is read (conf/model/tiny.yaml)."""

    prompt: AnswerPrompt = field()
    reader: Reader | None = field()


@dataclass
class Model:
    """model=: the policy (conf/model/)."""

    path: str | None = field()
    revision: str | None = field()
    dtype: DType = field()
    lr: float = positive()
    trust_remote_code: bool = field()
    chat_template: bool = field()
    gradient_checkpointing: bool = field()
    build: ModelBuild | None = field()
    answer: Answer = field()
    lora: Lora = field()


@dataclass
class TemperatureSchedule:
    """rollout.temperature_schedule: per-token temperature within a generation (rlx/rollout/stages/temperature.py)."""

    mode: TemperatureMode = field()
    tau_max: float = positive()
    tau_min: float = positive()
    warmup_tokens: int = num(0)
    decay_d0: float = positive()
    decay_per_step: float = num(0)
    decay_max: float = positive()


@dataclass
class Rollout:
    """rollout=hf: generation by the policy itself (conf/rollout/hf.yaml)."""

    backend: str = field()
    samples_per_prompt: int = num(1)
    max_new_tokens: int = num(1)
    temperature: float = positive()
    top_p: float = fraction(low_open=True)
    top_k: int = num(0)
    batch_size: int = num(1)
    min_new_tokens: int = num(0)
    sampler: Sampler = field()
    onednn_decode: bool = field()
    quantize: Quantize = field()
    max_staleness: int = num(0)
    producer_cpus: list[int] = num(0)
    producer_threads: int | None = num(1)
    correction: Correction = field()
    correction_level: CorrectionLevel = field()
    correction_cap: float = num(1)
    correction_low: float = num(0)
    partial: bool = field()
    partial_oversample: float = num(1)
    segment_tokens: int = num(0)
    engine: EngineName = field()
    producer: ProducerName = field()
    temperature_schedule: TemperatureSchedule = field()


@dataclass
class VLLMRollout(Rollout):
    """rollout=vllm: a vLLM engine generates (conf/rollout/vllm.yaml)."""

    gpu_memory_utilization: float = fraction(low_open=True)
    max_model_len: int | None = num(1)
    dtype: DType = field()
    enforce_eager: bool = field()
    max_num_batched_tokens: int | None = num(1)
    kv_cache_gib: float | None = positive()
    sleep_level: int = num(0, 2)
    seeding: Seeding = field()
    tis_cap: float | None = num(1)


@dataclass
class ServerSettings:
    """rollout.server: where the vLLM server is, how rlx starts it and talks to it (rlx/fleet/)."""

    urls: list[str] = field()
    host: str = field()
    allow_remote: bool = field()
    python: str | None = field()
    launch_prefix: list[str] = field()
    env: dict = field()
    extra_args: list[str] = field()
    work_dir: str | None = field()
    startup_timeout_s: float = positive()
    request_timeout_s: float = positive()
    max_retries: int = num(0)
    retry_backoff_s: float = num(0)
    max_concurrency: int = num(1)
    num_servers: int = num(1)
    restarts: int = num(0)
    per_server_concurrency: int = num(1)
    min_servers: int = num(1)
    overlap_steps: bool = field()
    strict: bool = field()
    invariance_probe_rows: int = num(0)
    invariance_probe_every: int = num(1)
    publisher: Publisher = field()
    lora_push: LoraPush = field()
    bucket_mib: float = positive()
    publish_host: str | None = field()
    stop_grace_s: float = num(0)


@dataclass
class ServerRollout(Rollout):
    """rollout=server: a stock vLLM OpenAI server generates (conf/rollout/server.yaml)."""

    gpu_memory_utilization: float = fraction(low_open=True)
    max_model_len: int | None = num(1)
    dtype: DType = field()
    enforce_eager: bool = field()
    max_num_batched_tokens: int | None = num(1)
    kv_cache_gib: float | None = positive()
    tis_cap: float | None = num(1)
    server: ServerSettings = field()


# rollout.backend -> its schema (rlx.fleet.backends.ROLLOUT_BACKENDS)
ROLLOUTS = {"hf": Rollout, "vllm": VLLMRollout, "server": ServerRollout}


@dataclass
class DeepSpeed:
    zero_stage: int = num(1, 3)
    offload_optimizer_device: Offload = field()
    offload_param_device: Offload = field()
    zero3_init_flag: bool = field()
    param_persistence_threshold: int | None = num(0)


@dataclass
class Fsdp:
    version: int = num(2, 2)
    reshard_after_forward: bool = field()
    auto_wrap_policy: str = field()
    state_dict_type: str = field()
    cpu_offload: bool = field()


@dataclass
class Hardware:
    """hardware=: the Accelerate strategy (conf/hardware/)."""

    name: str = field()
    cpu: bool = field()
    distributed: Distributed = field()
    num_processes: int = num(1)
    num_machines: int = num(1)
    machine_rank: int = num(0)
    main_process_ip: str | None = field()
    main_process_port: int = num(1, 65535)
    mixed_precision: MixedPrecision = field()
    gradient_accumulation_steps: int | None = num(1)
    gradient_checkpointing: bool = field()
    num_threads: int | None = num(1)
    launcher_args: list[str] = field()
    deepspeed: DeepSpeed | None = field()
    fsdp: Fsdp | None = field()


@dataclass
class Pairs:
    """data.pairs: preference pairs (data=prefs, prefs_file, prefs_hub)."""

    source: PairSource = field()
    path: str | None = field()
    eval_path: str | None = field()
    id: str | None = field()
    subset: str | None = field()
    train_split: str = field()
    eval_split: str | None = field()
    eval_size: int = num(0)
    layout: PairLayout = field()
    columns: dict = field()
    max_prompt_length: int = num(1)
    max_completion_length: int = num(1)
    truncation: Truncation = field()
    on_invalid: OnInvalid = field()


@dataclass
class Data:
    """data=: prompts and answers (conf/data/); which keys a file has depends on data.source."""

    name: str | list[str] = field()  # reasoning_gym.yaml: ${data.task}, a list when several tasks are mixed
    source: DataSource = field()
    # source=reasoning_gym
    task: str | list[str] = field()  # one reasoning-gym task, or several mixed evenly
    task_config: dict | None = field()
    train_size: int = num(1)
    eval_seed: int = num(0)
    # source=file / hub
    train_path: str = field()
    eval_path: str | None = field()
    columns: dict = field()
    seed: int = num(0)
    id: str = field()
    subset: str | None = field()
    train_split: str = field()
    eval_split: str | None = field()
    answer_regex: str | None = field()
    # every source
    eval_size: int = num(0)
    prompt_template: str | None = field()  # null: the prompt column as it is
    verifier: Verifier | None = field()
    completion_template: str = field()
    system_prompt: str | None = field()
    max_prompt_length: int | None = num(1)
    overlong_prompts: OverlongPrompts = field()
    pairs: Pairs | None = field()


@dataclass
class Reward:
    """reward=: components (free-form keyword arguments of each `_target_`) and their weights."""

    components: dict = field()
    accuracy: str = field()
    on_error: OnError = field()


@dataclass
class Env:
    """env=: the text environment of the agent families (conf/env/)."""

    name: EnvName = field()
    target: str | None = field()
    kwargs: dict = field()
    max_turns: int = num(1)
    max_new_tokens: int = num(1)
    max_total_tokens: int = num(2)
    system_prompt: str | None = field()
    eval_episodes: int = num(1)
    eval_greedy: bool = field()
    stop_after_failed_steps: int = num(0)


@dataclass
class HarnessEnv(Env):
    """env=harness: an OpenAI-client agent program served by the gateway (conf/env/harness.yaml, rlx/gateway/)."""

    tasks: str | None = field()
    eval_tasks: str | None = field()
    concurrency: int = num(1)
    timeout_s: float = positive()
    max_batch: int = num(1)
    max_wait_ms: float = num(0)
    tool_parser: ToolParser | None = field()
    chat_template: str | None = field()
    host: str = field()
    allow_remote: bool = field()


# env.name -> its schema, for the names with knobs of their own (the gateway's, rlx.envs.registry.GATEWAY_ENVS)
OWN_SCHEMAS = {"harness": HarnessEnv}


class _EnvSchemas(dict):
    """env.name -> its schema: every environment (a registered name, custom, or one a plugin adds) shares Env's
    knobs; the harness has its own."""

    def get(self, name, default=None):
        return OWN_SCHEMAS.get(name, Env)

    def __contains__(self, name) -> bool:
        return True

    def __getitem__(self, name):
        return self.get(name)

    def __iter__(self):
        return iter((*published("env"), CUSTOM, *OWN_SCHEMAS))

    def keys(self):
        return list(self)

    def values(self):
        return [self.get(name) for name in self]

    def items(self):
        return [(name, self.get(name)) for name in self]


ENVS = _EnvSchemas()

@dataclass
class Logger:
    """logger=: trackers beside metrics.jsonl (conf/logger/)."""

    trackers: list[str] = field()
    project: str = field()
    tracking_uri: str | None = field()  # mlflow
    dir: str | None = field()  # trackio
    mode: WandbMode = field()  # wandb
