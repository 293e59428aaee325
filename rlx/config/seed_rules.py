"""Cross-field rules of the seed-idea knobs (issue 29; conf/algorithm/grpo.yaml, agent_grpo.yaml and rollout/hf.yaml),
added to rlx.config.rules.FAMILY_CHECKS. Each stops the run with one line naming the knobs and the fix.

Every option is wired into training (docs/algorithms/seed-ideas.md, "Where each hook lives"): `NOT_WIRED` is
empty. It stays as the guard for an option added later, whose knob would otherwise be silently ignored: list it
here (knob -> its off value) until the loop applies it. A few options are wired into one loop only; the PPO
loop refuses the others (`PPO_REFUSED`), and the producer-level ones run on one process (`check_seed_processes`).
"""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlx.errors import UserError

# knob -> its default (off); a different value is refused until the loop applies it. Empty: everything is wired.
NOT_WIRED: dict = {"policy_gradient": {}, "agent": {}, "rollout": {}}

# the seed knobs the PPO loop (rlx/loops/ppo.py) does not apply: they act in the policy-gradient loop's credit or
# update (transforms; hints' plain-context ratio; per-token temperatures); the producer's stages work under PPO too
PPO_REFUSED = {"transforms": [], "hints.enabled": False}

# knobs acting in the single-turn producer's group stages (rlx/rollout/group_stages.py): one process only
PRODUCER_KNOBS = {"dynamic_sampling_drop": "tied", "shapers": [], "transforms": [], "verifier_noise.fn_rate": 0.0,
                  "verifier_noise.fp_rate": 0.0, "prompt_sampling.mode": "uniform", "replay.enabled": False,
                  "hints.enabled": False}


def check_seed_settings(cfg: DictConfig) -> None:
    """The policy-gradient family's seed-idea knobs: values that contradict each other, then the not-wired guard."""
    algo = cfg.algorithm
    shaping = algo.shaping
    uses_backward = "noise_backward" in algo.shapers
    if uses_backward and shaping.assumed_fp_rate + shaping.assumed_fn_rate >= 1:
        raise UserError(f"algorithm.shaping.assumed_fp_rate + assumed_fn_rate = "
                        f"{shaping.assumed_fp_rate + shaping.assumed_fn_rate:g} must be below 1 for noise_backward")
    if algo.verifier_noise.fn_rate + algo.verifier_noise.fp_rate >= 1:
        raise UserError("algorithm.verifier_noise.fn_rate + fp_rate must be below 1 (at 1 the verifier carries no information)")
    standardized = algo.advantage in ("reinforce_pp", "reinforce_pp_baseline") or (
        algo.advantage == "grpo" and algo.scale in ("group", "batch"))
    if uses_backward and standardized and list(cfg.reward.components) == [cfg.reward.accuracy]:
        raise UserError("algorithm.shapers=[noise_backward] is an affine map of a binary reward, which group or batch "
                        "standardisation cancels exactly; use it with algorithm.scale=none, algorithm=rloo, or beside "
                        "other reward components (docs/algorithms/seed-ideas.md)")
    if algo.hints.enabled and algo.hints.source == "column" and not algo.hints.column:
        raise UserError("algorithm.hints.source=column needs algorithm.hints.column=NAME (the column with the solution)")
    if "laser_d" in algo.shapers and not shaping.target_candidates:
        raise UserError("algorithm.shapers=[laser_d] needs algorithm.shaping.target_candidates (budgets to try)")
    ead = cfg.rollout.temperature_schedule.mode != "constant"
    if ead and cfg.rollout.backend != "hf":
        raise UserError("rollout.temperature_schedule.mode=ead needs per-token temperatures in the decoder: use rollout=hf")
    if algo.replay.enabled and ead:
        raise UserError("algorithm.replay.enabled=true with rollout.temperature_schedule.mode=ead: a replayed sample keeps "
                        "no per-token temperatures; turn one of them off")
    if algo.family == "ppo":
        for knob, default in PPO_REFUSED.items():
            if knob_value(algo, knob) != default:
                raise UserError(f"algorithm.{knob}={knob_value(algo, knob)} acts in the policy-gradient loop's credit or "
                                f"update, not PPO's: use algorithm=grpo (or another policy-gradient preset)")
        if ead:
            raise UserError("rollout.temperature_schedule.mode=ead: the PPO loop scores at rollout.temperature; use "
                            "algorithm=grpo (or another policy-gradient preset)")
    _refuse_not_wired(cfg, "policy_gradient")


def check_seed_processes(cfg: DictConfig, processes: int) -> None:
    """The producer's group stages run on one process (like dynamic sampling): one line naming the first knob set."""
    if processes <= 1 or cfg.algorithm.get("family") not in ("policy_gradient", "ppo"):
        return
    for knob, default in PRODUCER_KNOBS.items():
        value = knob_value(cfg.algorithm, knob)
        if value != default:
            raise UserError(f"algorithm.{knob}={value} runs in the single-process producer for now; set it back to "
                            f"{default} or hardware.num_processes=1")
    if cfg.rollout.get("temperature_schedule") is not None and cfg.rollout.temperature_schedule.mode != "constant":
        raise UserError("rollout.temperature_schedule.mode runs in the single-process producer for now; set it to "
                        "constant or hardware.num_processes=1")


def check_agent_seed_settings(cfg: DictConfig) -> None:
    """The agent family's seed-idea knobs."""
    algo = cfg.algorithm
    smoothing = algo.entropy_smoothing
    if smoothing.low >= smoothing.high:
        raise UserError(f"algorithm.entropy_smoothing.low={smoothing.low} must be below high={smoothing.high}")
    _refuse_not_wired(cfg, "agent")


def knob_value(node, dotted: str):
    value = OmegaConf.select(node, dotted)
    return list(value) if isinstance(value, ListConfig) else value


def _refuse_not_wired(cfg: DictConfig, family: str) -> None:
    for group, knobs in (("algorithm", NOT_WIRED[family]), ("rollout", NOT_WIRED["rollout"])):
        for knob, default in knobs.items():
            value = knob_value(cfg[group], knob)
            refused = (value in [d.rstrip("!") for d in default]) if isinstance(default, tuple) else (
                value == default.rstrip("!") if isinstance(default, str) and default.endswith("!") else value != default)
            if refused:
                raise UserError(f"{group}.{knob}={value} is not wired into the training loop yet (issue 29 part 2): the "
                                f"math exists (docs/algorithms/seed-ideas.md) but a run would ignore it; leave it at its default")
