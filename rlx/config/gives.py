"""What each rollout backend gives (RolloutGives), read by the config rules instead of the backend's name."""

from __future__ import annotations

from dataclasses import dataclass


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


# rollout.backend -> what it gives: hf is the policy sampling itself; vllm an in-process engine; server its own process
ROLLOUT_GIVES = {"hf": RolloutGives(per_token_temperature=True, seeded_continuation=True, segmented_continuation=True,
                                    background_thread=True, unfiltered_logprobs=True, sharded_weights=True,
                                    int8_decoding=True),
                 "vllm": RolloutGives(), "server": RolloutGives(background_thread=True, segmented_continuation=True,
                                                        gathered_weights=True)}
