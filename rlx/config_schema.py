"""Every numeric and enum knob of `rlx train`, declared once: its type and valid range or choices.

`check_knobs(cfg)` runs before a model or data is loaded and stops at the first bad value with one
line naming the knob, what it got and what it accepts (raised as UserError: exit code 2). A knob
missing from the composed config (e.g. `algorithm.epochs` under SFT) is skipped; cross-field rules
(a batch that must split evenly, settings that need each other) stay in rlx/train.py and rlx/launch.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig

from rlx.config import UserError
from rlx.tasks import VERIFIERS


@dataclass(frozen=True)
class Knob:
    """One setting: `kind` int | float | bool | str | choice; `low`/`high` bounds (open when the
    matching `*_open`); `choices` for kind=choice; `nullable`: null is a valid value (off / derived)."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    nullable: bool = False

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(_shown(c) for c in self.choices)
        if self.kind == "bool":
            return "true or false"
        what = "an integer" if self.kind == "int" else "a number"
        if self.low is not None and self.high is not None:
            what += f" in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            what += f" {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            what += f" {'<' if self.high_open else '<='} {_num(self.high)}"
        return what + (" (or null)" if self.nullable else "")

    def problem(self, value) -> str | None:
        """None when `value` is valid, else why not."""
        if value is None:
            return None if self.nullable else "null"
        if self.kind == "choice":
            return None if value in self.choices else repr(value)
        if self.kind == "bool":
            return None if isinstance(value, bool) else repr(value)
        if self.kind == "str":
            return None if isinstance(value, str) else repr(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return repr(value)
        if self.kind == "int" and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            return repr(value)
        if not math.isfinite(value):
            return repr(value)
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return repr(value)
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return repr(value)
        return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _int(name, low=None, high=None, nullable=False):
    return Knob(name, "int", low, high, nullable=nullable)


def _pos(name, nullable=False):  # a number > 0
    return Knob(name, "float", 0, None, low_open=True, nullable=nullable)


def _nonneg(name, nullable=False):
    return Knob(name, "float", 0, None, nullable=nullable)


def _frac(name, low_open=False, high_open=False, nullable=False):  # in [0, 1] with optional open ends
    return Knob(name, "float", 0, 1, low_open=low_open, high_open=high_open, nullable=nullable)


def _choice(name, *choices, nullable=False):
    return Knob(name, "choice", choices=tuple(choices), nullable=nullable)


def _bool(name):
    return Knob(name, "bool")


TRAIN_KNOBS: tuple[Knob, ...] = (
    # run
    _int("seed", 0, 2**32 - 1), _int("steps", 1), _int("prompts_per_step", 1), _int("micro_batch_size", 1),
    _int("micro_batch_tokens", 1, nullable=True), _bool("packed_forward"),
    # optimizer and schedule
    _pos("optim.lr"), _nonneg("optim.weight_decay"), _pos("optim.eps"), _int("optim.warmup_steps", 0),
    _choice("optim.schedule", "constant", "cosine", "linear"), _pos("optim.max_grad_norm", nullable=True),
    # rollout
    _int("rollout.samples_per_prompt", 1), _int("rollout.max_new_tokens", 1), _pos("rollout.temperature"),
    _frac("rollout.top_p", low_open=True), _int("rollout.top_k", 0), _int("rollout.batch_size", 1),
    _int("rollout.min_new_tokens", 0), _choice("rollout.sampler", "v1", "v2"),
    _bool("rollout.onednn_decode"),
    # evaluation, logging, saving, checkpoints
    _int("eval.every", 0), _bool("eval.at_start"), _int("eval.size", 0), _int("eval.max_new_tokens", 1),
    _int("eval.batch_size", 1),
    _int("log.every", 1), _int("log.samples_every", 0), _int("log.num_samples", 0),
    Knob("log.progress", "choice", choices=("auto", True, False)),
    _bool("save.final"), _bool("save.plot"),
    _int("checkpoint.every", 0), _int("checkpoint.keep", 1),
    # model
    _choice("model.dtype", "float32", "bfloat16", "float16", "auto"), _bool("model.chat_template"),
    _bool("model.trust_remote_code"), _bool("model.gradient_checkpointing"),
    _bool("model.lora.enabled"), _int("model.lora.rank", 1), _pos("model.lora.alpha"),
    _frac("model.lora.dropout", high_open=True), _bool("model.lora.save_merged"),
    # data and reward
    _int("data.eval_size", 0), _int("data.train_size", 1), _choice("reward.on_error", "raise", "zero"),
    _choice("data.verifier", *VERIFIERS, nullable=True),
    # hardware
    _choice("hardware.mixed_precision", "no", "bf16", "fp16", "fp8"), _int("hardware.num_threads", 1, nullable=True),
    _int("hardware.num_processes", 1), _int("hardware.num_machines", 1), _int("hardware.machine_rank", 0),
    _int("hardware.main_process_port", 1, 65535), _int("hardware.gradient_accumulation_steps", 1, nullable=True),
    # algorithm (policy gradient, PPO, preference, SFT, reward model; absent knobs are skipped)
    _pos("algorithm.eps"), _nonneg("algorithm.positive_weight"), _nonneg("algorithm.negative_weight"),
    _nonneg("algorithm.clip_low"), _nonneg("algorithm.clip_high"), _nonneg("algorithm.kl_coef"),
    _nonneg("algorithm.entropy_coef"), _frac("algorithm.forking_rho", low_open=True),
    _int("algorithm.kl_horizon", 1), _int("algorithm.ref_reset_every", 0), _bool("algorithm.dynamic_sampling"),
    _int("algorithm.max_sample_batches", 1), _bool("algorithm.mask_truncated"), _int("algorithm.overlong_buffer", 0),
    _nonneg("algorithm.overlong_weight"), _int("algorithm.epochs", 1), _int("algorithm.mini_batches", 1),
    _pos("algorithm.value_lr", nullable=True), _pos("algorithm.value_lr_ratio"), _nonneg("algorithm.vf_coef"), _nonneg("algorithm.value_clip", nullable=True),
    _frac("algorithm.gamma"), _frac("algorithm.lam"), _bool("algorithm.whiten_advantages"),
    _int("algorithm.batch_size", 1), _frac("algorithm.label_smoothing", high_open=True),
    _nonneg("algorithm.sft_weight"), _bool("algorithm.length_normalize"),
)

# `rlx eval` (rlx/conf/eval.yaml): checked by rlx.evaluation.runner.check_settings before any model loads
EVAL_KNOBS: tuple[Knob, ...] = (
    _int("seed", 0, 2**32 - 1), _int("limit", 1, nullable=True),
    _bool("sampling.greedy"), _int("sampling.n", 0), _pos("sampling.temperature"),
    _frac("sampling.top_p", low_open=True), _int("sampling.top_k", 0), _int("sampling.max_new_tokens", 1, nullable=True),
    _int("sampling.batch_size", 1),
    _frac("metrics.correct_threshold"), _int("metrics.bootstrap_resamples", 1), _frac("metrics.confidence", True, True),
    _int("metrics.bootstrap_seed", 0), Knob("progress", "choice", choices=("auto", True, False)), _bool("plot"),
    _choice("model.dtype", "float32", "bfloat16", "float16", "auto"), _bool("model.chat_template"),
    _int("hardware.num_threads", 1, nullable=True),
)

# knobs whose meaning depends on the family: checked only there
FAMILY_ONLY = {"algorithm.gamma": ("ppo",)}


def _lookup(cfg, dotted: str):
    """(True, value) when the dotted key exists in cfg, else (False, None)."""
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False, None
        node = node.get(part)
    return True, node


def check_knobs(cfg, knobs: tuple[Knob, ...] = TRAIN_KNOBS) -> None:
    """Raise UserError naming the first knob whose value has the wrong type or lies out of range."""
    family = cfg.get("algorithm", {}).get("family") if isinstance(cfg, DictConfig) else None
    for knob in knobs:
        if knob.name in FAMILY_ONLY and family not in FAMILY_ONLY[knob.name]:
            continue
        present, value = _lookup(cfg, knob.name)
        if not present:
            continue
        bad = knob.problem(value)
        if bad is not None:
            raise UserError(f"{knob.name}={_shown(value)} is not valid: it must be {knob.describe()}")
    betas = cfg.get("optim", {}).get("betas") if isinstance(cfg, DictConfig) else None
    if betas is not None:
        values = list(betas) if isinstance(betas, ListConfig) else None
        if (values is None or len(values) != 2 or any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in values)
                or not all(0 <= b < 1 for b in values)):
            raise UserError(f"optim.betas={_shown(betas)} is not valid: it must be two numbers in [0, 1), e.g. [0.9, 0.99]")


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, ListConfig):
        return str(list(value))
    return str(value)
