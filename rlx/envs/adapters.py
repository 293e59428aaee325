"""Adapters: environments users already have, in rlx's gymnasium-shaped text protocol.

Each is an optional extra (the package is imported only when the adapter is built) and is selected
like a custom environment: `env=custom env.target=rlx.envs.adapters.ReasoningGymRetry
env.kwargs={task:chain_sum}`.
  ReasoningGymRetry  reasoning-gym tasks as "attempt, feedback, retry" episodes
  GymnasiumText      gymnasium environments with discrete actions (toy_text FrozenLake, Taxi,
                     CliffWalking) through an observation-to-text function and action names
  ToolClassEnv       a TRL `environment_factory` class: its public methods become tools the model
                     calls as <tool>name(arg=value, ...)</tool>, get_reward() gives the reward
  TextArena          a single-player textarena game (GuessTheNumber, Wordle, FrozenLake, ...)
"""

from __future__ import annotations

import ast
import importlib
import inspect
import random
import re
from contextlib import contextmanager


class ReasoningGymRetry:
    """One reasoning-gym question per episode (dataset seed = the episode seed); each turn is an
    attempt scored by the task's own verifier. A right answer ends the episode with its score; a wrong
    one is answered "wrong, try again" until max_attempts (then truncated). The reward of a retry is
    discounted by `retry_discount` per earlier attempt, so a first-try answer is worth most.
    The answer is read by `answer_pattern`'s first group (the whole action when it does not match), or, with
    `reader` (a name of rlx/tasks/readers.py, as model.answer.reader: env.kwargs.reader=final_number), where an
    instruct model states it (an action it finds no answer in is invalid and scores 0)."""

    def __init__(self, task: str = "chain_sum", task_config: dict | None = None, max_attempts: int = 3,
                 retry_discount: float = 0.5, answer_pattern: str = r"<answer>(.*?)</answer>",
                 reader: str | None = None):
        import reasoning_gym  # optional extra

        from rlx.tasks import get_reader

        self._create = reasoning_gym.create_dataset
        self.task, self.task_config = task, dict(task_config or {})
        self.max_attempts, self.retry_discount, self.pattern = (max_attempts, retry_discount,
                                                                re.compile(answer_pattern, re.S))
        self.reader = get_reader(reader) if reader is not None else None

    def reset(self, *, seed=None, options=None):
        self.dataset = self._create(self.task, size=1, seed=seed if seed is not None else 0, **self.task_config)
        self.entry, self.attempts = self.dataset[0], 0
        return self.entry["question"], {"anchor": 0}

    def step(self, action: str):
        self.attempts += 1
        if self.reader is not None:
            answer = self.reader(action, self.entry)
            match = answer
        else:
            match = self.pattern.search(action)
            answer = match.group(1).strip() if match else action.strip()
        score = float(self.dataset.score_answer(answer, self.entry) or 0.0) if answer is not None else 0.0
        solved = score >= 1.0
        reward = score * self.retry_discount ** (self.attempts - 1) if solved else 0.0
        truncated = not solved and self.attempts >= self.max_attempts
        info = {"anchor": self.attempts, "is_action_valid": match is not None, "metrics": {"success": float(solved)}}
        return ("correct" if solved else "wrong, try again"), reward, solved, truncated, info


def _default_text(observation) -> str:
    return str(observation)


class GymnasiumText:
    """A gymnasium environment with a Discrete action space as a text environment.

    env_id: gymnasium id (e.g. "FrozenLake-v1", "Taxi-v3", "CliffWalking-v1"); env_kwargs: passed to
    gymnasium.make; action_names: the text of each action index (default "0", "1", ...);
    to_text: dotted path of a function observation -> str (default str(observation)). An unknown
    action name is an invalid action: the environment is not stepped and the observation repeats.
    Anchor: the observation itself when hashable (toy_text observations are state indices)."""

    def __init__(self, env_id: str = "FrozenLake-v1", env_kwargs: dict | None = None, action_names: list | None = None,
                 to_text: str | None = None):
        import gymnasium  # optional extra

        self.env = gymnasium.make(env_id, **dict(env_kwargs or {}))
        count = self.env.action_space.n
        self.action_names = [str(a) for a in (action_names or range(count))]
        if len(self.action_names) != count:
            raise ValueError(f"{env_id} has {count} actions, got {len(self.action_names)} action_names")
        if to_text:
            from rlx.config.plugins import import_target

            self.to_text = import_target(to_text, f"env.kwargs.to_text='{to_text}'")
        else:
            self.to_text = _default_text
        self.last = None

    def _anchor(self, observation):
        try:
            hash(observation)
            return observation if not hasattr(observation, "tolist") else tuple(observation.tolist())
        except TypeError:
            return None

    def reset(self, *, seed=None, options=None):
        observation, info = self.env.reset(seed=seed, options=options)
        self.last = observation
        return self.to_text(observation), {"anchor": self._anchor(observation)}

    def step(self, action: str):
        name = action.strip()
        if name not in self.action_names:
            info = {"anchor": self._anchor(self.last), "is_action_valid": False, "metrics": {"success": 0.0}}
            return self.to_text(self.last), 0.0, False, False, info
        observation, reward, terminated, truncated, _ = self.env.step(self.action_names.index(name))
        self.last = observation
        info = {"anchor": self._anchor(observation), "is_action_valid": True,
                "metrics": {"success": float(terminated and reward > 0)}}
        return self.to_text(observation), float(reward), bool(terminated), bool(truncated), info


TOOL_CALL = re.compile(r"<tool>\s*([A-Za-z_]\w*)\s*\((.*?)\)\s*</tool>", re.S)


class ToolClassEnv:
    """A TRL `environment_factory`-style class (public methods are tools, get_reward() the reward).

    factory: dotted path of the class (built fresh per episode, without arguments unless kwargs);
    prompt: the first observation (the tool list is appended to it). A turn calls one tool as
    <tool>name(arg=literal, ...)</tool> and sees its return value; a turn without a call ends the
    episode and get_reward() is the reward. A bad call (unknown tool, unparsable arguments, the
    tool raising) is answered "error: ..." and counts as an invalid action. Truncated after max_calls."""

    def __init__(self, factory: str, prompt: str = "Use the tools.", kwargs: dict | None = None, max_calls: int = 4):
        module, _, attr = factory.rpartition(".")
        self.cls, self.kwargs = getattr(importlib.import_module(module), attr), dict(kwargs or {})
        self.prompt, self.max_calls = prompt, max_calls

    def reset(self, *, seed=None, options=None):
        self.obj, self.calls = self.cls(**self.kwargs), 0
        if hasattr(self.obj, "reset"):
            self.obj.reset(**({"seed": seed} if "seed" in inspect.signature(self.obj.reset).parameters else {}))
        self.tools = {name: fn for name, fn in inspect.getmembers(self.obj, callable)
                      if not name.startswith("_") and name not in ("reset", "get_reward")}
        return f"{self.prompt}\nTools: {', '.join(sorted(self.tools))}", {"anchor": 0}

    def step(self, action: str):
        self.calls += 1
        match = TOOL_CALL.search(action)
        if match is None:  # no call: the episode is over, the object scores it
            reward = float(self.obj.get_reward())
            return "done", reward, True, False, {"anchor": self.calls, "metrics": {"success": float(reward > 0)}}
        name, argument_text = match.group(1), match.group(2)
        valid = True
        try:
            if name not in self.tools:
                raise ValueError(f"no tool {name}")
            call = ast.parse(f"f({argument_text})", mode="eval").body
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            observation = str(self.tools[name](*args, **kwargs))
        except Exception as exc:
            observation, valid = f"error: {type(exc).__name__}: {exc}", False
        truncated = self.calls >= self.max_calls
        return observation, 0.0, False, truncated, {"anchor": self.calls, "is_action_valid": valid}


class TextArena:
    """A single-player textarena game (pip install textarena; `ta.make(env_id)` without its LLM
    wrappers) as a text environment.

    env_id: a registered id such as "GuessTheNumber-v0" or "Wordle-v0" (its "-raw" variant is made:
    rlx keeps the conversation itself, so each observation is only what is new since the last turn:
    the game's messages, never the player's own action echoed back); env_kwargs: passed to ta.make.
    textarena games draw from Python's global `random` (and some from numpy's): each episode gets
    its own states of both, seeded from reset(seed=...) and swapped in only while the game runs, so
    an episode depends on its seed alone (not on the other episodes stepping in between) and the
    process's own global RNGs are left as they were. The reward is the game's final reward for the
    player (0 before the end; some games give partial credit); success when it reaches
    `success_reward`. A move the game rejects (it answers "invalid move" and counts an error) is an
    invalid action."""

    def __init__(self, env_id: str = "GuessTheNumber-v0", env_kwargs: dict | None = None, success_reward: float = 1.0):
        import textarena  # optional extra: pip install 'rlx[agents]'

        self._make = textarena.make
        self.env_id = env_id if env_id.endswith("-raw") else f"{env_id}-raw"
        self.env_kwargs, self.success_reward = dict(env_kwargs or {}), success_reward
        self._rng_states = None

    @contextmanager
    def _own_rng(self):
        import numpy as np

        outside = random.getstate(), np.random.get_state()
        random.setstate(self._rng_states[0])
        np.random.set_state(self._rng_states[1])
        try:
            yield
        finally:
            self._rng_states = random.getstate(), np.random.get_state()
            random.setstate(outside[0])
            np.random.set_state(outside[1])

    def _observation(self) -> str:
        player, messages = self.env.get_observation()
        return "\n".join(str(text) for sender, text, *_ in messages if sender != player)

    def reset(self, *, seed=None, options=None):
        import numpy as np

        seed = 0 if seed is None else int(seed)
        self._rng_states = random.Random(seed).getstate(), np.random.RandomState(seed % 2**32).get_state()
        with self._own_rng():
            self.env = self._make(self.env_id, **self.env_kwargs)
            self.env.reset(num_players=1, seed=seed)
            return self._observation(), {}

    def step(self, action: str):
        with self._own_rng():
            errors = getattr(self.env.state, "error_count", 0)
            done, _ = self.env.step(action)
            invalid = getattr(self.env.state, "error_count", 0) > errors
            if not done:
                return (self._observation(), 0.0, False, False,
                        {"is_action_valid": not invalid, "metrics": {"success": 0.0}})
            rewards, game_info = self.env.close()
        reward = float(rewards.get(0, 0.0)) if rewards else 0.0
        info = game_info.get(0, {}) if isinstance(game_info, dict) else {}
        invalid = invalid or bool(info.get("invalid_move"))
        return (str(info.get("reason", "game over")), reward, True, False,
                {"is_action_valid": not invalid, "metrics": {"success": float(reward >= self.success_reward)}})
