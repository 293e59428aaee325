"""Registry entries declare what they need and the rules read it (issue 36): a plugin's shaper is checked like a
built-in, env=harness is asked, not named, and a rollout backend's rules follow what it declares it gives."""

import pytest

from rlx.algorithms.shaping import SHAPERS, ShaperNeeds
from rlx.config.groups import ROLLOUT_GIVES
from rlx.config.needs import broken, refuse_first
from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.envs import plays_through_gateway
from rlx.envs.registry import EnvNeeds, env_needs
from rlx.errors import UserError


@pytest.fixture
def plugin_shaper():
    """A plugin shaper declaring the needs noise_backward and laser_d declare, removed afterwards."""
    SHAPERS.add("tmp_needy", lambda rewards, signals, **_: (rewards, {}),
                needs={"rates_below_one": ("assumed_fp_rate", "assumed_fn_rate"),
                       "knobs": (("target_candidates", "budgets to try"),)})
    yield "tmp_needy"
    SHAPERS.unregister("tmp_needy")


def test_a_plugin_shapers_declared_needs_are_checked_like_a_built_ins(plugin_shaper):
    assert SHAPERS.needs(plugin_shaper) == ShaperNeeds(knobs=(("target_candidates", "budgets to try"),),
                                                       rates_below_one=("assumed_fp_rate", "assumed_fn_rate"))
    rates = ["algorithm.shaping.assumed_fp_rate=0.6", "algorithm.shaping.assumed_fn_rate=0.5"]
    with pytest.raises(UserError, match=r"assumed_fp_rate \+ assumed_fn_rate = 1.1 must be below 1 for tmp_needy"):
        check_settings(checked_settings(check_overrides([f"algorithm.shapers=[{plugin_shaper}]", *rates])))
    with pytest.raises(UserError, match=r"algorithm.shapers=\[tmp_needy\] needs algorithm.shaping.target_candidates"):
        check_settings(checked_settings(check_overrides([f"algorithm.shapers=[{plugin_shaper}]",
                                                         "algorithm.shaping.target_candidates=[]"])))


def test_the_built_in_shapers_declare_what_the_rules_and_the_stages_read():
    assert SHAPERS.needs("laser_d").length_targets and SHAPERS.needs("par").reference_rewards
    assert SHAPERS.needs("noise_backward").affine and SHAPERS.needs("laser").knobs == ()


def test_env_names_declare_how_they_play():
    assert plays_through_gateway("harness") and env_needs("harness") == EnvNeeds(gateway=True)
    assert not any(plays_through_gateway(name) for name in ("grid", "custom", None, "no_such_env"))


def test_the_backends_declare_what_they_give():
    assert ROLLOUT_GIVES["hf"].per_token_temperature and not ROLLOUT_GIVES["vllm"].background_thread
    assert ROLLOUT_GIVES["server"].background_thread and not ROLLOUT_GIVES["server"].seeded_continuation


def test_a_rule_table_names_its_first_broken_row():
    assert broken([(False, "a"), (True, "b"), (1, "c")]) == ["b", "c"]
    refuse_first([])
    with pytest.raises(UserError, match="^b$"):
        refuse_first(broken([(False, "a"), (True, "b"), (True, "c")]))
