"""Every registry a config names an entry of, by the kind `rlx.register(kind, name)` takes: where it lives, the
knob that names its entries, and the contract an entry follows (docs/extending/plugins.md lists the same).

    import rlx

    @rlx.register("advantage", "my_mean", needs={"group_baseline": True})
    def my_mean(rewards, group_ids, **knobs):                       # (N,), (N,) equal id = same group
        _, index = torch.unique(group_ids, return_inverse=True)     # (N,) groups numbered 0..K-1
        sums = torch.zeros(int(index.max()) + 1).index_add_(0, index, rewards)
        counts = torch.bincount(index).to(rewards.dtype)
        return rewards - (sums / counts)[index]

then `rlx train plugins=[my_module] algorithm.advantage=my_mean`.

Importing this module imports every module that registers (and so publishes its registry, rlx.registry.publish):
the commands import it before they compose a config, because rlx/config/ reads the names of the registries above
it (tasks, data, envs, rollout, gateway) as published, never by importing those layers (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlx.algorithms.advantages import OUTCOME_ESTIMATORS, SCALES
from rlx.algorithms.gigpo import CREDIT
from rlx.algorithms.gigpo import SCALES as AGENT_SCALES
from rlx.algorithms.kl import KL_ESTIMATORS, KL_PLACEMENTS
from rlx.algorithms.losses import LOSS_AGGREGATIONS, RATIO_LEVELS
from rlx.algorithms.ngrpo import DROP_STRATEGIES
from rlx.algorithms.preference import REFERENCE_FREE_LOSSES, REFERENCE_LOSSES
from rlx.algorithms.shaping import SHAPERS
from rlx.algorithms.transforms import TRANSFORMS
from rlx.data.difficulty import SAMPLING_WEIGHTS
from rlx.data.sources import PROMPT_SOURCES
from rlx.data.tasks import DATA_SOURCES
from rlx.engines.custom import ENGINES, register_engine
from rlx.envs.registry import ENVIRONMENTS
from rlx.fleet.publishers import PUBLISHERS
from rlx.gateway.tools import TOOL_PARSERS  # noqa: F401  (env.tool_parser's names: published, not a plugin kind)
from rlx.registry import Registry, UnknownName
from rlx.rollout.producers import PRODUCERS
from rlx.rollout.stages import STAGES
from rlx.rollout.stages.replay import TRIGGERS
from rlx.rollout.stages.temperature import TEMPERATURE_SCHEDULES
from rlx.tasks import READERS, VERIFIERS, register_verifier


@dataclass(frozen=True)
class Kind:
    registry: Registry
    knob: str       # the config key that names an entry
    contract: str   # what an entry is called with and returns
    decorator: Callable | None = None  # fn(name, **options) -> decorator, for kinds whose entry is built (verifier)


KINDS = {
    "advantage": Kind(OUTCOME_ESTIMATORS, "algorithm.advantage",
                      "fn(rewards (N,), group_ids (N,), *, scale, eps, **knobs) -> advantages (N,) "
                      "or (advantages, keep (N,) bool[, metrics dict]); needs: EstimatorNeeds"),
    "scale": Kind(SCALES, "algorithm.scale", "fn(grouped rewards (B, G), rewards (B*G,), eps) -> denominator"),
    "agent_scale": Kind(AGENT_SCALES, "algorithm.scale (agent family)", "fn(group std (K,), eps) -> denominator"),
    "credit": Kind(CREDIT, "algorithm.credit",
                   "fn(episode_group (E,), step_episode (S,), step_rewards (S,), step_anchor (S,), **knobs) -> "
                   "(step advantages (S,), metrics dict)"),
    "loss_agg": Kind(LOSS_AGGREGATIONS, "algorithm.loss_agg",
                     "fn(masked token loss (N, T), mask (N, T), total_tokens, total_seqs, max_len) -> scalar"),
    "ratio_level": Kind(RATIO_LEVELS, "algorithm.ratio_level", "fn(logp, old_logp, mask), each (N, T) -> ratio (N, T)"),
    "kl_estimator": Kind(KL_ESTIMATORS, "algorithm.kl_estimator", "fn(log pi - log pi_ref (N, T)) -> KL (N, T)"),
    "kl_placement": Kind(KL_PLACEMENTS, "algorithm.kl_in",
                         "fn(token_loss, kl, mask, kl_coef) -> token_loss, each (N, T)"),
    "preference_loss": Kind(REFERENCE_LOSSES, "algorithm.loss_type",
                            "fn(h (B,) the log-ratio difference, beta, label_smoothing) -> loss (B,)"),
    "reference_free_loss": Kind(REFERENCE_FREE_LOSSES, "algorithm.loss_type",
                                "fn(chosen_avg (B,), rejected_avg (B,), beta, gamma) -> (loss (B,), chosen_rewards, "
                                "rejected_rewards)"),
    "reward_shaper": Kind(SHAPERS, "algorithm.shapers",
                          "fn(rewards (N,), signals: GroupSignals, **knobs) -> (rewards (N,), metrics dict)"),
    "advantage_transform": Kind(TRANSFORMS, "algorithm.transforms",
                                "fn(advantages (N,), rewards (N,), signals: GroupSignals, **knobs) -> (advantages "
                                "(N,), metrics dict); needs: TransformNeeds"),
    "drop_strategy": Kind(DROP_STRATEGIES, "algorithm.dynamic_sampling_drop",
                          "fn(rewards (N,), correct (N,), groups (N,)) -> dropped (N,) bool"),
    "prompt_sampling": Kind(SAMPLING_WEIGHTS, "algorithm.prompt_sampling.mode",
                            "fn(pass rates (P,)) -> weights (P,)"),
    "prompt_source": Kind(PROMPT_SOURCES, "algorithm.prompt_sampling.source",
                          "fn(training rows, settings: TrainConfig) -> a prompt source: take(n) -> rows, "
                          "observe(rows, verdicts: a (g,) bool tensor per row) -> metrics dict, state_dict(), "
                          "load_state_dict(state)"),
    "replay_trigger": Kind(TRIGGERS, "algorithm.replay.trigger",
                           "fn(all_correct (K,) bool, all_wrong (K,) bool) -> (K,) long: 1 replay a correct sample, "
                           "0 a wrong one, -1 none"),
    "temperature_schedule": Kind(TEMPERATURE_SCHEDULES, "rollout.temperature_schedule.mode",
                                 "fn(positions (T,), step, base, **knobs) -> temperatures (T,)"),
    "weight_publisher": Kind(PUBLISHERS, "rollout.server.publisher",
                             "a rlx.fleet.publishers.WeightPublisher subclass: (client, work_dir, settings); "
                             "start(model), publish(model, version) -> timings dict, close()"),
    "engine": Kind(ENGINES, "rollout.engine (rollout=hf)",
                   "fn(rollout settings, model, tokenizer, seed) -> a Generator (rlx/engines/generator.py): version, "
                   "generate_ids(prompts, *, max_new_tokens, seeds, greedy, samples_per_prompt, min_new_tokens, "
                   "continuation, schedule) -> Generation, publish(model, version), sleep(), step_metrics(), close(); "
                   "option gives=RolloutGives or a dict of its fields (what it supports)", register_engine),
    "producer": Kind(PRODUCERS, "rollout.producer",
                     "fn(settings: TrainConfig, parts: Parts) -> a Producer: loss_width, produce(step) -> Batch "
                     "(its source PromptRows or EpisodeRows, as the family trains), checkpointed() -> {name: "
                     "state_dict-able}, records(batch, samples, count) -> list[dict]"),
    "stage": Kind(STAGES, "algorithm.stages",
                  "fn(settings: StageSettings) -> Stage | None (a Stage subclass): after_scoring(round, ctx, "
                  "first_index) -> round; after_step(rounds, step) -> metrics dict; optional schedule, "
                  "checkpointed"),
    "verifier": Kind(VERIFIERS, "data.verifier, benchmark.NAME.verifier",
                     "verify(extracted answers, problems) -> list[float]; options: extract=fn(completion, problem) -> "
                     "str | None or a reader's name (default: the <answer> tag), needs=(problem columns), "
                     "own_reader=True (always its own reader, never model.answer.reader: programs)", register_verifier),
    "reader": Kind(READERS, "model.answer.reader, benchmark.NAME.reader",
                   "fn(completion, problem) -> the answer it states (str) or None"),
    "env": Kind(ENVIRONMENTS, "env.name (with env=custom)",
                "a class (or callable) with reset(*, seed, options) -> (obs, info) and step(action) -> "
                "(obs, reward, terminated, truncated, info)"),
    "data_source": Kind(DATA_SOURCES, "data.source", "fn(data_cfg, seed) -> (train rows, held-out rows)"),
}


def register(kind: str, name: str, **options) -> Callable:
    """Decorator adding the decorated function or class to the registry of `kind` under `name` (returned
    unchanged). needs=: what the entry needs, for the kinds that declare needs (advantage: EstimatorNeeds or a dict of
    its fields). Unknown kind, a taken name or options a kind does not take: one line (ValueError)."""
    if kind not in KINDS:
        raise UnknownName(f"unknown registry kind '{kind}'; valid kinds: {', '.join(KINDS)}")
    entry = KINDS[kind]
    if entry.decorator is not None:
        return entry.decorator(name, **options)
    needs = options.pop("needs", None)  # a kind that declares no needs refuses it (Registry.add)
    if options:
        raise ValueError(f"rlx.register('{kind}', ...) takes no options but needs= (got {', '.join(options)})")
    return entry.registry.register(name, needs=needs)
