"""The one generic compatibility check of the chosen registry entries: each entry declares what it needs when it is
registered (`@OUTCOME_ESTIMATORS.register("median", needs=EstimatorNeeds(...))`, rlx/algorithms/advantages.py;
`TransformNeeds` in transforms.py; `CreditNeeds` in gigpo.py; `ShaperNeeds` in shaping.py), and this module compares
those needs with the settings, so no rule names an entry and a plugin's entry is checked like a built-in. A run whose
entries need something the settings do not give stops with one line naming the entry, the need and the knob to change.

The other cross-field rules (rules.py, seed_rules.py, async_rules.py) are tables of (broken, message) rows, each
message one line naming the knobs, the reason and the fix: `broken` keeps the messages of the rows that hold, in
table order, and `refuse_first` stops the run with the first, so a config with two mistakes names the same one as
before the rules were tables. The rollout backends declare what they give in `ROLLOUT_GIVES` (rlx/config/groups.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rlx.algorithms.advantages import ESTIMATORS, SCALES, EstimatorNeeds
from rlx.algorithms.gigpo import CREDIT
from rlx.algorithms.shaping import SHAPERS
from rlx.algorithms.transforms import TRANSFORMS
from rlx.errors import UserError

if TYPE_CHECKING:
    from rlx.config.schema import TrainConfig


def refuse_first(problems: Iterable[str]) -> None:
    """Stop the run with the first of `problems` (one line each: the knobs, the reason and the fix), if there is one:
    the one raise of a table of rules, each row a (broken, message) pair or a needs check's sentences."""
    for problem in problems:
        raise UserError(problem)


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
        (getattr(algo, "scale", None) is not None and algo.scale not in scales,  # PPO has no scale
         f"is defined for algorithm.scale={' | '.join(scales)}: set algorithm.scale={scales[0]} (got "
         f"{getattr(algo, 'scale', None)})"),
        (needs.equal_groups and algo.hints.enabled, "takes equal groups of adjacent samples, and "
                                                    "algorithm.hints.enabled=true adds the hinted re-samples to "
                                                    "their group (sizes differ): turn hints off or pick an estimator "
                                                    "over group ids"),
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
        if knob and getattr(algo.shaping, knob) > samples:
            problems.append(f"algorithm.transforms=[{name}] with "
                            f"algorithm.shaping.{knob}={getattr(algo.shaping, knob)} needs at least that many samples "
                            f"per prompt: rollout.samples_per_prompt={samples}")
    return problems


def broken(rows: Iterable[tuple[bool, str]]) -> list[str]:
    """The messages of a rule table's rows whose condition holds, in table order (each row: (broken, message))."""
    return [message for is_broken, message in rows if is_broken]


def shaper_rate_problems(names, shaping) -> list[str]:
    """The shapers `names` whose declared rates (algorithm.shaping knobs) sum to 1 or more."""
    problems = []
    for name in names:
        rates = SHAPERS.needs(name).rates_below_one
        total = sum(getattr(shaping, rate) for rate in rates)
        if rates and total >= 1:
            problems.append(f"algorithm.shaping.{' + '.join(rates)} = {total:g} must be below 1 for {name}")
    return problems


def shaper_affine_problems(names) -> list[str]:
    """The shapers `names` that are affine maps of a binary reward, for a run whose standardisation cancels them."""
    return [f"algorithm.shapers=[{name}] is an affine map of a binary reward, which group or batch standardisation "
            f"cancels exactly; use it with algorithm.scale=none, algorithm=rloo, or beside other reward components "
            f"(docs/algorithms/seed-ideas.md)" for name in names if SHAPERS.needs(name).affine]


def shaper_knob_problems(names, shaping) -> list[str]:
    """The shapers `names` whose declared algorithm.shaping knobs are unset (empty)."""
    return [f"algorithm.shapers=[{name}] needs algorithm.shaping.{knob} ({what})"
            for name in names for knob, what in SHAPERS.needs(name).knobs if not getattr(shaping, knob)]


def check_entry_needs(settings: TrainConfig) -> None:
    """The policy-gradient and PPO families: the chosen estimator's and transforms' needs against the settings."""
    algo, samples = settings.algorithm, settings.rollout.samples_per_prompt
    problems = estimator_problems(algo.advantage, ESTIMATORS.needs(algo.advantage), algo, samples)
    problems += transform_problems(getattr(algo, "transforms", None) or [], algo, samples)
    if problems:
        raise UserError(problems[0])


def check_credit_needs(settings: TrainConfig) -> None:
    """The agent family: the knobs the chosen credit rule declared it needs are set."""
    algo = settings.algorithm
    unset = [knob for knob in CREDIT.needs(algo.credit).knobs if getattr(algo, knob, None) is None]
    if unset:
        raise UserError(f"algorithm.credit={algo.credit} needs algorithm.{unset[0]}: set algorithm.{unset[0]}=VALUE "
                        f"(docs/algorithms/credit.md)")
