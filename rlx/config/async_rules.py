"""Cross-field rules of asynchronous and partial rollouts and of the off-policy correction (conf/rollout/hf.yaml:
rollout.max_staleness, producer_*, correction*, partial*; docs/scaling/async.md). Called by
rlx.cli.training.check_run after the knobs' own checks; each stops the run with one line naming the fix."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlx.config.groups import ROLLOUT_GIVES
from rlx.config.needs import broken, refuse_first

# the families whose rows come from a producer the pipeline can wrap (single-turn or episodes)
PRODUCER_FAMILIES = ("policy_gradient", "ppo", "agent")
SINGLE_TURN_FAMILIES = ("policy_gradient", "ppo")


def check_async_settings(cfg: DictConfig, processes: int) -> None:
    """The off-policy correction's knobs, then what asynchronous and partial rollouts need (a family with a producer,
    a correction, one process, what the rollout backend gives): one line naming the first problem and its fix."""
    refuse_first([*correction_problems(cfg.rollout), *stale_problems(cfg, processes)])


def correction_problems(roll) -> list[str]:
    """The rows of the off-policy correction's knobs (rollout.correction*, the older rollout.tis_cap)."""
    tis_cap = roll.get("tis_cap")
    corrected = roll.correction != "none" or tis_cap is not None
    return broken([
        (tis_cap is not None and roll.correction != "none",
         f"rollout.tis_cap={tis_cap} is the older name of rollout.correction=tis rollout.correction_cap={tis_cap}; set "
         f"only one of rollout.tis_cap and rollout.correction"),
        (roll.correction == "tis" and roll.correction_low > 0,
         f"rollout.correction_low={roll.correction_low} applies to rollout.correction=mis (tis truncates above "
         f"rollout.correction_cap only); set rollout.correction_low=0"),
        (roll.correction == "mis" and roll.correction_low >= roll.correction_cap,
         f"rollout.correction_low={roll.correction_low} must be below rollout.correction_cap={roll.correction_cap} "
         f"(mis keeps the weights between them)"),
        (corrected and not ROLLOUT_GIVES[roll.backend].unfiltered_logprobs and (roll.top_p < 1 or roll.top_k > 0),
         f"rollout={roll.backend} reports log-probs of the top-k/top-p filtered distribution, which the trainer's "
         f"unfiltered log-probs cannot be compared with: set rollout.top_p=1 rollout.top_k=0, or use rollout=hf (its "
         f"decoder records the unfiltered log-probs)"),
    ])


def stale_problems(cfg: DictConfig, processes: int) -> list[str]:
    """The rows of rollout.max_staleness and rollout.partial: nothing when both are off."""
    roll, family = cfg.rollout, cfg.algorithm.family
    staleness, partial = int(roll.max_staleness), bool(roll.partial)
    if not (staleness or partial):
        return []
    what = f"rollout.max_staleness={staleness}" if staleness else "rollout.partial=true"
    kinds = "policy-gradient, PPO and agent" if staleness else "single-turn policy-gradient and PPO"
    gives = ROLLOUT_GIVES[roll.backend]
    sampling = OmegaConf.select(cfg.algorithm, "prompt_sampling.mode", default="uniform")  # DPO has no sampler
    return broken([
        (family not in (PRODUCER_FAMILIES if staleness else SINGLE_TURN_FAMILIES),
         f"{what} samples the rows of the {kinds} families, not algorithm={cfg.algorithm.name} (family {family}); "
         f"leave it at its default"),
        (roll.correction == "none" and roll.get("tis_cap") is None,
         f"{what} trains on rows sampled by older weights: set an off-policy correction, e.g. rollout.correction=tis"),
        (processes > 1, f"{what} runs on one process for now (the producer's collectives would interleave with the "
                        f"update's); set hardware.num_processes=1"),
        (staleness and not gives.background_thread,
         f"{what} samples in a background thread, which the colocated engine (rollout={roll.backend}) cannot share "
         f"with the trainer; use rollout=server (vLLM in its own process) or rollout=hf"),
        (partial and not gives.seeded_continuation,
         "rollout.partial=true continues unfinished rows from their tokens with rlx's seeded sampler, which only "
         "rollout=hf has; use rollout=hf"),
        (partial and cfg.algorithm.get("dynamic_sampling"),
         "rollout.partial=true and algorithm.dynamic_sampling both decide which groups a step trains; set "
         "algorithm.dynamic_sampling=false"),
        # the seed stages run on the groups each step finishes (rlx/rollout/partial.py); two cannot, by what they are
        (partial and sampling != "uniform",
         f"rollout.partial=true trains groups drawn at earlier steps, while algorithm.prompt_sampling.mode={sampling} "
         f"pairs the prompts drawn at a step with that step's verdicts (it would credit pass rates to the wrong "
         f"prompts); set algorithm.prompt_sampling.mode=uniform or rollout.partial=false"),
        (partial and roll.temperature_schedule.mode != "constant",
         f"rollout.partial=true continues a row at a later step than it began, while rollout.temperature_schedule."
         f"mode={roll.temperature_schedule.mode} sets each position's temperature by the step (one row would mix two "
         f"steps' schedules); set rollout.temperature_schedule.mode=constant or rollout.partial=false"),
    ])
