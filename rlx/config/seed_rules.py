"""Cross-field rules of the seed-idea knobs (issue 29; conf/algorithm/grpo.yaml, agent_grpo.yaml and rollout/hf.yaml),
added to rlx.config.rules.FAMILY_CHECKS. Each stops the run with one line naming the knobs and the fix.

Every option is wired into training (docs/algorithms/seed-ideas.md, "Where each hook lives"): `NOT_WIRED` is
empty. It stays as the guard for an option added later, whose knob would otherwise be silently ignored: list it
here (knob -> its off value) until the loop applies it. A few options are wired into one loop only; the PPO
loop refuses the others (`PPO_REFUSED`). With several processes, the producer-level ones make rank 0 sample the whole
step (rlx/config/async_rules.py rank_zero_reason).
"""

from __future__ import annotations

from rlx.algorithms.advantages import ESTIMATORS
from rlx.config.gives import rollout_gives
from rlx.config.needs import (
    broken,
    refuse_first,
    shaper_affine_problems,
    shaper_knob_problems,
    shaper_rate_problems,
)
from rlx.config.schema import TrainConfig

# knob -> its default (off); a different value is refused until the loop applies it. Empty: everything is wired.
NOT_WIRED: dict = {"policy_gradient": {}, "agent": {}, "rollout": {}}

# the seed knobs PPO's schema has (the single-turn producer reads them) but the PPO loop (rlx/loops/ppo.py) does not
# apply: hints' plain-context ratio is the policy-gradient loop's. The producer's stages work under PPO too; the
# advantage transforms are no PPO knob at all (rlx/config/families.py PolicyGradient)
PPO_REFUSED = {"hints.enabled": False}

# knobs acting in the single-turn producer's group stages (rlx/rollout/stages/): with several processes, rank 0 samples
# the step's global batch with them and broadcasts it (rlx/rollout/rank_zero.py)
PRODUCER_KNOBS = {"dynamic_sampling_drop": "tied", "shapers": [], "transforms": [], "verifier_noise.fn_rate": 0.0,
                  "verifier_noise.fp_rate": 0.0, "prompt_sampling.mode": "uniform",
                  "prompt_sampling.source": "auto", "replay.enabled": False,
                  "hints.enabled": False, "stages": []}


def check_seed_settings(settings: TrainConfig) -> None:
    """The policy-gradient family's seed-idea knobs: values that contradict each other, what the chosen shapers and
    rollout backend declare they need, what the PPO loop does not apply, then the not-wired guard."""
    algo, roll = settings.algorithm, settings.rollout
    shaping, noise, hints, sampling = algo.shaping, algo.verifier_noise, algo.hints, algo.prompt_sampling
    standardized = algo.advantage in ESTIMATORS and ESTIMATORS.needs(algo.advantage).standardised(
        getattr(algo, "scale", None))  # PPO has no scale (gae)
    cancelled = standardized and list(settings.reward.components) == [settings.reward.accuracy]
    ead = roll.temperature_schedule.mode != "constant"
    ppo_refused = [knob for knob, default in PPO_REFUSED.items() if knob_value(algo, knob) != default]
    refuse_first([
        *shaper_rate_problems(algo.shapers, shaping),
        *broken([(noise.fn_rate + noise.fp_rate >= 1,
                  "algorithm.verifier_noise.fn_rate + fp_rate must be below 1 (at 1 "
                                                      "the verifier carries no information)")]),
        *(shaper_affine_problems(algo.shapers) if cancelled else []),
        *broken([(hints.enabled and hints.source == "column" and not hints.column,
                  "algorithm.hints.source=column needs algorithm.hints.column=NAME (the column with the solution)")]),
        *shaper_knob_problems(algo.shapers, shaping),
        *broken([
            (ead and not rollout_gives(roll).per_token_temperature,
             "rollout.temperature_schedule.mode=ead needs per-token temperatures in the decoder: use rollout=hf"),
            (algo.replay.enabled and ead, "algorithm.replay.enabled=true with rollout.temperature_schedule.mode=ead: a "
                                          "replayed sample keeps no per-token temperatures; turn one of them off"),
            *((algo.family == "ppo", f"algorithm.{knob}={knob_value(algo, knob)} acts in the policy-gradient loop's "
                                     f"credit or update, not PPO's: use algorithm=grpo (or another policy-gradient "
                                     f"preset)") for knob in ppo_refused),
            (algo.family == "ppo" and ead, "rollout.temperature_schedule.mode=ead: the PPO loop scores at "
                                           "rollout.temperature; use algorithm=grpo (or another policy-gradient "
                                           "preset)"),
        ]),
        *broken([(sampling.mode != "uniform" and sampling.source not in ("auto", "difficulty"),
                  f"algorithm.prompt_sampling.mode={sampling.mode} weights the difficulty sampler's draws, and "
                  f"algorithm.prompt_sampling.source={sampling.source} draws the prompts; set source=auto or "
                  f"mode=uniform")]),
        *own_producer_problems(settings),
        *not_wired_problems(settings, "policy_gradient"),
    ])


def own_producer_problems(settings: TrainConfig) -> list[str]:
    """The producer-level knobs (stages, dynamic sampling, the temperature schedule) act inside rlx's single-turn
    producer; a producer of the user's own (rollout.producer) replaces it, so they would be ignored."""
    roll, algo = settings.rollout, settings.algorithm
    if roll.producer == "auto":
        return []
    knobs = [f"algorithm.{knob}" for knob, _, _ in producer_knobs_set(algo)]
    knobs += ["algorithm.dynamic_sampling"] * bool(algo.dynamic_sampling)
    knobs += ["rollout.temperature_schedule.mode"] * (roll.temperature_schedule.mode != "constant")
    return [f"{knobs[0]} acts in rlx's single-turn producer, which rollout.producer={roll.producer} replaces (it would "
            f"be ignored); leave it at its default, or rollout.producer=auto"] if knobs else []


def check_agent_seed_settings(settings: TrainConfig) -> None:
    """The agent family's seed-idea knobs."""
    smoothing = settings.algorithm.entropy_smoothing
    refuse_first([
        *broken([(smoothing.low >= smoothing.high,
                  f"algorithm.entropy_smoothing.low={smoothing.low} must be below high={smoothing.high}")]),
        *not_wired_problems(settings, "agent"),
    ])


def knob_value(node, dotted: str, default=None):
    """The knob at `dotted` (e.g. "hints.enabled") under a settings section, `default` where a section on the way
    does not have it."""
    for part in dotted.split("."):
        node = getattr(node, part, default)
    return node


def producer_knobs_set(algo) -> list[tuple]:
    """(knob, its off value, its value) of each PRODUCER_KNOBS knob set away from its off value, in table order (a
    knob the family does not have, PPO's transforms, is off)."""
    return [(knob, default, knob_value(algo, knob, default)) for knob, default in PRODUCER_KNOBS.items()
            if knob_value(algo, knob, default) != default]


def not_wired_problems(settings: TrainConfig, family: str) -> list[str]:
    """The NOT_WIRED knobs of `family` (and of rollout) set to a value the loop would ignore."""
    problems = []
    for group, knobs in (("algorithm", NOT_WIRED[family]), ("rollout", NOT_WIRED["rollout"])):
        for knob, default in knobs.items():
            value = knob_value(getattr(settings, group), knob)
            refused = (value in [d.rstrip("!") for d in default]) if isinstance(default, tuple) else (
                value == default.rstrip("!") if isinstance(default, str) and default.endswith("!") else value
                != default)
            if refused:
                problems.append(f"{group}.{knob}={value} is not wired into the training loop yet (issue 29 part 2): "
                                "the math exists (docs/algorithms/seed-ideas.md) but a run would ignore it; leave it "
                                "at its default")
    return problems
