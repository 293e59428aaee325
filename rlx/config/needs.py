"""The one generic compatibility check of the chosen registry entries: each entry declares what it needs when it is
registered (`@OUTCOME_ESTIMATORS.register("median", needs=EstimatorNeeds(...))`, rlx/algorithms/advantages.py;
`TransformNeeds` in transforms.py; `CreditNeeds` in gigpo.py), and this module compares those needs with the settings, so no rule names an
entry and a plugin's entry is checked like a built-in. A run whose entries need something the settings do not give
stops with one line naming the entry, the need and the knob to change."""

from __future__ import annotations

from omegaconf import DictConfig

from rlx.algorithms.advantages import ESTIMATORS, SCALES, EstimatorNeeds
from rlx.algorithms.gigpo import CREDIT
from rlx.algorithms.transforms import TRANSFORMS
from rlx.errors import UserError


def estimator_problems(name: str, needs: EstimatorNeeds, algo, samples: int) -> list[str]:
    """What the estimator `name` needs that the settings (algorithm group `algo`, rollout.samples_per_prompt
    `samples`) do not give, one sentence each, in the order the needs are declared."""
    group = samples + needs.extra_samples
    extra = f" + {needs.extra_samples} extra = {group}" if needs.extra_samples else ""
    scales = needs.scales or tuple(SCALES)
    checks = (
        (needs.group_baseline and samples < 2, f"compares samples of a prompt: rollout.samples_per_prompt={samples} "
                                               f"must be at least 2"),
        (needs.odd_group and group % 2 == 0, f"needs an odd group so that its middle is one sample: "
                                             f"rollout.samples_per_prompt={samples}{extra} (make samples_per_prompt "
                                             f"{'even' if needs.extra_samples % 2 else 'odd'})"),
        (algo.get("scale") is not None and algo.scale not in scales,
         f"is defined for algorithm.scale={' | '.join(scales)}: set algorithm.scale={scales[0]} (got {algo.get('scale')})"),
        (needs.equal_groups and algo.hints.enabled, "takes equal groups of adjacent samples, and "
                                                    "algorithm.hints.enabled=true adds the hinted re-samples to their group "
                                                    "(sizes differ): turn hints off or pick an estimator over group ids"),
        (algo.dynamic_sampling and not needs.group_baseline, "has no group baseline, and algorithm.dynamic_sampling "
                                                             "drops groups with tied rewards, which only carry no "
                                                             "signal under one: turn dynamic sampling off"),
    )
    return [f"algorithm.advantage={name} {reason}" for broken, reason in checks if broken]


def transform_problems(names, algo, samples: int) -> list[str]:
    """What the advantage transforms `names` need that the settings do not give."""
    problems = []
    for name in names:
        knob = TRANSFORMS.needs(name).group_at_least
        if knob and algo.shaping[knob] > samples:
            problems.append(f"algorithm.transforms=[{name}] with algorithm.shaping.{knob}={algo.shaping[knob]} needs at "
                            f"least that many samples per prompt: rollout.samples_per_prompt={samples}")
    return problems


def check_entry_needs(cfg: DictConfig) -> None:
    """The policy-gradient and PPO families: the chosen estimator's and transforms' needs against the settings."""
    algo, samples = cfg.algorithm, cfg.rollout.samples_per_prompt
    problems = estimator_problems(algo.advantage, ESTIMATORS.needs(algo.advantage), algo, samples)
    problems += transform_problems(algo.get("transforms") or [], algo, samples)
    if problems:
        raise UserError(problems[0])


def check_credit_needs(cfg: DictConfig) -> None:
    """The agent family: the knobs the chosen credit rule declared it needs are set."""
    algo = cfg.algorithm
    unset = [knob for knob in CREDIT.needs(algo.credit).knobs if algo.get(knob) is None]
    if unset:
        raise UserError(f"algorithm.credit={algo.credit} needs algorithm.{unset[0]}: set algorithm.{unset[0]}=VALUE "
                        f"(docs/algorithms/credit.md)")
