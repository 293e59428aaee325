"""Built-in text environments (rlx/envs): rules, seeding, anchors, tool calls, custom loading."""

import sys

import pytest

from rlx.envs import ENVIRONMENTS, env_factory
from rlx.envs.builtin import Corridor, Grid, GuessNumber
from rlx.envs.mixture import Mixture
from rlx.envs.tools import ToolUse, calculate
from rlx.errors import EnvError


def _run(env, actions, seed):
    obs, info = env.reset(seed=seed)
    out = [(obs, None, False, False, info)]
    for action in actions:
        out.append(env.step(action))
        if out[-1][2] or out[-1][3]:
            break
    return out


def test_guess_number_feedback_and_binary_search_succeeds():
    env = GuessNumber(high=8, max_guesses=4)
    env.reset(seed=3)
    secret = env.secret
    lo, hi = 1, 8
    for _ in range(4):
        guess = (lo + hi) // 2
        obs, reward, terminated, truncated, info = env.step(f" {guess}\n")
        if terminated:
            break
        assert obs == ("higher" if guess < secret else "lower")
        lo, hi = (guess + 1, hi) if obs == "higher" else (lo, guess - 1)
        assert info["anchor"] == (lo, hi)
    assert terminated and reward == 1.0 and info["metrics"]["success"] == 1.0
    # invalid answers are flagged, and the episode truncates after max_guesses
    env.reset(seed=3)
    steps = [env.step("x") for _ in range(4)]
    assert [s[4]["is_action_valid"] for s in steps] == [False] * 4
    assert steps[-1][3] and not steps[-2][3]


def test_grid_map_is_seeded_and_solvable_and_holes_end_the_episode():
    env = Grid(size=3, holes=2, max_steps=6)
    first = env.reset(seed=11)[0]
    assert env.reset(seed=11)[0] == first  # same seed, same task
    assert len({Grid().reset(seed=s)[0] for s in range(20)}) > 5
    assert first.count("P") == 1 and first.count("G") == 1 and first.count("H") == 2
    # walk the shortest path (BFS) and get the reward
    from collections import deque

    from rlx.envs.builtin import MOVES
    start, goal = env.position, env.goal
    parents, queue = {start: None}, deque([start])
    while queue:
        cell = queue.popleft()
        for name, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < 3 and 0 <= nxt[1] < 3 and nxt not in env.hole_cells and nxt not in parents:
                parents[nxt] = (cell, name)
                queue.append(nxt)
    path, cell = [], goal
    while parents[cell] is not None:
        cell, name = parents[cell]
        path.append(name)
    out = _run(env, list(reversed(path)), seed=11)
    assert out[-1][1] == 1.0 and out[-1][2] and out[-1][4]["metrics"]["success"] == 1.0
    # a hole: terminated with reward 0
    for seed in range(50):
        env.reset(seed=seed)
        for name, (dr, dc) in MOVES.items():
            target = (env.start[0] + dr, env.start[1] + dc)
            if target in env.hole_cells:
                env.reset(seed=seed)
                obs, reward, terminated, truncated, info = env.step(name)
                assert terminated and reward == 0.0 and info["anchor"] == target
                return
    pytest.fail("no map with a hole next to the start in 50 seeds")


def test_grid_map_has_one_token_per_cell():
    """Cells are space-separated, so the tiny tokenizer gives every map the same token layout (with
    "..G" it merged ".." into one token and a cell's offset depended on its neighbours)."""
    from transformers import AutoTokenizer

    from rlx.config.paths import ASSETS_DIR

    env = Grid(size=3, holes=2)
    obs = env.reset(seed=11)[0]
    assert obs.split("\n")[env.position[0]].split(" ")[env.position[1]] == "P"
    tokenizer = AutoTokenizer.from_pretrained(ASSETS_DIR / "tiny_agent")
    lengths = {len(tokenizer(Grid().reset(seed=s)[0], add_special_tokens=False)["input_ids"]) for s in range(30)}
    assert lengths == {17}  # 9 cells + 6 spaces + 2 newlines


def test_grid_corners_layout_fixes_start_and_goal_and_moves_the_holes():
    """layout=corners (gymnasium FrozenLake's): S top-left, G bottom-right on every map, holes drawn from the
    seed, and D D R R (or R R D D) is not always safe, so the map still matters."""
    maps = []
    for seed in range(40):
        env = Grid(size=3, holes=1, layout="corners")
        obs, info = env.reset(seed=seed)
        assert info["anchor"] == (0, 0) and env.goal == (2, 2) and obs.startswith("P") and obs.endswith("G")
        assert env.expert_action() is not None  # a path exists
        maps.append(obs)
    assert len(set(maps)) == 7  # the hole takes each of the 7 free cells
    assert len({Grid().reset(seed=s)[1]["anchor"] for s in range(40)}) > 3  # the default layout moves the start
    with pytest.raises(EnvError, match="layout must be 'random' or 'corners'"):
        env_factory("grid", kwargs={"layout": "diagonal"})


def test_grid_invalid_action_and_truncation():
    env = Grid(max_steps=2)
    env.reset(seed=0)
    _, _, _, truncated, info = env.step("go left")
    assert info["is_action_valid"] is False and not truncated
    assert env.step("Q")[3] is True


def test_corridor_reward_needs_the_key_first():
    env = Corridor(length=5, max_steps=12)
    env.reset(seed=4)
    start, key = env.position, env.key
    # straight to the door without the key: no reward, the door stays shut
    for _ in range(5 - start):
        obs, reward, terminated, truncated, info = env.step("R")
    assert reward == 0.0 and not terminated and "no key" in obs
    env.reset(seed=4)
    actions = ["L"] * (start - key) + ["R"] * (5 - key)
    rewards = [env.step(a)[1] for a in actions]
    assert rewards[:-1] == [0.0] * (len(actions) - 1) and rewards[-1] == 1.0  # delayed to the last step
    assert env.has_key


def test_calculator_and_tool_env_errors_are_observations():
    assert calculate("37*12+3") == 447
    for bad in ("__import__('os')", "2**99999", "1//0", "abc"):
        with pytest.raises(ValueError):
            calculate(bad)
    env = ToolUse()
    question, _ = env.reset(seed=5)
    expr = question.rstrip("=?")
    obs, reward, terminated, _, info = env.step(f"<calc>{expr}</calc>")
    assert obs == f"<result>{env.answer}</result>" and info["is_action_valid"] and not terminated
    obs, _, terminated, _, info = env.step("<calc>import os</calc>")
    assert obs.startswith("error:") and info["is_action_valid"] is False and not terminated
    env.reset(seed=5)
    obs, _, _, _, info = env.step("I think it is 12")
    assert obs.startswith("error:") and not info["is_action_valid"]
    obs, reward, terminated, _, _ = env.step(f"<answer>{env.answer}</answer>")
    assert reward == 1.0 and terminated and obs == "correct"


def test_tool_env_python_through_the_sandbox():
    env = ToolUse(tools=["calc", "python"])
    env.reset(seed=1)
    obs, _, _, _, info = env.step("<python>print(6*7)</python>")
    assert obs == "<result>42</result>" and info["is_action_valid"]
    obs, _, _, _, info = env.step("<python>raise SystemExit('boom')</python>")
    assert obs.startswith("error:") and not info["is_action_valid"]


class _Custom:
    def __init__(self, goal="x"):
        self.goal = goal

    def reset(self, *, seed=None, options=None):
        return "say " + self.goal, {}

    def step(self, action):
        return "", float(action == self.goal), True, False, {}


def test_env_factory_builtin_custom_and_errors(monkeypatch):
    assert set(ENVIRONMENTS) >= {"guess_number", "grid", "corridor", "tool_use"}
    assert isinstance(env_factory("grid", kwargs={"size": 4})(), Grid)
    monkeypatch.setitem(sys.modules, "my_envs_for_test", sys.modules[__name__])
    env = env_factory("custom", target="my_envs_for_test._Custom", kwargs={"goal": "y"})()
    assert env.reset(seed=0)[0] == "say y" and env.step("y")[1] == 1.0
    for args, message in ((("nope",), "valid choices"), (("custom",), "env.target"),
                          (("custom", "no_such_module_xyz.Env"), "cannot import"),
                          (("custom", "my_envs_for_test.Missing"), "no attribute"),
                          (("grid", None, {"bogus": 1}), "cannot be built")):
        with pytest.raises(EnvError, match=message):
            env_factory(*args)


def test_mixture_seed_picks_environment_and_task():
    """seed % 3 picks the environment, seed // 3 its task: a group (same seed) plays one task, consecutive
    seeds cycle through the environments, and the expert moves are the picked environment's."""
    mix = Mixture({"corridor": {}, "grid": {}, "tool_use": {}})
    for seed, cls in ((30, Corridor), (31, Grid), (32, ToolUse)):
        obs, info = mix.reset(seed=seed)
        alone = cls()
        assert obs == alone.reset(seed=seed // 3)[0]
        assert info["anchor"][0] == mix.names[seed % 3]
        assert mix.expert_action() == alone.expert_action()
        action = alone.expert_action()
        assert mix.step(action)[:4] == alone.step(action)[:4]
    assert mix.reset(seed=31)[0] == Mixture().reset(seed=31)[0]  # the default mixture is the same three
    with pytest.raises(EnvError, match="cannot be built"):
        env_factory("mixture", kwargs={"envs": {"nope": {}}})
