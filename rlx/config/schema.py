"""Typed schemas of every config group, declared once: each knob's type and valid range or choices.

One dataclass per group (the algorithm group: one per family; rollout: one per backend). A field's type
says what a knob holds: int, float, bool, str, an Enum for a closed set of names (registry-backed sets
take their names from the registry dict, e.g. algorithm.advantage from rlx.algorithms.advantages), a
nested dataclass for a sub-group, `X | None` when null is valid (off / derived), `dict` for free-form
keyword arguments. `num(...)` metadata carries the range.

The schemas declare types only: YAML (conf/) stays the single source of defaults and their comments,
so no field has a default here. `check_config(cfg)` walks the composed config against them before a model
or data is loaded and stops at the first problem with one line (UserError, exit code 2): a bad value
(`optim.lr=0 is not valid: it must be a number > 0`), an unknown name (`unknown optim.schedule 'cosin';
valid choices: ...`), or a key the chosen option does not have (`algorithm.vf_coef is a ppo knob ...`).
A new knob is one YAML line with its comment plus one field here; tests/test_config_schema.py fails
when a shipped YAML key has no field or a field no YAML key. Cross-field rules (a batch that must split
evenly, settings that need each other) live in rlx/config/rules.py.

Why a walk of rlx's own rather than `OmegaConf.structured` merged under Hydra's ConfigStore: a structured
config needs a default (or MISSING) per field, which would copy YAML's defaults here; its errors are
multi-line and worded by OmegaConf; and the algorithm group's schema depends on `algorithm.family`, which a
merge cannot pick. The dataclasses are still plain typed declarations that OmegaConf could read.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from omegaconf import DictConfig, ListConfig

from rlx.algorithms.advantages import ESTIMATORS, SCALES
from rlx.algorithms.gigpo import CREDIT
from rlx.algorithms.gigpo import SCALES as AGENT_SCALES
from rlx.algorithms.kl import KL_ESTIMATORS, KL_PLACEMENTS
from rlx.algorithms.losses import LOSS_AGGREGATIONS, RATIO_LEVELS
from rlx.algorithms.ngrpo import DROP_STRATEGIES
from rlx.algorithms.preference import PREFERENCE_LOSSES
from rlx.algorithms.shaping import SHAPERS
from rlx.algorithms.transforms import TRANSFORMS
from rlx.data.difficulty import SAMPLING_WEIGHTS
from rlx.data.tasks import DATA_SOURCES
from rlx.errors import UserError
from rlx.rollout.replay import TRIGGERS
from rlx.rollout.temperature import TEMPERATURE_SCHEDULES
from rlx.tasks import VERIFIERS


def num(low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False,
        length: int | None = None):
    """A numeric field's range: [low, high], ends open when `*_open`; None: unbounded on that side.
    length: a list of exactly this many numbers (each in the range)."""
    return field(metadata={"low": low, "high": high, "low_open": low_open, "high_open": high_open, "length": length})


def positive():  # a number > 0
    return num(0, low_open=True)


def fraction(low_open: bool = False, high_open: bool = False):  # in [0, 1], ends optionally open
    return num(0, 1, low_open, high_open)


def choices(name: str, names) -> type[enum.Enum]:
    """A closed set of names as an Enum (values are the names as they appear in YAML)."""
    return enum.Enum(name, [(str(n), n) for n in names], type=str)


# closed sets; the registry-backed ones list the registry's keys, so a new registry entry is valid here at once
Advantage = choices("Advantage", ESTIMATORS)
Scale = choices("Scale", SCALES)
AgentScale = choices("AgentScale", AGENT_SCALES)
Credit = choices("Credit", CREDIT)
LossAgg = choices("LossAgg", LOSS_AGGREGATIONS)
RatioLevel = choices("RatioLevel", RATIO_LEVELS)
KLEstimator = choices("KLEstimator", KL_ESTIMATORS)
KLPlacement = choices("KLPlacement", KL_PLACEMENTS)
PreferenceLoss = choices("PreferenceLoss", PREFERENCE_LOSSES)
Verifier = choices("Verifier", VERIFIERS)
DataSource = choices("DataSource", (*DATA_SOURCES, "none"))  # none: preference data without a task to evaluate
Schedule = choices("Schedule", ("constant", "cosine", "linear"))  # rlx.loops.common.SCHEDULES (a test keeps them equal)
DType = choices("DType", ("float32", "bfloat16", "float16", "auto"))  # rlx.models.loading.DTYPES
Sampler = choices("Sampler", ("v1", "v2"))  # rlx.rollout.sampling.SAMPLERS
Seeding = choices("Seeding", ("request", "batch"))  # rlx.rollout.vllm.SEEDING
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
# the seed ideas (issue 29): registry-backed too
Shaper = choices("Shaper", SHAPERS.names())
Transform = choices("Transform", TRANSFORMS.names())
DropStrategy = choices("DropStrategy", DROP_STRATEGIES.names())
PromptSamplingMode = choices("PromptSamplingMode", SAMPLING_WEIGHTS.names())
ReplayTrigger = choices("ReplayTrigger", TRIGGERS.names())
HintSource = choices("HintSource", ("answer", "column"))  # rlx.rollout.hints.reference_solution
HintPlacement = choices("HintPlacement", ("prompt", "prefix"))  # rlx.rollout.group_stages GroupStages._hint
TemperatureMode = choices("TemperatureMode", TEMPERATURE_SCHEDULES.names())


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
    lora: Lora = field()


@dataclass
class TemperatureSchedule:
    """rollout.temperature_schedule: per-token temperature within a generation (rlx/rollout/temperature.py)."""

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


ROLLOUTS = {"hf": Rollout, "vllm": VLLMRollout}  # rollout.backend -> its schema (rlx.rollout.vllm.ROLLOUT_BACKENDS)


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

    name: str = field()
    source: DataSource = field()
    # source=reasoning_gym
    task: str = field()
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
    prompt_template: str = field()
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

    name: str = field()
    target: str | None = field()
    kwargs: dict = field()
    max_turns: int = num(1)
    max_new_tokens: int = num(1)
    max_total_tokens: int = num(2)
    system_prompt: str | None = field()
    eval_episodes: int = num(1)
    eval_greedy: bool = field()


@dataclass
class Logger:
    """logger=: trackers beside metrics.jsonl (conf/logger/)."""

    trackers: list[str] = field()
    project: str = field()
    tracking_uri: str | None = field()  # mlflow
    dir: str | None = field()  # trackio
    mode: WandbMode = field()  # wandb


# ------------------------------------------------------------------------------------------------
# algorithm=: one schema per family (algorithm.family picks it); a group carries only its family's knobs
# ------------------------------------------------------------------------------------------------


@dataclass
class Algorithm:
    name: str = field()
    family: str = field()
    PRESET: ClassVar[str] = ""  # the algorithm= option to name when a user passes this family's knob elsewhere


@dataclass
class SeedShaping:
    """algorithm.shaping: knobs of the shapers and advantage transforms (conf/algorithm/grpo.yaml)."""

    length_alpha: float = num(0)
    target_tokens: int = num(1)
    adapt_every: int = num(1)
    target_candidates: list[int] = num(1)
    expected_correct: int = num(1)
    unlikeliness_beta: float = fraction()
    assumed_fp_rate: float = fraction(high_open=True)
    assumed_fn_rate: float = fraction(high_open=True)
    agrae_alpha: float = positive()
    pass_k: int = num(1)
    efficiency_weight: float = num(0)


@dataclass
class VerifierNoise:
    """algorithm.verifier_noise: synthetic verifier errors for controlled studies."""

    fn_rate: float = fraction(high_open=True)
    fp_rate: float = fraction(high_open=True)


@dataclass
class PromptSampling:
    """algorithm.prompt_sampling: difficulty-aware prompt draws (rlx/data/difficulty.py)."""

    mode: PromptSamplingMode = field()
    ema: float = fraction(low_open=True)
    eps: float = num(0)
    prior: float = fraction()
    retire_after: int = num(0)


@dataclass
class Replay:
    """algorithm.replay: replay into collapsed groups (rlx/rollout/replay.py)."""

    enabled: bool = field()
    trigger: ReplayTrigger = field()
    per_prompt: int = num(1)
    max_age: int = num(0)


@dataclass
class Hints:
    """algorithm.hints: hints for all-fail groups (rlx/rollout/hints.py)."""

    enabled: bool = field()
    placement: HintPlacement = field()
    source: HintSource = field()
    column: str | None = field()
    fraction_start: float = fraction()
    fraction_end: float = fraction()
    anneal_steps: int = num(0)
    samples: int = num(1)
    template: str = field()


@dataclass
class PolicyGradient(Algorithm):
    """family policy_gradient (conf/algorithm/grpo.yaml and the presets extending it)."""

    PRESET: ClassVar[str] = "grpo"
    advantage: Advantage = field()
    scale: Scale = field()
    eps: float = positive()
    positive_weight: float = num(0)
    negative_weight: float = num(0)
    clip_low: float = num(0)
    clip_high: float = num(0)
    dual_clip: float | None = field()
    ratio_level: RatioLevel = field()
    loss_agg: LossAgg = field()
    kl_coef: float = num(0)
    kl_estimator: KLEstimator = field()
    kl_in: KLPlacement = field()
    kl_target: float | None = positive()
    kl_horizon: int = num(1)
    ref_reset_every: int = num(0)
    entropy_coef: float = num(0)
    forking_rho: float = fraction(low_open=True)
    dynamic_sampling: bool = field()
    max_sample_batches: int = num(1)
    mask_truncated: bool = field()
    overlong_buffer: int = num(0)
    overlong_weight: float = num(0)
    epochs: int = num(1)
    mini_batches: int = num(1)
    skip_zero_advantage: bool = field()
    # seed ideas (issue 29)
    virtual_reward: float = field()
    virtual_samples: int = num(1)
    dynamic_sampling_drop: DropStrategy = field()
    shapers: list[Shaper] = field()
    transforms: list[Transform] = field()
    shaping: SeedShaping = field()
    verifier_noise: VerifierNoise = field()
    prompt_sampling: PromptSampling = field()
    replay: Replay = field()
    hints: Hints = field()


@dataclass
class PPO(PolicyGradient):
    """family ppo (conf/algorithm/ppo.yaml): the policy-gradient knobs plus the critic's."""

    PRESET: ClassVar[str] = "ppo"
    value_model: str | None = field()
    value_lr: float | None = positive()
    value_lr_ratio: float = positive()
    vf_coef: float = num(0)
    value_clip: float | None = num(0)
    gamma: float = fraction()
    lam: float = fraction()
    whiten_advantages: bool = field()


@dataclass
class EntropySmoothing:
    """algorithm.entropy_smoothing (agent family): EPO-style entropy band (rlx/algorithms/entropy_band.py)."""

    coef: float = num(0)
    low: float = num(0)
    high: float = positive()


@dataclass
class Agent(Algorithm):
    """family agent (conf/algorithm/agent_grpo.yaml, gigpo, mt_grpo): the multi-turn loop."""

    PRESET: ClassVar[str] = "agent_grpo"
    credit: Credit = field()
    scale: AgentScale = field()
    eps: float = positive()
    gamma: float = fraction()
    step_weight: float = field()
    turn_weight: float = field()
    invalid_penalty: float = field()
    clip_low: float = num(0)
    clip_high: float = num(0)
    dual_clip: float | None = field()
    ratio_level: RatioLevel = field()
    loss_agg: LossAgg = field()
    kl_coef: float = num(0)
    kl_estimator: KLEstimator = field()
    kl_in: KLPlacement = field()
    kl_target: float | None = positive()
    kl_horizon: int = num(1)
    ref_reset_every: int = num(0)
    entropy_coef: float = num(0)
    forking_rho: float = fraction(low_open=True)
    mask_truncated: bool = field()
    epochs: int = num(1)
    mini_batches: int = num(1)
    skip_zero_advantage: bool = field()
    # seed ideas (issue 29)
    gate_threshold: float | None = field()
    hgpo_depth: int = num(0)
    hgpo_alpha: float = num(0)
    entropy_smoothing: EntropySmoothing = field()


@dataclass
class AgentSFT(Algorithm):
    PRESET: ClassVar[str] = "agent_sft"
    skill: float = fraction()


@dataclass
class SFT(Algorithm):
    PRESET: ClassVar[str] = "sft"
    batch_size: int = num(1)


@dataclass
class Preference(Algorithm):
    """family preference (conf/algorithm/dpo.yaml and the losses extending it)."""

    PRESET: ClassVar[str] = "dpo"
    loss_type: PreferenceLoss = field()
    beta: float = positive()
    label_smoothing: float = fraction(high_open=True)
    gamma: float = field()
    length_normalize: bool = field()
    sft_weight: float = num(0)
    batch_size: int = num(1)
    reference: Reference = field()


@dataclass
class RewardModel(Algorithm):
    PRESET: ClassVar[str] = "reward_model"
    batch_size: int = num(1)
    use_margin: bool = field()
    center_coef: float = num(0)


# algorithm.family -> its schema (the same names as rlx.build.LOOPS; a test keeps them equal)
ALGORITHMS = {"policy_gradient": PolicyGradient, "ppo": PPO, "agent": Agent, "agent_sft": AgentSFT, "sft": SFT,
              "preference": Preference, "reward_model": RewardModel}


@dataclass
class Expected:
    """expected: a recipe's reproduced figure, read by `make reproduce` (scripts/reproduce.py)."""

    metric: str = field()
    value: float = field()
    tolerance: float = num(0)


@dataclass
class TrainConfig:
    """`rlx train` (conf/train.yaml)."""

    name: str = field()
    seed: int = num(0, 2**32 - 1)
    steps: int = num(1)
    prompts_per_step: int = num(1)
    micro_batch_size: int = num(1)
    micro_batch_tokens: int | None = num(1)
    packed_forward: bool = field()
    optimized_metric: str = field()
    optim: Optim = field()
    eval: Eval = field()
    log: Log = field()
    save: Save = field()
    checkpoint: Checkpoint = field()
    resume: str | None = field()
    model: Model = field()
    algorithm: Algorithm = field()
    reward: Reward = field()
    data: Data = field()
    rollout: Rollout = field()
    env: Env | None = field()
    hardware: Hardware = field()
    logger: Logger = field()
    expected: Expected | None = field()  # recipes only


# ------------------------------------------------------------------------------------------------
# rlx eval (conf/eval.yaml) and rlx data prefs (conf/data_prefs.yaml)
# ------------------------------------------------------------------------------------------------


@dataclass
class Sampling:
    greedy: bool = field()
    n: int = num(0)
    temperature: float = positive()
    top_p: float = fraction(low_open=True)
    top_k: int = num(0)
    max_new_tokens: int | None = num(1)
    batch_size: int = num(1)


@dataclass
class EvalMetrics:
    ks: list[int] = num(1)
    correct_threshold: float = fraction()
    bootstrap_resamples: int = num(1)
    confidence: float = fraction(low_open=True, high_open=True)
    bootstrap_seed: int = num(0)


@dataclass
class Benchmark:
    """benchmark.<name> (conf/benchmark/): `load` holds the loader's free-form keyword arguments."""

    load: dict = field()
    data: Data | None = field()  # chain_sum: the training data config whose held-out split is evaluated
    verifier: Verifier | None = field()
    extract: dict | None = field()  # {_target_: fn, ...}: overrides the verifier's extractor
    verify: dict | None = field()  # {_target_: fn, ...}: overrides the verifier's scorer
    max_new_tokens: int = num(1)
    chat_template: bool | None = field()
    system_prompt: str | None = field()


@dataclass
class EvalConfig:
    """`rlx eval` (conf/eval.yaml)."""

    name: str = field()
    run: str | None = field()
    checkpoint: str = field()
    compare: str | None = field()
    resume: str | None = field()
    seed: int = num(0, 2**32 - 1)
    limit: int | None = num(1)
    sampling: Sampling = field()
    metrics: EvalMetrics = field()
    progress: Progress = field()
    plot: bool = field()
    model: Model = field()
    benchmark: dict[str, Benchmark] = field()
    env: Env | None = field()
    rollout: Rollout = field()
    hardware: Hardware = field()


@dataclass
class DataPrefsConfig:
    """`rlx data prefs` (conf/data_prefs.yaml)."""

    out: str = field()
    prompts: int = num(1)
    samples_per_prompt: int = num(2)
    pairs_per_prompt: int = num(1)
    seed: int = num(0, 2**32 - 1)
    progress: Progress = field()
    model: Model = field()
    data: Data = field()
    reward: Reward = field()
    rollout: Rollout = field()
    hardware: Hardware = field()


# primary config name -> its schema, and the command that composes it
SCHEMAS = {"train": TrainConfig, "eval": EvalConfig, "data_prefs": DataPrefsConfig}
COMMANDS = {"train": "rlx train", "eval": "rlx eval", "data_prefs": "rlx data prefs"}
# a group whose schema depends on one of its keys: base schema -> (key, {value: schema})
DISPATCH = {Algorithm: ("family", ALGORITHMS), Rollout: ("backend", ROLLOUTS)}
_GROUP_OPTION = {Algorithm: "algorithm", Rollout: "rollout"}  # the `group=option` that selects a dispatched schema


# ------------------------------------------------------------------------------------------------
# the check
# ------------------------------------------------------------------------------------------------


def check_config(cfg: DictConfig, config_name: str = "train") -> None:
    """Raise UserError naming the first knob whose value has the wrong type, lies out of range, or that
    the chosen option does not have. Keys whose value is still missing (`???`) are left to the reader
    that needs them (it names the knob). Values given directly are checked before those interpolated from
    another knob (`eval.max_new_tokens: ${rollout.max_new_tokens}`), so a bad value is named where it is set."""
    for derived in (False, True):
        _check_section(cfg, SCHEMAS[config_name], "", config_name, derived)


@functools.cache
def schema_fields(schema: type) -> dict[str, tuple[object, dict]]:
    """{field name: (type, range metadata)} of a schema dataclass (annotations resolved)."""
    hints = typing.get_type_hints(schema)
    return {f.name: (hints[f.name], dict(f.metadata)) for f in dataclasses.fields(schema)}


def dispatched(schema: type, node: DictConfig, prefix: str) -> type:
    """The schema of a group that depends on one of its keys (algorithm.family, rollout.backend)."""
    if schema not in DISPATCH:
        return schema
    key, table = DISPATCH[schema]
    value = node.get(key) if key in node else None
    if value not in table:
        raise UserError(f"unknown {prefix}{key} '{_shown(value)}'{_nearest(str(value), list(table))}; "
                        f"valid choices: {', '.join(table)}")
    return table[value]


def _check_section(node: DictConfig, schema: type, prefix: str, config_name: str, derived: bool = False) -> None:
    """derived=False: keys and the values set directly; derived=True: the interpolated values."""
    schema = dispatched(schema, node, prefix)
    known = schema_fields(schema)
    for key in node.keys():
        if not prefix and key == "hydra":
            continue
        if str(key) not in known:
            raise UserError(unknown_key_message(prefix + str(key), node, schema, config_name))
    for key, value in _present(node):
        if prefix or key != "hydra":
            kind, meta = known[key]
            if isinstance(value, DictConfig) or node._get_node(key)._is_interpolation() == derived:
                _check_value(prefix + key, value, kind, meta, config_name, derived)


def _present(node: DictConfig):
    """(key, resolved value) of a section's keys, leaving out missing values (`???`) and interpolations
    that do not resolve here: the reader that needs them names them."""
    for key in node.keys():
        child = node._get_node(key)
        if child is None or child._is_missing():
            continue
        try:
            value = node[key]
        except Exception:
            continue
        yield str(key), value


def _check_value(name: str, value, kind, meta: dict, config_name: str, derived: bool = False) -> None:
    nullable, kinds = _unpack(kind)
    if value is None:
        if not nullable:
            raise UserError(f"{name}=null is not valid: it must be {_describe(kinds, meta)}")
        return
    mappings = [typing.get_args(k)[1] for k in kinds if typing.get_origin(k) is dict
                and dataclasses.is_dataclass(typing.get_args(k)[1])]
    if mappings and isinstance(value, DictConfig):  # benchmark.<name>: one section per entry
        for key, entry in _present(value):
            _check_value(f"{name}.{key}", entry, mappings[0], {}, config_name, derived)
        return
    sections = [k for k in kinds if dataclasses.is_dataclass(k)]
    if sections:
        if not isinstance(value, DictConfig):
            raise UserError(f"{name}={_shown(value)} is not valid: it must be a group of settings ({name}.KEY=VALUE)")
        _check_section(value, sections[0], name + ".", config_name, derived)
        return
    if any(_fits(value, k, meta) for k in kinds):
        return
    named_lists = [typing.get_args(k)[0] for k in kinds if typing.get_origin(k) is list
                   and isinstance(typing.get_args(k)[0], type) and issubclass(typing.get_args(k)[0], enum.Enum)]
    if named_lists and isinstance(value, ListConfig):  # a list of registry names: name the entry that is not one
        valid = [m.value for m in named_lists[0]]
        bad = next((v for v in value if v not in valid), None)
        if bad is not None:
            raise UserError(f"unknown {name} entry '{_shown(bad)}'{_nearest(str(bad), valid)}; valid choices: {', '.join(valid)}")
    enums = [k for k in kinds if isinstance(k, type) and issubclass(k, enum.Enum)]
    literals = [a for k in kinds if typing.get_origin(k) is Literal for a in typing.get_args(k)]
    if (enums or literals) and len(kinds) == 1:
        valid = [m.value for e in enums for m in e] + literals
        shown = [_shown(v) for v in valid] + (["null"] if nullable else [])
        raise UserError(f"unknown {name} '{_shown(value)}'; valid choices: {', '.join(shown)}")
    raise UserError(f"{name}={_shown(value)} is not valid: it must be {_describe(kinds, meta)}"
                    + (" (or null)" if nullable else ""))


def _unpack(kind) -> tuple[bool, list]:
    """(null allowed, the non-null member types) of `X | Y | None`."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        return type(None) in args, [a for a in args if a is not type(None)]
    return False, [kind]


def _fits(value, kind, meta: dict) -> bool:
    origin = typing.get_origin(kind)
    if kind is dict or origin is dict:
        return isinstance(value, DictConfig)
    if kind is list or origin is list:
        if not isinstance(value, ListConfig):
            return False
        item = typing.get_args(kind)[0] if origin is list else object
        if meta.get("length") is not None and len(value) != meta["length"]:
            return False
        return all(item is object or _fits(v, item, meta) for v in value)
    if origin is Literal:
        return any(value is a or (not isinstance(a, bool) and value == a) for a in typing.get_args(kind))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return isinstance(value, str) and value in {m.value for m in kind}
    if kind is bool:
        return isinstance(value, bool)
    if kind is str:  # a name or path; numbers are kept as given (a subset called 2020)
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if kind is int and not (isinstance(value, int) or value.is_integer()):
            return False
        return _in_range(value, meta)
    raise TypeError(f"rlx.config.schema has no check for the type {kind!r}")


def _in_range(value: float, meta: dict) -> bool:
    low, high = meta.get("low"), meta.get("high")
    if low is not None and (value < low or (meta.get("low_open") and value == low)):
        return False
    return high is None or not (value > high or (meta.get("high_open") and value == high))


def _describe(kinds: list, meta: dict) -> str:
    texts = []
    for kind in kinds:
        origin = typing.get_origin(kind)
        if kind is bool:
            texts.append("true or false")
        elif kind is str:
            texts.append("a string")
        elif kind is dict or origin is dict:
            texts.append("a group of settings")
        elif kind is list or origin is list:
            item = typing.get_args(kind)[0] if origin is list else None
            what = {int: "integers", float: "numbers", str: "strings"}.get(item)
            count = {2: "two"}.get(meta.get("length"), meta.get("length"))
            texts.append(f"{count} {what}{_range_text(meta)}" if count and what else
                         f"a list of {what}{_range_text(meta)}" if what else "a list")
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            texts.append("one of " + ", ".join(m.value for m in kind))
        elif origin is Literal:
            texts.append("one of " + ", ".join(_shown(a) for a in typing.get_args(kind)))
        elif kind in (int, float):
            texts.append(("an integer" if kind is int else "a number") + _range_text(meta))
    return " or ".join(texts)


def _range_text(meta: dict) -> str:
    low, high = meta.get("low"), meta.get("high")
    if low is not None and high is not None:
        return (f" in {'(' if meta.get('low_open') else '['}{_num(low)}, {_num(high)}"
                f"{')' if meta.get('high_open') else ']'}")
    if low is not None:
        return f" {'>' if meta.get('low_open') else '>='} {_num(low)}"
    if high is not None:
        return f" {'<' if meta.get('high_open') else '<='} {_num(high)}"
    return ""


def owners(group_schema: type, key: str) -> list[type]:
    """The schemas of a dispatched group (algorithm families, rollout backends) that have `key`."""
    _, table = DISPATCH[group_schema]
    return [schema for schema in dict.fromkeys(table.values()) if key in schema_fields(schema)]


def unknown_key_message(name: str, node, schema: type, config_name: str = "train") -> str:
    """One line for a key the composed config should not have: the family (or backend) that has it, or
    the nearest known key."""
    key = name.rsplit(".", 1)[-1]
    base = next((b for b in DISPATCH if issubclass(schema, b)), None)
    if base is not None:
        having = owners(base, key)
        if having:
            group = _GROUP_OPTION[base]
            names = [k for k, v in DISPATCH[base][1].items() if v in having]
            options = [getattr(s, "PRESET", "") or k for k, s in DISPATCH[base][1].items() if s in having]
            chosen = (f", not a knob of {group}={node.get('name') or node.get(DISPATCH[base][0])}"
                      if isinstance(node, DictConfig) else "")
            options = list(dict.fromkeys(options))
            listed = options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
            return f"{name} is a {' / '.join(names)} knob{chosen}; use {group}={listed} (or leave {name} out)"
    siblings = [name[: -len(key)] + k for k in schema_fields(schema)]
    command = COMMANDS.get(config_name, config_name)
    return f"unknown key '{name}'{_nearest(name, siblings)}; `{command} --help` shows every key with its comment"


def family_knob_message(name: str) -> str | None:
    """For `algorithm.KEY` / `rollout.KEY` missing from the chosen option: the line naming who has it."""
    group, _, key = name.partition(".")
    base = {"algorithm": Algorithm, "rollout": Rollout}.get(group)
    if base is None or "." in key or not owners(base, key):
        return None
    return unknown_key_message(name, None, base)


def _nearest(word: str, choices_: list[str]) -> str:
    close = difflib.get_close_matches(word, choices_, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, ListConfig):
        return str(list(value))
    return str(value)
