"""What each rollout backend gives (RolloutGives), read by the config rules instead of the backend's name."""

from __future__ import annotations

from dataclasses import dataclass

from rlx.registry import published


@dataclass(frozen=True)
class RolloutGives:
    """What a rollout backend gives, read by the rules instead of its name (rlx/config/seed_rules.py, async_rules.py,
    rules.py): the options that need one of these stop on a backend that lacks it."""

    per_token_temperature: bool = False  # its decoder takes a temperature per position (temperature_schedule=ead)
    # continues unfinished rows from their tokens with rlx's sampler (rollout.partial)
    seeded_continuation: bool = False
    segmented_continuation: bool = False  # continues rows from their tokens in rounds of rollout.segment_tokens
    background_thread: bool = False  # samples in a thread beside the trainer (rollout.max_staleness)
    unfiltered_logprobs: bool = False  # records the unfiltered log-probs under top-p/top-k (the off-policy correction)
    sharded_weights: bool = False  # reads the policy's weights when FSDP or DeepSpeed shard them
    gathered_weights: bool = False  # takes a full copy gathered from FSDP / ZeRO-3 shards (rank 0 publishes it)
    int8_decoding: bool = False  # decodes from an 8-bit copy of the policy (rollout.quantize=int8)
    vllm_8bit: bool = False  # samples from vLLM's 8-bit copy, re-made every sync (rollout.quantize=int8; fp8: CUDA)


# rollout.backend -> what it gives: hf is the policy sampling itself; vllm an in-process engine; server its own process
ROLLOUT_GIVES = {"hf": RolloutGives(per_token_temperature=True, seeded_continuation=True, segmented_continuation=True,
                                    background_thread=True, unfiltered_logprobs=True, sharded_weights=True,
                                    int8_decoding=True),
                 "vllm": RolloutGives(vllm_8bit=True),
                 "server": RolloutGives(background_thread=True, segmented_continuation=True, gathered_weights=True,
                                        vllm_8bit=True)}


def rollout_gives(roll) -> RolloutGives:
    """What the run's rollout gives: its backend's (ROLLOUT_GIVES), or with rollout.engine=NAME what that engine of
    the user's declared when it was registered (rlx/engines/custom.py; nothing declared: RolloutGives())."""
    if roll.engine == "builtin":
        return ROLLOUT_GIVES[roll.backend]
    return published("engine").needs(roll.engine)


def rollout_name(roll) -> str:
    """How a one-line refusal names the run's rollout: `rollout=BACKEND`, or `rollout.engine=NAME` for an engine of the
    user's."""
    return f"rollout={roll.backend}" if roll.engine == "builtin" else f"rollout.engine={roll.engine}"
