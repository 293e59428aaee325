"""The seed-idea knobs (issue 29) in the configs: every preset composes, passes the schema and the rules (every
option is wired: NOT_WIRED is empty), bad values stop with one line naming the knob, and the guard still refuses a
knob listed as not wired."""

import pytest

from rlx.config import seed_rules
from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.schema import check_config
from rlx.config.seed_rules import NOT_WIRED
from rlx.config.settings import checked_settings
from rlx.errors import UserError
from tests.conftest import run_rlx

# presets that extend grpo / gigpo with a seed idea (they train: tests/test_seed_wiring.py)
SEED_PRESETS = ["ngrpo", "laser", "laser_d", "unlikeliness", "agrae"]
AGENT_SEED_PRESETS = ["hgpo"]


@pytest.mark.parametrize("preset", SEED_PRESETS + AGENT_SEED_PRESETS)
def test_seed_presets_compose_and_pass_the_schema_and_the_rules(preset):
    overrides = [f"algorithm={preset}", *(["env=grid"] if preset in AGENT_SEED_PRESETS else [])]
    cfg = check_overrides(overrides)
    check_config(cfg)
    check_settings(checked_settings(cfg))


def test_every_option_is_wired():
    assert NOT_WIRED == {"policy_gradient": {}, "agent": {}, "rollout": {}}


def test_the_guard_still_refuses_a_knob_listed_as_not_wired(monkeypatch):
    """A future option listed in NOT_WIRED (here the replay knob, as if it were new) is refused with one line."""
    monkeypatch.setitem(NOT_WIRED, "policy_gradient", {"replay.enabled": False})
    with pytest.raises(UserError, match="algorithm.replay.enabled=True is not wired") as info:
        check_settings(checked_settings(check_overrides(["algorithm.replay.enabled=true"])))
    assert "\n" not in str(info.value)
    check_settings(checked_settings(check_overrides([])))  # the default value passes


def test_ngrpo_preset_sets_the_authors_recipe():
    algo = check_overrides(["algorithm=ngrpo"]).algorithm
    assert (algo.advantage, algo.virtual_samples, algo.clip_low, algo.clip_high, algo.dynamic_sampling_drop) == (
        "ngrpo", 1, 0.16, 0.24, "all_correct")
    assert algo.virtual_reward == pytest.approx(1.1)  # reward=task: task 1.0 + format 0.1


def test_defaults_leave_the_default_run_unchanged():
    """Every seed knob is at its off value in the default config and in every existing preset."""
    for overrides in ([], ["algorithm=dapo"], ["algorithm=gigpo", "env=grid"], ["algorithm=agent_grpo", "env=grid",
                                                                                  "algorithm.credit=loo"]):
        check_settings(checked_settings(check_overrides(overrides)))  # no refusal
    algo = check_overrides([]).algorithm
    assert list(algo.shapers) == [] and list(algo.transforms) == [] and algo.dynamic_sampling_drop == "tied"
    assert not algo.replay.enabled and not algo.hints.enabled and algo.prompt_sampling.mode == "uniform"


BAD = [
    (["algorithm.shapers=[lasr]"],
     "unknown algorithm.shapers entry 'lasr' (did you mean 'laser'?); valid choices: laser,"),
    (["algorithm.transforms=[agrae,foo]"], "valid choices: agrae, pass_at_k, efficiency, noise_forward"),
    (["algorithm.dynamic_sampling_drop=some"], "tied, all_correct, all_incorrect"),
    (["algorithm.prompt_sampling.mode=easy"], "uniform, learnability, hard"),
    (["algorithm.hints.fraction_start=1.5"], "algorithm.hints.fraction_start=1.5"),
    (["rollout.temperature_schedule.mode=hot"], "constant, ead"),
    (["algorithm=ngrpo", "algorithm.scale=batch"], "set algorithm.scale=group"),
    (["algorithm.transforms=[pass_at_k]", "algorithm.shaping.pass_k=16"], "shaping.pass_k=16 needs at least"),
    (["algorithm.shapers=[noise_backward]", "algorithm.shaping.assumed_fp_rate=0.5",
      "algorithm.shaping.assumed_fn_rate=0.5"],
     "must be below 1"),
    (["algorithm.shapers=[noise_backward]", "~reward.components.format"], "cancels exactly"),
    (["algorithm.hints.enabled=true", "algorithm.hints.source=column"], "needs algorithm.hints.column=NAME"),
    (["rollout=vllm", "rollout.temperature_schedule.mode=ead"], "use rollout=hf"),
    (["algorithm=gigpo", "env=grid", "algorithm.credit=gra"],
     "algorithm.credit=gra needs algorithm.gate_threshold: set"),
    (["algorithm=gigpo", "env=grid", "algorithm.entropy_smoothing.low=1.5"], "must be below high=1.2"),
]


@pytest.mark.parametrize("overrides,needle", BAD)
def test_bad_seed_settings_stop_with_one_line(overrides, needle):
    with pytest.raises(UserError) as info:
        check_settings(checked_settings(check_overrides(overrides)))
    assert needle in str(info.value) and "\n" not in str(info.value)


WIRED_ELSEWHERE = [
    (["algorithm=ppo", "algorithm.hints.enabled=true"], "acts in the policy-gradient loop's credit or update"),
    (["algorithm=ppo", "rollout.temperature_schedule.mode=ead"], "the PPO loop scores at rollout.temperature"),
    (["algorithm.replay.enabled=true", "rollout.temperature_schedule.mode=ead"], "turn one of them off"),
]


@pytest.mark.parametrize("overrides,needle", WIRED_ELSEWHERE)
def test_options_outside_their_loop_stop_with_one_line(overrides, needle):
    with pytest.raises(UserError) as info:
        check_settings(checked_settings(check_overrides(overrides)))
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("knob", ["algorithm.transforms=[agrae]", "algorithm.forking_rho=0.2",
                                  "algorithm.skip_zero_advantage=true", "algorithm.scale=none",
                                  "algorithm.positive_weight=0.1", "algorithm.virtual_samples=2"])
def test_a_policy_gradient_loop_knob_is_no_ppo_knob(knob, capsys):
    """The knobs only the policy-gradient loop applies (its credit, forking tokens, the skipped step) are not in PPO's
    schema (rlx/config/families.py): setting one is the one line naming who has it, exit 2."""
    with pytest.raises(SystemExit) as info:
        check_overrides(["algorithm=ppo", knob])
    assert info.value.code == 2
    name = knob.partition("=")[0]
    err = capsys.readouterr().err
    assert err.startswith(f"error: {name} is a policy_gradient") and err.count("\n") == 1, err


def test_ppo_on_several_processes_samples_on_every_rank():
    """PPO has no transforms knob (a PRODUCER_KNOBS entry): absent counts as off, so nothing makes rank 0 sample."""
    from rlx.cli.training import check_run
    from rlx.config.async_rules import rank_zero_reason

    ddp = ["hardware=ddp", "hardware.cpu=true", "hardware.num_processes=2"]
    assert rank_zero_reason(check_run(check_overrides(["algorithm=ppo", *ddp])), 2) is None
    assert rank_zero_reason(check_run(check_overrides(["algorithm=ppo", "algorithm.shapers=[laser]", *ddp])), 2) == (
        "algorithm.shapers=[laser]")


def test_ppo_runs_the_producer_stages():
    """Shapers, noise, prompt sampling and replay act in the single-turn producer, which PPO shares."""
    check_settings(checked_settings(check_overrides(["algorithm=ppo", "algorithm.shapers=[laser]",
                                                     "algorithm.replay.enabled=true",
                                    "algorithm.verifier_noise.fn_rate=0.1", "algorithm.prompt_sampling.mode=hard"])))


@pytest.mark.parametrize("knob", ["algorithm.shapers=[laser]", "algorithm.prompt_sampling.mode=hard",
                                  "algorithm.replay.enabled=true", "algorithm.dynamic_sampling=true",
                                  "rollout.temperature_schedule.mode=ead"])
def test_producer_stages_on_several_processes_sample_on_rank_zero(knob):
    """The producer's stages on 2 DDP processes: rank 0 samples the step through them and broadcasts it (the knob is
    named as the reason); under FSDP rank 0 holds a shard of the policy, refused in one line."""
    from rlx.cli.training import check_run
    from rlx.config.async_rules import rank_zero_reason

    ddp = ["hardware=ddp", "hardware.cpu=true", "hardware.num_processes=2"]
    s = check_run(check_overrides([knob, *ddp]))
    assert rank_zero_reason(s, 2) == knob and rank_zero_reason(s, 1) is None
    assert rank_zero_reason(check_run(check_overrides(ddp)), 2) is None  # nothing set: every rank samples its shard
    with pytest.raises(UserError, match=r"with 2 processes samples with rank 0's parameters") as info:
        check_run(check_overrides([knob, "hardware=fsdp", "hardware.cpu=true", "hardware.num_processes=2",
                                   "hardware.mixed_precision=no"]))
    assert "\n" not in str(info.value) and knob in str(info.value)


def test_hints_stay_on_one_process():
    """Hints grow a group by their re-samples, so a step's rows do not split evenly over processes."""
    from rlx.cli.training import check_run

    with pytest.raises(UserError, match="hints.enabled=true adds hinted re-samples .* split evenly over 2 processes"):
        check_run(check_overrides(["algorithm.hints.enabled=true", "hardware=ddp", "hardware.cpu=true",
                                   "hardware.num_processes=2"]))
    check_run(check_overrides(["algorithm.hints.enabled=true"]))


def test_the_not_wired_guard_reads_real_knobs():
    """The knob lists the rules walk name knobs that exist in the configs (a typo would never fire)."""
    from omegaconf import OmegaConf

    grpo = check_overrides([])
    for knob in [*seed_rules.PRODUCER_KNOBS, *seed_rules.PPO_REFUSED]:
        assert OmegaConf.select(grpo.algorithm, knob, default="missing") != "missing", knob
    ppo = check_overrides(["algorithm=ppo"])
    for knob in seed_rules.PPO_REFUSED:  # refused by a rule, so PPO's schema has it
        assert OmegaConf.select(ppo.algorithm, knob, default="missing") != "missing", knob


def test_the_cli_refuses_an_option_outside_its_loop_with_exit_code_2(tmp_path):
    result = run_rlx(["train", "algorithm=ppo", "algorithm.transforms=[agrae]", "steps=1"], tmp_path, timeout=300)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: algorithm.transforms is a policy_gradient knob")
