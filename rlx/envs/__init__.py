"""Text environments for multi-turn RL, in the gymnasium shape (users never need to import rlx):

    reset(*, seed=None, options=None) -> (observation, info)
    step(action: str) -> (observation, reward, terminated, truncated, info)
Observations are text. Optional info keys: "anchor" (hashable state key, GiGPO's step groups),
"is_action_valid" (bool, the invalid-action penalty and env/invalid_actions), "metrics" (dict of
numbers averaged into env/*, e.g. "success").

`env_factory(name, target, kwargs)` builds one from the `env` config group: a registered name (ENVIRONMENTS,
rlx/envs/registry.py: the built-ins and what plugins register), or name=custom with target=my_module.MyEnv and
kwargs={...}.
"""

from __future__ import annotations

# the built-ins register in this order (guess_number, grid, corridor, tool_use, then mixture, which mixes them)
from rlx.envs.builtin import Corridor, Grid, GuessNumber
from rlx.envs.tools import ToolUse

# isort: split
from rlx.envs.mixture import Mixture
from rlx.envs.registry import CUSTOM, ENVIRONMENTS, plays_through_gateway
from rlx.errors import EnvError, UserError

__all__ = ["ENVIRONMENTS", "Corridor", "Grid", "GuessNumber", "Mixture", "ToolUse", "env_factory", "load_target",
           "plays_through_gateway"]


def load_target(target: str):
    """'package.module.Class' -> the class (or any callable returning an environment)."""
    from rlx.config.plugins import import_target

    if not str(target).rpartition(".")[0]:
        raise EnvError(f"env.target='{target}' must be a dotted path such as my_module.MyEnv")
    try:
        return import_target(target, f"env.target='{target}'")
    except UserError as exc:  # one line naming the real cause
        raise EnvError(str(exc)) from None


def env_factory(name: str, target: str | None = None, kwargs: dict | None = None):
    """A zero-argument callable making a fresh environment for one episode slot (None for env=harness)."""
    kwargs = dict(kwargs or {})
    if plays_through_gateway(name):  # no environment object: rlx/gateway/harness.py plays the user's program
        return None
    if name == CUSTOM:
        if not target:
            raise EnvError("env=custom needs env.target=my_module.MyEnv (a class with reset/step)")
        cls = load_target(target)
    elif name in ENVIRONMENTS:
        cls = ENVIRONMENTS[name]
    else:
        raise EnvError(f"unknown env '{name}'; valid choices: {', '.join([*ENVIRONMENTS, CUSTOM])}")
    try:
        probe = cls(**kwargs)
    except (TypeError, ValueError) as exc:  # unknown keyword, or a value the class refuses
        raise EnvError(f"env '{name}' cannot be built with env.kwargs={kwargs}: {exc}") from None
    if not (callable(getattr(probe, "reset", None)) and callable(getattr(probe, "step", None))):
        raise EnvError(f"env '{name}' ({cls}) has no reset()/step() methods")
    return lambda: cls(**kwargs)
