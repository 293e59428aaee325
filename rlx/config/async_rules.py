"""Cross-field rules of asynchronous and partial rollouts and of the off-policy correction (conf/rollout/hf.yaml:
rollout.max_staleness, producer_*, correction*, partial*; docs/scaling/async.md). Called by
rlx.cli.training.check_run after the knobs' own checks; each stops the run with one line naming the fix."""

from __future__ import annotations

from omegaconf import DictConfig

from rlx.config.seed_rules import PRODUCER_KNOBS, knob_value
from rlx.errors import UserError

# the families whose rows come from a producer the pipeline can wrap (single-turn or episodes)
PRODUCER_FAMILIES = ("policy_gradient", "ppo", "agent")
SINGLE_TURN_FAMILIES = ("policy_gradient", "ppo")


def check_async_settings(cfg: DictConfig, processes: int) -> None:
    roll, family = cfg.rollout, cfg.algorithm.family
    staleness, partial = int(roll.max_staleness), bool(roll.partial)
    tis_cap = roll.get("tis_cap")
    if tis_cap is not None and roll.correction != "none":
        raise UserError(f"rollout.tis_cap={tis_cap} is the older name of rollout.correction=tis rollout.correction_cap="
                        f"{tis_cap}; set only one of rollout.tis_cap and rollout.correction")
    corrected = roll.correction != "none" or tis_cap is not None
    if roll.correction == "tis" and roll.correction_low > 0:
        raise UserError(f"rollout.correction_low={roll.correction_low} applies to rollout.correction=mis (tis truncates "
                        f"above rollout.correction_cap only); set rollout.correction_low=0")
    if roll.correction == "mis" and roll.correction_low >= roll.correction_cap:
        raise UserError(f"rollout.correction_low={roll.correction_low} must be below rollout.correction_cap="
                        f"{roll.correction_cap} (mis keeps the weights between them)")
    if corrected and roll.backend in ("vllm", "server") and (roll.top_p < 1 or roll.top_k > 0):
        raise UserError(f"rollout={roll.backend} reports log-probs of the top-k/top-p filtered distribution, which the "
                        f"trainer's unfiltered log-probs cannot be compared with: set rollout.top_p=1 rollout.top_k=0, "
                        f"or use rollout=hf (its decoder records the unfiltered log-probs)")
    if not (staleness or partial):
        return
    what = f"rollout.max_staleness={staleness}" if staleness else "rollout.partial=true"
    if family not in (PRODUCER_FAMILIES if staleness else SINGLE_TURN_FAMILIES):
        kinds = "policy-gradient, PPO and agent" if staleness else "single-turn policy-gradient and PPO"
        raise UserError(f"{what} samples the rows of the {kinds} families, not algorithm={cfg.algorithm.name} "
                        f"(family {family}); leave it at its default")
    if not corrected:
        raise UserError(f"{what} trains on rows sampled by older weights: set an off-policy correction, e.g. "
                        f"rollout.correction=tis")
    if processes > 1:
        raise UserError(f"{what} runs on one process for now (the producer's collectives would interleave with the "
                        f"update's); set hardware.num_processes=1")
    if staleness and roll.backend == "vllm":
        raise UserError(f"{what} samples in a background thread, which the colocated engine (rollout=vllm) cannot share "
                        f"with the trainer; use rollout=server (vLLM in its own process) or rollout=hf")
    if partial and roll.backend != "hf":
        raise UserError("rollout.partial=true continues unfinished rows from their tokens with rlx's seeded sampler, "
                        "which only rollout=hf has; use rollout=hf")
    if partial and cfg.algorithm.get("dynamic_sampling"):
        raise UserError("rollout.partial=true and algorithm.dynamic_sampling both decide which groups a step trains; "
                        "set algorithm.dynamic_sampling=false")
    if partial:  # the partial producer has no seed group stages (rlx/rollout/group_stages.py) nor a schedule
        for knob, default in PRODUCER_KNOBS.items():
            if knob_value(cfg.algorithm, knob) != default:
                raise UserError(f"rollout.partial=true carries unfinished groups across steps, which the seed stage "
                                f"algorithm.{knob} does not handle yet; set algorithm.{knob}={default} or rollout.partial=false")
        if roll.temperature_schedule.mode != "constant":
            raise UserError("rollout.partial=true continues rows at later positions, where a per-position temperature "
                            "schedule is not supported yet; set rollout.temperature_schedule.mode=constant or "
                            "rollout.partial=false")
