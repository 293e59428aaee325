"""Every policy-gradient preset trains for 2 steps (one Hydra multirun subprocess), and conflicting
settings stop at start-up with exit code 2 and one line naming them."""

import pytest
import yaml

from rlx.config.overrides import check_overrides
from rlx.config.paths import CONF_DIR
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.errors import UserError
from rlx.runtime.rundir import read_metrics
from tests.conftest import run_rlx
from tests.test_seed_config import SEED_PRESETS

PRESETS = ["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "lite_ppo", "mc_grpo", "gspo",
           "ppo", *SEED_PRESETS]
TINY = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=4", "eval.size=8", "data.train_size=300",
        "save.final=false", "save.plot=false", "log.samples_every=0", "micro_batch_size=8"]


@pytest.fixture(scope="module")
def preset_runs(tmp_path_factory):
    """Run every preset once, in a single multirun process (saves the interpreter start-up per preset)."""
    tmp_path = tmp_path_factory.mktemp("presets")
    result = run_rlx(["train", "-m", f"algorithm={','.join(PRESETS)}", *TINY], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {}
    for config in (tmp_path / "outputs" / "multirun").glob("*/*/config.yaml"):
        runs[yaml.safe_load(config.read_text())["algorithm"]["name"]] = config.parent
    return runs


def test_every_preset_is_tested():
    shipped = {p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml")}
    preference_or_sft = {name for name in shipped
                         if yaml.safe_load((CONF_DIR / "algorithm" / f"{name}.yaml").read_text())
                         .get("family", "policy_gradient") not in ("policy_gradient", "ppo")}
    extends_grpo = {name for name in shipped - preference_or_sft
                    if "grpo" in str(yaml.safe_load((CONF_DIR / "algorithm"
                                                     / f"{name}.yaml").read_text()).get("defaults"))}
    # the multi-turn presets (family agent: agent_grpo and those extending it) are trained in tests/test_agent_train.py
    agent = {name for name in shipped if name == "agent_grpo" or "agent_grpo" in str(
        yaml.safe_load((CONF_DIR / "algorithm" / f"{name}.yaml").read_text()).get("defaults"))}
    assert extends_grpo - agent | {"grpo"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_trains_two_steps(preset_runs, preset):
    assert preset in preset_runs, sorted(preset_runs)
    rows = read_metrics(preset_runs[preset] / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("train/loss", "train/clip_frac_low", "train/clip_frac_high", "train/approx_kl", "train/entropy",
                "train/frac_zero_std_groups", "train/advantage_mean", "train/advantage_std", "train/advantage_max",
                "train/prompts_drawn", "reward/total"):
        assert rows[1].get(key) is not None, key
    assert "eval/accuracy" in rows[2]
    if preset == "ppo":
        assert rows[1]["train/value_loss"] >= 0 and "train/explained_variance" in rows[1]
    if preset == "dapo":
        assert "reward/overlong" in rows[1]
        # dynamic sampling draws at least the batch, and more whenever a group tied
        assert rows[1]["train/prompts_drawn"] >= 2


def test_dynamic_sampling_draws_more_prompts_when_groups_tie(tmp_path):
    # with 2 samples per prompt many groups tie; every step must draw more prompts than it trains on
    result = run_rlx(["train", *TINY, "algorithm=dapo", "rollout.samples_per_prompt=2", "prompts_per_step=4",
                      "eval.at_start=false", "algorithm.max_sample_batches=6", "steps=2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted((tmp_path / "outputs" / "train").iterdir())
    rows = [r for r in read_metrics(runs[-1] / "metrics.jsonl") if "train/prompts_drawn" in r]
    for row in rows:
        assert row["train/prompts_drawn"] >= 4
        expected_extra = row["train/sample_rounds"] > 1
        assert (row["train/prompts_drawn"] > 4) == expected_extra
    assert any(row["train/sample_rounds"] > 1 for row in rows), rows


CONFLICTS = [
    (["algorithm=rloo", "rollout.samples_per_prompt=1"], "rollout.samples_per_prompt=1 must be at least 2"),
    (["algorithm.advantage=gae"], "needs a value model"),
    (["algorithm.clip_low=0.3", "algorithm.clip_high=0.2"], "clip_high=0.2 is below algorithm.clip_low=0.3"),
    (["algorithm=mc_grpo", "rollout.samples_per_prompt=5"],
     "samples_per_prompt=5 + 1 extra = 6 (make samples_per_prompt even)"),
    (["algorithm.kl_coef=0.1", "algorithm.kl_in=reward"], "set algorithm.kl_estimator=k1"),
    (["algorithm.ref_reset_every=5"], "need a reference"),
    (["algorithm.dual_clip=0.5"], "dual_clip=0.5 must be > 1"),
    (["algorithm.forking_rho=0"], "algorithm.forking_rho=0 is not valid: it must be a number in (0, 1]"),
    (["algorithm=reinforce_pp", "algorithm.dynamic_sampling=true"], "reinforce_pp has no group baseline"),
    (["algorithm.advantage=rlooo"], "unknown algorithm.advantage 'rlooo'; valid choices: grpo, rloo"),
    (["algorithm.loss_agg=mean"], "unknown algorithm.loss_agg 'mean'"),
    (["algorithm=ppo", "algorithm.advantage=grpo"], "family=ppo trains a critic"),
    (["algorithm.overlong_buffer=99"], "overlong_buffer=99"),
]


@pytest.mark.parametrize("overrides,needle", CONFLICTS, ids=[" ".join(o) for o, _ in CONFLICTS])
def test_conflicting_settings_are_user_errors(overrides, needle):
    with pytest.raises(UserError, match=None) as info:
        check_settings(checked_settings(check_overrides(overrides)))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_conflict_exits_2_with_one_line(tmp_path):
    result = run_rlx(["train", "algorithm=rloo", "rollout.samples_per_prompt=1"], tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "algorithm.advantage=rloo" in lines[0] and "samples_per_prompt=1" in lines[0]
    assert "Traceback" not in result.stderr


def test_every_preset_names_its_source_and_passes_the_checks():
    for preset in PRESETS:
        text = (CONF_DIR / "algorithm" / f"{preset}.yaml").read_text()
        assert text.startswith("#") and any(ch.isdigit() for ch in text.splitlines()[0] + text.splitlines()[1]), preset
        check_settings(checked_settings(check_overrides([f"algorithm={preset}"])))


@pytest.mark.long
def test_every_knob_at_once_in_both_families(tmp_path):
    # the knobs no preset turns: entropy bonus, forking tokens, KL in the loss with an adaptive coefficient
    # and periodic reference reset, dual clip, truncation masking, sign weighting, several mini-batches;
    # then KL in the reward (with a separate value model for PPO)
    knobs = ["algorithm.entropy_coef=0.01", "algorithm.forking_rho=0.2", "algorithm.kl_coef=0.05",
             "algorithm.kl_target=0.01", "algorithm.ref_reset_every=1", "algorithm.dual_clip=3",
             "algorithm.mask_truncated=true", "algorithm.positive_weight=0.1", "algorithm.mini_batches=2",
             "rollout.max_new_tokens=8"]
    result = run_rlx(["train", "-m", "algorithm=grpo,ppo", *TINY, *knobs, "eval.at_start=false"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    in_reward = [*TINY, "eval.at_start=false", "algorithm.kl_coef=0.05", "algorithm.kl_in=reward",
                 "algorithm.kl_estimator=k1"]
    result = run_rlx(["train", "-m", "algorithm=grpo", *in_reward], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # algorithm.value_model is a knob of the ppo family only (grpo refuses it), so PPO's run is its own
    result = run_rlx(["train", "algorithm=ppo", *in_reward, "algorithm.value_model=builtin:tiny"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [read_metrics(p) for p in sorted((tmp_path / "outputs").glob("**/metrics.jsonl"))]
    assert len(metrics) == 4
    for rows in metrics:
        assert rows[-1]["step"] == 2 and "train/kl_ref" in rows[-1] and "train/kl_coef" in rows[-1]
    adapted = [rows[-1]["train/kl_coef"] for rows in metrics[:2]]
    assert all(coef != 0.05 for coef in adapted)  # the adaptive controller moved the coefficient
