"""The seed-idea knobs (issue 29) in the configs: every preset composes and passes the schema, bad values stop with
one line naming the knob, and every knob the loop does not apply yet is refused rather than silently ignored."""

import pytest

from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.schema import check_config
from rlx.config.seed_rules import NOT_WIRED
from rlx.errors import UserError
from tests.conftest import run_rlx

# presets that extend grpo / gigpo with a seed idea; they train once issue 29 part 2 wires them (then they move to
# tests/test_pg_presets.py PRESETS and the agent training tests)
SEED_PRESETS = ["ngrpo", "laser", "laser_d", "unlikeliness", "agrae"]
AGENT_SEED_PRESETS = ["hgpo"]


@pytest.mark.parametrize("preset", SEED_PRESETS + AGENT_SEED_PRESETS)
def test_seed_presets_compose_pass_the_schema_and_are_refused_until_wired(preset):
    overrides = [f"algorithm={preset}", *(["env=grid"] if preset in AGENT_SEED_PRESETS else [])]
    cfg = check_overrides(overrides)
    check_config(cfg)
    with pytest.raises(UserError, match="is not wired into the training loop yet") as info:
        check_settings(cfg)
    assert "\n" not in str(info.value)


def test_ngrpo_preset_sets_the_authors_recipe():
    algo = check_overrides(["algorithm=ngrpo"]).algorithm
    assert (algo.advantage, algo.virtual_samples, algo.clip_low, algo.clip_high, algo.dynamic_sampling_drop) == (
        "ngrpo", 1, 0.16, 0.24, "all_correct")
    assert algo.virtual_reward == pytest.approx(1.1)  # reward=task: task 1.0 + format 0.1


def test_defaults_leave_the_default_run_unchanged():
    """Every seed knob is at its off value in the default config and in every existing preset."""
    for overrides in ([], ["algorithm=dapo"], ["algorithm=gigpo", "env=grid"], ["algorithm=agent_grpo", "env=grid",
                                                                                  "algorithm.credit=loo"]):
        check_settings(check_overrides(overrides))  # no refusal
    algo = check_overrides([]).algorithm
    assert list(algo.shapers) == [] and list(algo.transforms) == [] and algo.dynamic_sampling_drop == "tied"
    assert not algo.replay.enabled and not algo.hints.enabled and algo.prompt_sampling.mode == "uniform"


BAD = [
    (["algorithm.shapers=[lasr]"], "unknown algorithm.shapers entry 'lasr' (did you mean 'laser'?); valid choices: laser,"),
    (["algorithm.transforms=[agrae,foo]"], "valid choices: agrae, pass_at_k, efficiency, noise_forward"),
    (["algorithm.dynamic_sampling_drop=some"], "tied, all_correct, all_incorrect"),
    (["algorithm.prompt_sampling.mode=easy"], "uniform, learnability, hard"),
    (["algorithm.hints.fraction_start=1.5"], "algorithm.hints.fraction_start=1.5"),
    (["rollout.temperature_schedule.mode=hot"], "constant, ead"),
    (["algorithm=ngrpo", "algorithm.scale=batch"], "set algorithm.scale=group"),
    (["algorithm.transforms=[pass_at_k]", "algorithm.shaping.pass_k=16"], "shaping.pass_k=16 needs at least"),
    (["algorithm.shapers=[noise_backward]", "algorithm.shaping.assumed_fp_rate=0.5", "algorithm.shaping.assumed_fn_rate=0.5"],
     "must be below 1"),
    (["algorithm.shapers=[noise_backward]", "~reward.components.format"], "cancels exactly"),
    (["algorithm.hints.enabled=true", "algorithm.hints.source=column"], "needs algorithm.hints.column=NAME"),
    (["rollout=vllm", "rollout.temperature_schedule.mode=ead"], "use rollout=hf"),
    (["algorithm=gigpo", "env=grid", "algorithm.credit=gra"], "set algorithm.gate_threshold=TAU"),
    (["algorithm=gigpo", "env=grid", "algorithm.entropy_smoothing.low=1.5"], "must be below high=1.2"),
]


@pytest.mark.parametrize("overrides,needle", BAD)
def test_bad_seed_settings_stop_with_one_line(overrides, needle):
    with pytest.raises(UserError) as info:
        check_settings(check_overrides(overrides))
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("knob,value", [("algorithm.shapers", "[laser]"), ("algorithm.verifier_noise.fn_rate", "0.2"),
                                        ("algorithm.replay.enabled", "true"), ("rollout.temperature_schedule.mode", "ead"),
                                        ("algorithm.prompt_sampling.mode", "hard")])
def test_every_unwired_knob_is_refused(knob, value):
    with pytest.raises(UserError, match=f"{knob}=.* is not wired"):
        check_settings(check_overrides([f"{knob}={value}"]))


def test_the_not_wired_list_names_real_knobs():
    cfg = check_overrides(["algorithm=gigpo", "env=grid"])
    grpo = check_overrides([])
    from omegaconf import OmegaConf

    for knob in NOT_WIRED["policy_gradient"]:
        assert OmegaConf.select(grpo.algorithm, knob, default="missing") != "missing", knob
    for knob in NOT_WIRED["agent"]:
        assert OmegaConf.select(cfg.algorithm, knob, default="missing") != "missing", knob


def test_the_cli_refuses_an_unwired_preset_with_exit_code_2(tmp_path):
    result = run_rlx(["train", "algorithm=laser", "steps=1"], tmp_path, timeout=300)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "algorithm.shapers=['laser'] is not wired" in lines[0]
