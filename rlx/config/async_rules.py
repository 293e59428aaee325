"""Cross-field rules of asynchronous and partial rollouts and of the off-policy correction (conf/rollout/hf.yaml:
rollout.max_staleness, producer_*, correction*, partial*; docs/scaling/async.md). Called by
rlx.cli.training.check_run after the knobs' own checks; each stops the run with one line naming the fix."""

from __future__ import annotations

from rlx.config.gives import rollout_gives, rollout_name
from rlx.config.needs import broken, refuse_first
from rlx.config.schema import TrainConfig
from rlx.config.seed_rules import knob_value, producer_knobs_set

# the families whose rows come from a producer the pipeline can wrap (single-turn or episodes)
PRODUCER_FAMILIES = ("policy_gradient", "ppo", "agent")
SINGLE_TURN_FAMILIES = ("policy_gradient", "ppo")


def check_async_settings(settings: TrainConfig, processes: int) -> None:
    """The off-policy correction's knobs, then what asynchronous and partial rollouts need (a family with a producer,
    a correction, what the rollout backend gives), then what several processes allow when rank 0 alone samples
    (rollout=server, pipeline mode): one line naming the first problem and its fix."""
    refuse_first([*correction_problems(settings.rollout), *stale_problems(settings, processes),
                  *overlap_problems(settings), *rank_zero_problems(settings, processes)])


def holds_full_parameters(hardware) -> bool:
    """Whether every rank holds the policy's full parameters (rank 0 can sample with and publish its own): one
    process, DDP, and DeepSpeed ZeRO-1/2 (which shard the optimizer state and gradients only); not FSDP or ZeRO-3."""
    if hardware.distributed == "fsdp":
        return False
    return not (hardware.distributed == "deepspeed" and hardware.deepspeed.zero_stage == 3)


def strategy_name(hardware) -> str:
    """The hardware strategy as a user names it in a message (hardware.distributed, ZeRO's stage)."""
    if hardware.distributed == "deepspeed":
        return f"hardware=deepspeed_zero{hardware.deepspeed.zero_stage}"
    return f"hardware.distributed={hardware.distributed}"


def gathers_to_publish(settings: TrainConfig) -> bool:
    """rollout=server or pipeline mode where the policy's parameters are shards (FSDP2, ZeRO-3): each publish gathers
    the full weights into rank 0's CPU copy of the policy (rlx/rollout/rank_zero.py GatheredPublish), which rank 0
    publishes to the servers or hands to the pipeline's own copy of the policy."""
    return (settings.rollout.backend == "server" or bool(settings.rollout.max_staleness)) and not holds_full_parameters(
        settings.hardware)


def rank_zero_reason(settings: TrainConfig, processes: int) -> str | None:
    """The knob that makes rank 0 alone sample each step's global batch in a run on `processes` processes
    (rlx/rollout/rank_zero.py: rank 0 samples without collectives, broadcasts the batch, each rank trains its
    shard), or None when every rank samples its own shard (or there is one process). rollout=server: one fleet,
    driven over HTTP; pipeline mode: a producer thread cannot join collectives; partial rollouts: one pool of
    carried groups; a producer of the user's own (rollout.producer), which need not know about processes; and, in
    the single-turn families, the producer's group stages, dynamic sampling and the temperature schedule, which read
    a step's whole set of groups (and keep per-prompt state) as one process does."""
    roll, algo = settings.rollout, settings.algorithm
    if processes <= 1:
        return None
    if roll.backend == "server":
        return "rollout=server"
    if roll.max_staleness:
        return f"rollout.max_staleness={roll.max_staleness}"
    if roll.partial:
        return "rollout.partial=true"
    if roll.producer != "auto":  # a user's producer samples the global batch; it need not know about processes
        return f"rollout.producer={roll.producer}"
    if algo.family not in SINGLE_TURN_FAMILIES:
        return None
    stages = producer_knobs_set(algo)
    if stages:
        knob, _, value = stages[0]
        return f"algorithm.{knob}={as_written(value)}"
    if algo.dynamic_sampling:
        return "algorithm.dynamic_sampling=true"
    if roll.temperature_schedule.mode != "constant":
        return f"rollout.temperature_schedule.mode={roll.temperature_schedule.mode}"
    return None


def as_written(value) -> str:
    """A knob's value as a command line writes it: [a,b] for a list, true/false for a bool."""
    if isinstance(value, list):
        return f"[{','.join(str(v) for v in value)}]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def rank_zero_problems(settings: TrainConfig, processes: int) -> list[str]:
    """Several processes where rank 0 alone samples the global batch and broadcasts it (rank_zero_reason). What that
    needs: a family trained from a producer (single-turn rows or episodes, sharded by whole tasks), every rank
    holding the full parameters (rank 0 samples with, and publishes, its own), and a row count that splits evenly
    over the processes."""
    what = rank_zero_reason(settings, processes)
    if what is None:
        return []
    # under FSDP2 / ZeRO-3 rank 0 samples through servers or the pipeline's own full copy of the policy, each given
    # the weights gathered from the shards (gathers_to_publish); its own sharded policy cannot sample alone
    return broken([
        (settings.algorithm.family not in PRODUCER_FAMILIES,
         f"{what} with {processes} processes samples on rank 0 and shards its rows (single-turn samples or episodes) "
         f"over the ranks, and algorithm={settings.algorithm.name} (family {settings.algorithm.family}) trains from "
         f"no producer; set hardware.num_processes=1"),
        (not holds_full_parameters(settings.hardware) and not gathers_to_publish(settings),
         f"{what} with {processes} processes samples with rank 0's parameters, and under "
         f"{strategy_name(settings.hardware)} they are shards (rank 0 gathers a full copy only for servers or pipeline "
         f"mode: rollout=server or rollout.max_staleness); use hardware=ddp or hardware.num_processes=1"),
        (knob_value(settings.algorithm, "hints.enabled", False),
         f"algorithm.hints.enabled=true adds hinted re-samples to their groups, so a step's row count varies and does "
         f"not split evenly over {processes} processes; set hardware.num_processes=1 or algorithm.hints.enabled=false"),
    ])


def overlap_problems(settings: TrainConfig) -> list[str]:
    """The rows of rollout.server.overlap_steps (rlx/fleet/overlap.py): nothing when it is off."""
    roll = settings.rollout
    server = getattr(roll, "server", None)
    if server is None or not getattr(server, "overlap_steps", False):
        return []
    lora = settings.model.lora.enabled and server.lora_push == "adapter"
    stages = producer_knobs_set(settings.algorithm)
    return broken([
        (not (roll.partial and roll.segment_tokens and roll.max_staleness),
         "rollout.server.overlap_steps=true overlaps the token-budget rounds of consecutive steps sampled ahead of the "
         "trainer; set rollout.partial=true rollout.segment_tokens=16 rollout.max_staleness=1 (and "
         "rollout.correction=tis), or rollout.server.overlap_steps=false"),
        (server.publisher not in ("auto", "file") or (server.publisher == "auto" and lora),
         "rollout.server.overlap_steps=true keeps servers of two weight versions, which needs the file publisher "
         "(it keeps the version before loadable); set rollout.server.publisher=file (LoRA: lora_push=merged)"),
        (bool(stages), f"rollout.server.overlap_steps=true draws the next step's prompts while this step's seed stages "
                       f"still run, and a stage may act on the prompt stream (algorithm."
                       f"{stages[0][0] if stages else ''}={as_written(stages[0][2]) if stages else ''}); leave one of "
                       f"them off"),
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
        (corrected and not rollout_gives(roll).unfiltered_logprobs and (roll.top_p < 1 or roll.top_k > 0),
         f"{rollout_name(roll)} reports log-probs of the top-k/top-p filtered distribution, which the trainer's "
         f"unfiltered log-probs cannot be compared with: set rollout.top_p=1 rollout.top_k=0, or use rollout=hf (its "
         f"decoder records the unfiltered log-probs)"),
    ])


def stale_problems(settings: TrainConfig, processes: int) -> list[str]:
    """The rows of rollout.max_staleness and rollout.partial: nothing when both are off."""
    roll, family = settings.rollout, settings.algorithm.family
    staleness, partial = int(roll.max_staleness), bool(roll.partial)
    if not partial and roll.segment_tokens:
        return ["rollout.segment_tokens cuts partial rollouts into token-budget rounds; set rollout.partial=true (and "
                "rollout.correction) or rollout.segment_tokens=0"]
    if partial and roll.producer != "auto":
        return [f"rollout.partial=true is rlx's partial-rollout producer, which rollout.producer={roll.producer} "
                f"replaces; set one of them"]
    if not (staleness or partial):
        return []
    what = f"rollout.max_staleness={staleness}" if staleness else "rollout.partial=true"
    kinds = "policy-gradient, PPO and agent" if staleness else "single-turn policy-gradient and PPO"
    gives = rollout_gives(roll)
    sampling = knob_value(settings.algorithm, "prompt_sampling.mode", "uniform")  # DPO has no sampler
    return broken([
        (family not in (PRODUCER_FAMILIES if staleness else SINGLE_TURN_FAMILIES),
         f"{what} samples the rows of the {kinds} families, not algorithm={settings.algorithm.name} (family {family}); "
         f"leave it at its default"),
        (roll.correction == "none" and getattr(roll, "tis_cap", None) is None,
         f"{what} trains on rows sampled by older weights: set an off-policy correction, e.g. rollout.correction=tis"),
        (staleness and not gives.background_thread,
         f"{what} samples in a background thread, which the colocated engine ({rollout_name(roll)}) cannot share "
         f"with the trainer; use rollout=server (vLLM in its own process) or rollout=hf"),
        (partial and not gives.seeded_continuation and not (roll.segment_tokens and gives.segmented_continuation),
         f"rollout.partial=true continues unfinished rows from their tokens, which {rollout_name(roll)} does "
         f"only in rounds of rollout.segment_tokens (a server cannot stop early) or not at all; set "
         f"rollout.segment_tokens (e.g. 16) with rollout=server, or use rollout=hf"),
        (partial and getattr(settings.algorithm, "dynamic_sampling", False),
         "rollout.partial=true and algorithm.dynamic_sampling both decide which groups a step trains; set "
         "algorithm.dynamic_sampling=false"),
        # the seed stages run on the groups each step finishes (rlx/rollout/partial.py); two cannot, by what they are
        (partial and sampling != "uniform",
         f"rollout.partial=true trains groups drawn at earlier steps, while algorithm.prompt_sampling.mode={sampling} "
         f"pairs the prompts drawn at a step with that step's verdicts (it would credit pass rates to the wrong "
         f"prompts); set algorithm.prompt_sampling.mode=uniform or rollout.partial=false"),
        (partial and roll.temperature_schedule.mode != "constant",
         partial_schedule_refusal(f"rollout.temperature_schedule.mode={roll.temperature_schedule.mode}",
                                  "rollout.temperature_schedule.mode=constant")),
    ])


def partial_schedule_refusal(schedule: str, fix: str) -> str:
    """The one line refusing partial rollouts with a per-step temperature schedule (a row continued at a later step
    would mix two steps' schedules): `schedule` names what sets it, `fix` the way out other than rollout.partial=false.
    The config rule above uses it for rollout.temperature_schedule; rlx/rollout/partial.py for a user's stage."""
    return (f"rollout.partial=true continues a row at a later step than it began, while {schedule} sets each "
            f"position's temperature by the step (one row would mix two steps' schedules); set {fix} or "
            f"rollout.partial=false")
