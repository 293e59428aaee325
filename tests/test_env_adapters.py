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


def test_reasoning_gym_retry_reads_with_a_models_reader():
    pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed (optional extra)")
    env = env_factory("custom", "rlx.envs.adapters.ReasoningGymRetry",
                      {"task": "chain_sum", "task_config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                            "max_digits": 1}, "reader": "final_number"})()
    env.reset(seed=3)
    answer = env.entry["answer"]
    _, reward, _, _, info = env.step("I am not sure")
    assert reward == 0.0 and info["is_action_valid"] is False  # no answer stated
    _, reward, terminated, _, info = env.step(f"2 + 8 equals 10. So the total is {answer}.")
    assert terminated and reward == 0.5 and info["is_action_valid"]  # read where it is stated, second try


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


def test_textarena_guess_the_number_plays_seeded_episodes():
    pytest.importorskip("textarena", reason="textarena not installed (optional extra: pip install 'rlx[agents]')")
    import random

    import numpy as np

    from rlx.engines.records import Generation
    from rlx.models.loading import load_tokenizer
    from rlx.rollout.env import EpisodeLimits, run_episodes

    factory = env_factory("custom", "rlx.envs.adapters.TextArena", {"env_id": "GuessTheNumber-v0"})
    env = factory()
    random.seed(7)
    np.random.seed(7)
    outside = random.random(), np.random.rand()
    random.seed(7)
    np.random.seed(7)
    first, info = env.reset(seed=5)
    assert isinstance(first, str) and "Guess The Number" in first
    low, high, turns = 1, 20, 0
    while True:  # binary search on the game's own hints: wins within log2(20) + 1 turns
        guess = (low + high) // 2
        observation, reward, terminated, truncated, info = env.step(f"my guess: [{guess}]")
        turns += 1
        assert isinstance(observation, str) and "[" not in observation  # the game's answer, not our move echoed
        if terminated:
            break
        assert reward == 0.0 and info["is_action_valid"] and not truncated
        low, high = (guess + 1, high) if "higher" in observation else (low, guess - 1)
    assert reward == 1.0 and info["metrics"]["success"] == 1.0 and turns <= 5
    assert (random.random(), np.random.rand()) == outside  # the process's global RNGs were not touched

    # the seed alone fixes the secret: equal seeds equal games, whatever ran in between
    secrets = []
    for seed in (5, 6, 5):
        other = factory()
        other.reset(seed=seed)
        random.random()
        secrets.append(other.env.game_number)
    assert secrets[0] == secrets[2] == env.env.game_number and secrets[1] != secrets[0]
    assert other.step("no brackets")[4]["is_action_valid"] is False

    # through the token-in/token-out rollout: text observations, the game's feedback as the next turn
    tokenizer = load_tokenizer("builtin:tiny", None, False)
    ids = tokenizer("[10]", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    class Fixed:
        version = 0

        def generate_ids(self, prompts, *, max_new_tokens, seeds, greedy=False):
            return Generation([list(ids) for _ in prompts], [[0.0] * len(ids) for _ in prompts], [True] * len(prompts))

    episodes = run_episodes(Fixed(), tokenizer, [factory(), factory()], [5, 6], [0, 1], EpisodeLimits(3, 8, 10_000))
    for e in episodes:
        assert e.error is None and e.actions == ["[10]"] * len(e.actions)
        assert e.observations[1] in ("The target number is higher.", "The target number is lower.")
        assert e.valid[1] is False  # the same guess twice is rejected by the game
