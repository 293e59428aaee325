"""Adapters (rlx/envs/adapters.py) against the real packages; each skips with a reason when its package is absent."""

import pytest

from rlx.envs import env_factory


def test_reasoning_gym_retry_attempt_feedback_retry():
    pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed (optional extra)")
    env = env_factory("custom", "rlx.envs.adapters.ReasoningGymRetry",
                      {"task": "chain_sum", "task_config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                            "max_digits": 1}, "max_attempts": 2})()
    question, _ = env.reset(seed=3)
    assert question == env.reset(seed=3)[0] and "=" in question  # the seed fixes the question
    answer = env.entry["answer"]
    obs, reward, terminated, truncated, info = env.step("<answer>999</answer>")
    assert obs == "wrong, try again" and reward == 0.0 and not terminated and not truncated
    obs, reward, terminated, truncated, info = env.step(f"<answer>{answer}</answer>")
    assert terminated and reward == 0.5 and info["metrics"]["success"] == 1.0  # second try: discounted once
    env.reset(seed=3)
    env.step("no tags at all")
    _, _, terminated, truncated, info = env.step("still wrong")
    assert truncated and not terminated and info["is_action_valid"] is False


def test_gymnasium_frozenlake_as_text():
    pytest.importorskip("gymnasium", reason="gymnasium not installed (optional extra: pip install gymnasium)")
    env = env_factory("custom", "rlx.envs.adapters.GymnasiumText",
                      {"env_id": "FrozenLake-v1", "env_kwargs": {"is_slippery": False, "map_name": "4x4"},
                       "action_names": ["L", "D", "R", "U"]})()
    obs, info = env.reset(seed=0)
    assert obs == "0" and info["anchor"] == 0
    obs, reward, terminated, truncated, info = env.step("R")
    assert obs == "1" and info["is_action_valid"] and reward == 0.0
    obs, _, _, _, info = env.step("jump")
    assert obs == "1" and info["is_action_valid"] is False
    # back to the start, then the 4x4 map's safe path D D R D R R
    for move in ["L", "D", "D", "R", "D", "R", "R"]:
        obs, reward, terminated, truncated, info = env.step(move)
    assert terminated and reward == 1.0 and info["metrics"]["success"] == 1.0


class Counter:
    """A TRL environment_factory-shaped class: public methods are tools, get_reward() scores."""

    def __init__(self):
        self.total = 0

    def add(self, amount: int) -> int:
        self.total += amount
        return self.total

    def get_reward(self) -> float:
        return float(self.total == 5)


def test_tool_class_env_public_methods_become_tools(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "counter_tools_for_test", sys.modules[__name__])
    env = env_factory("custom", "rlx.envs.adapters.ToolClassEnv", {"factory": "counter_tools_for_test.Counter"})()
    obs, _ = env.reset(seed=0)
    assert "Tools: add" in obs and "get_reward" not in obs
    assert env.step("<tool>add(amount=2)</tool>")[0] == "2"
    assert env.step("<tool>add(3)</tool>")[0] == "5"
    obs, _, _, _, info = env.step("<tool>launch(1)</tool>")
    assert obs.startswith("error:") and info["is_action_valid"] is False
    obs, reward, terminated, _, _ = env.step("finished")
    assert terminated and reward == 1.0
