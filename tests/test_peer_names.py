"""TRL and verl option names given to rlx: one line pointing at the rlx setting (exit 2), and every
pointer names a key that exists."""

import pytest
from omegaconf import OmegaConf

from rlx.config.overrides import check_overrides
from rlx.config.paths import group_options
from rlx.config.peer_names import PEER_NAMES, peer_pointer
from tests.conftest import run_rlx


@pytest.mark.parametrize("override, rlx_name", [
    ("num_generations=8", "rollout.samples_per_prompt"), ("beta=0.04", "algorithm.kl_coef"),
    ("max_completion_length=256", "rollout.max_new_tokens"), ("epsilon_high=0.28", "algorithm.clip_high"),
    ("loss_type=dr_grpo", "algorithm.loss_agg"), ("scale_rewards=false", "algorithm.scale"),
    ("rollout.n=8", "rollout.samples_per_prompt"), ("actor_rollout_ref.rollout.n=8", "rollout.samples_per_prompt"),
    ("actor_rollout_ref.actor.clip_ratio_high=0.28", "algorithm.clip_high"),
    ("algorithm.beta=0.1", "algorithm.kl_coef"),
])
def test_peer_name_points_at_the_rlx_name(override, rlx_name):
    with pytest.raises(SystemExit) as stop:
        check_overrides([override])
    assert stop.value.code == 2
    key = override.split("=")[0]
    message = peer_pointer(key)
    assert message is not None and f"in rlx set {rlx_name}=" in message and "optim.betas" not in message


def test_pointer_is_one_line_on_the_command_line(tmp_path):
    result = run_rlx(["train", "num_generations=8"], tmp_path, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: unknown key 'num_generations' is a TRL name; in rlx set "
                                     "rollout.samples_per_prompt=...")


def test_dpo_beta_is_still_rlx_s_own_key():
    assert check_overrides(["algorithm=dpo", "algorithm.beta=0.2"]).algorithm.beta == 0.2


def test_every_pointer_names_an_existing_rlx_setting():
    # PPO has the critic's knobs, GRPO the estimator's (algorithm.scale, ...): a pointer names a key of either
    composed = [OmegaConf.to_container(check_overrides([f"algorithm={name}"]), resolve=False)
                for name in ("ppo", "grpo")]
    def has(cfg, dotted):
        node = cfg
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True
    for peer, (target, _) in PEER_NAMES.items():
        if target.endswith("=vllm"):
            assert "vllm" in group_options("rollout")
        elif target in ("algorithm", "logger"):
            assert group_options(target)
        elif " " not in target and "<" not in target and not target.startswith("hydra."):
            assert any(has(cfg, target) for cfg in composed), f"{peer} -> {target} is not an rlx key"
