"""Typed schemas of `rlx eval`'s own sections (conf/eval.yaml, conf/benchmark/): sampling, metrics and benchmarks.
The sections it shares with `rlx train` (model, data, rollout, hardware, env) are in rlx/config/groups.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.fields import choices, fraction, num, positive
from rlx.config.groups import Data, Reader, Verifier


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


BenchmarkKind = choices("BenchmarkKind", ("generate", "loglikelihood"))
ChoiceMetric = choices("ChoiceMetric", ("acc", "acc_norm"))


@dataclass
class Benchmark:
    """benchmark.<name> (conf/benchmark/): `load` holds the loader's free-form keyword arguments."""

    kind: BenchmarkKind | None = field()  # generate (null: the same) | loglikelihood (ChoiceBenchmark)
    load: dict = field()
    data: Data | None = field()  # chain_sum: the training data config whose held-out split is evaluated
    verifier: Verifier | None = field()
    reader: Reader | None = field()  # where the verifier reads answers; null: the model's (model.answer.reader)
    extract: dict | None = field()  # {_target_: fn, ...}: overrides the verifier's extractor
    verify: dict | None = field()  # {_target_: fn, ...}: overrides the verifier's scorer
    max_new_tokens: int = num(1)
    chat_template: bool | None = field()
    system_prompt: str | None = field()


@dataclass
class ChoiceBenchmark:
    """benchmark.<name> with kind: loglikelihood (rlx/evaluation/choices.py): multiple-choice questions scored by each
    choice's log-likelihood; `load` names the loader and its keyword arguments."""

    kind: BenchmarkKind = field()
    load: dict = field()
    metric: ChoiceMetric = field()  # the headline metric: acc | acc_norm


BENCHMARKS = {"generate": Benchmark, "loglikelihood": ChoiceBenchmark}
