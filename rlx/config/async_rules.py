"""Cross-field rules of asynchronous and partial rollouts and of the off-policy correction (conf/rollout/hf.yaml:
rollout.max_staleness, producer_*, correction*, partial*; docs/scaling/async.md). Called by
rlx.cli.training.check_run after the knobs' own checks; each stops the run with one line naming the fix."""

from __future__ import annotations

from rlx.config.groups import ROLLOUT_GIVES
from rlx.config.needs import broken, refuse_first
from rlx.config.schema import TrainConfig
from rlx.config.seed_rules import knob_value

# the families whose rows come from a producer the pipeline can wrap (single-turn or episodes)
PRODUCER_FAMILIES = ("policy_gradient", "ppo", "agent")
SINGLE_TURN_FAMILIES = ("policy_gradient", "ppo")


def check_async_settings(cfg: TrainConfig, processes: int) -> None:
    """The off-policy correction's knobs, then what asynchronous and partial rollouts need (a family with a producer,
    a correction, what the rollout backend gives), then what several processes allow when rank 0 alone samples
    (rollout=server, pipeline mode): one line naming the first problem and its fix."""
    refuse_first([*correction_problems(cfg.rollout), *stale_problems(cfg, processes), *rank_zero_problems(cfg, processes)])


# the Accelerate strategies whose every rank holds the policy's full parameters (rank 0 publishes its own)
FULL_PARAMETER_STRATEGIES = ("no", "ddp")


def rank_zero_problems(cfg: TrainConfig, processes: int) -> list[str]:
    """Several processes with rollout=server or pipeline mode: rank 0 alone samples the global batch and broadcasts
    it, each rank trains its shard (rlx/rollout/rank_zero.py). What that needs: single-turn rows (the shard of a
    batch of episodes is not built), and every rank holding the full parameters (rank 0 publishes its own)."""
    roll = cfg.rollout
    what = ("rollout=server" if roll.backend == "server" else f"rollout.max_staleness={roll.max_staleness}")
    if processes <= 1 or not (roll.backend == "server" or roll.max_staleness) or roll.partial:
        return []
    strategy = str(cfg.hardware.distributed)
    return broken([
        (cfg.algorithm.family not in SINGLE_TURN_FAMILIES,
         f"{what} with {processes} processes samples on rank 0 and shards its single-turn rows over the ranks, not "
         f"the rows of algorithm={cfg.algorithm.name} (family {cfg.algorithm.family}); set hardware.num_processes=1"),
        (strategy not in FULL_PARAMETER_STRATEGIES,
         f"{what} with {processes} processes publishes rank 0's parameters after each update, and under "
         f"hardware.distributed={strategy} they are shards (a gather into a full copy on rank 0 is not built); use "
         f"hardware=ddp or hardware.num_processes=1"),
    ])


def correction_problems(roll) -> list[str]:
    """The rows of the off-policy correction's knobs (rollout.correction*, the older rollout.tis_cap)."""
    tis_cap = getattr(roll, "tis_cap", None)
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


def stale_problems(cfg: TrainConfig, processes: int) -> list[str]:
    """The rows of rollout.max_staleness and rollout.partial: nothing when both are off."""
    roll, family = cfg.rollout, cfg.algorithm.family
    staleness, partial = int(roll.max_staleness), bool(roll.partial)
    if not partial and roll.segment_tokens:
        return ["rollout.segment_tokens cuts partial rollouts into token-budget rounds; set rollout.partial=true (and "
                "rollout.correction) or rollout.segment_tokens=0"]
    if not (staleness or partial):
        return []
    what = f"rollout.max_staleness={staleness}" if staleness else "rollout.partial=true"
    kinds = "policy-gradient, PPO and agent" if staleness else "single-turn policy-gradient and PPO"
    gives = ROLLOUT_GIVES[roll.backend]
    sampling = knob_value(cfg.algorithm, "prompt_sampling.mode", "uniform")  # DPO has no sampler
    return broken([
        (family not in (PRODUCER_FAMILIES if staleness else SINGLE_TURN_FAMILIES),
         f"{what} samples the rows of the {kinds} families, not algorithm={cfg.algorithm.name} (family {family}); "
         f"leave it at its default"),
        (roll.correction == "none" and getattr(roll, "tis_cap", None) is None,
         f"{what} trains on rows sampled by older weights: set an off-policy correction, e.g. rollout.correction=tis"),
        # the partial producer carries unfinished rows of rank 0's batch across steps: its shard is not built
        (partial and processes > 1, f"{what} runs on one process for now (its carried groups are not sharded over "
                                    f"processes); set hardware.num_processes=1"),
        (staleness and not gives.background_thread,
         f"{what} samples in a background thread, which the colocated engine (rollout={roll.backend}) cannot share "
         f"with the trainer; use rollout=server (vLLM in its own process) or rollout=hf"),
        (partial and not gives.seeded_continuation and not (roll.segment_tokens and gives.segmented_continuation),
         f"rollout.partial=true continues unfinished rows from their tokens, which rollout={roll.backend} does "
         f"only in rounds of rollout.segment_tokens (a server cannot stop early) or not at all; set "
         f"rollout.segment_tokens (e.g. 16) with rollout=server, or use rollout=hf"),
        (partial and getattr(cfg.algorithm, "dynamic_sampling", False),
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
