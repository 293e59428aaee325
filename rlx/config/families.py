"""Typed schemas of the algorithm group: one dataclass per family (`algorithm.family` picks it, ALGORITHMS), so a
group carries only its own family's knobs and a knob of another family is named as such (rlx/config/schema.py).
Each field: its type and range; defaults and comments live in conf/algorithm/*.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlx.config.fields import fraction, num, positive
from rlx.config.groups import (
    Advantage,
    AgentScale,
    Credit,
    DropStrategy,
    HintPlacement,
    HintSource,
    KLEstimator,
    KLPlacement,
    LossAgg,
    PreferenceLoss,
    PromptSamplingMode,
    PromptSourceName,
    RatioLevel,
    Reference,
    ReplayTrigger,
    Scale,
    Shaper,
    StageName,
    Transform,
)


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
    """algorithm.prompt_sampling: which training prompts are drawn (rlx/data/sources.py): the source, and the
    difficulty-aware sampler's knobs (rlx/data/difficulty.py)."""

    source: PromptSourceName = field()
    mode: PromptSamplingMode = field()
    ema: float = fraction(low_open=True)
    eps: float = num(0)
    prior: float = fraction()
    retire_after: int = num(0)


@dataclass
class Replay:
    """algorithm.replay: replay into collapsed groups (rlx/rollout/stages/replay.py)."""

    enabled: bool = field()
    trigger: ReplayTrigger = field()
    per_prompt: int = num(1)
    max_age: int = num(0)


@dataclass
class Hints:
    """algorithm.hints: hints for all-fail groups (rlx/rollout/stages/hints.py)."""

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
class Update(Algorithm):
    """The update knobs of the three families trained by the clipped surrogate (policy_gradient, ppo, agent): the
    ratio, clipping and aggregation of the policy loss (rlx/algorithms/policy_loss.py), the KL to the reference, the
    entropy bonus, and the passes and optimizer steps over each rollout batch. Composed by inheritance so their keys
    stay flat: `algorithm.clip_low`, never `algorithm.update.clip_low`."""

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
    mask_truncated: bool = field()
    epochs: int = num(1)
    mini_batches: int = num(1)


@dataclass
class CriticFreeUpdate(Update):
    """The update knobs of the policy-gradient loop (families policy_gradient and agent), which PPO's loop does not
    apply: forking tokens, and no step when no advantage carries a signal."""

    forking_rho: float = fraction(low_open=True)
    skip_zero_advantage: bool = field()


@dataclass
class SingleTurnSampling:
    """The single-turn producer's knobs (families policy_gradient and ppo; conf/algorithm/parts/single_turn.yaml):
    the estimator's name and eps, dynamic sampling, the overlong penalty, and the seed ideas' group stages."""

    advantage: Advantage = field()
    eps: float = positive()
    dynamic_sampling: bool = field()
    max_sample_batches: int = num(1)
    overlong_buffer: int = num(0)
    overlong_weight: float = num(0)
    dynamic_sampling_drop: DropStrategy = field()
    shapers: list[Shaper] = field()
    shaping: SeedShaping = field()
    verifier_noise: VerifierNoise = field()
    prompt_sampling: PromptSampling = field()
    replay: Replay = field()
    hints: Hints = field()
    stages: list[StageName] = field()


@dataclass
class PolicyGradient(CriticFreeUpdate, SingleTurnSampling):
    """family policy_gradient (conf/algorithm/grpo.yaml and the presets extending it): the shared update and
    single-turn knobs, plus the outcome estimators' and the advantage transforms'."""

    PRESET: ClassVar[str] = "grpo"
    scale: Scale = field()
    positive_weight: float = num(0)
    negative_weight: float = num(0)
    # seed ideas (issue 29)
    virtual_reward: float = field()
    virtual_samples: int = num(1)
    transforms: list[Transform] = field()


@dataclass
class PPO(Update, SingleTurnSampling):
    """family ppo (conf/algorithm/ppo.yaml): the shared update and single-turn knobs plus the critic's."""

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
class Agent(CriticFreeUpdate):
    """family agent (conf/algorithm/agent_grpo.yaml, gigpo, mt_grpo): episodes through the policy-gradient loop; the
    update knobs are the shared ones (Update, CriticFreeUpdate), the credit rules' below."""

    PRESET: ClassVar[str] = "agent_grpo"
    credit: Credit = field()
    scale: AgentScale = field()
    eps: float = positive()
    gamma: float = fraction()
    step_weight: float = field()
    turn_weight: float = field()
    invalid_penalty: float = field()
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
