"""The environments `env.name` can name: `@ENVIRONMENTS.register("name")` on a class (or a callable returning an
environment) with reset/step in the gymnasium shape (rlx/envs/__init__.py). The built-ins register in
builtin.py, tools.py and mixture.py, which rlx/envs/__init__.py imports in that order; a plugin registers its
own with `@rlx.register("env", "name")` and runs with `env=custom env.name=name` (docs/extending/plugins.md).
`env=custom env.target=my_module.MyEnv` needs no registration.

Each name declares how it plays (`EnvNeeds`, read with `env_needs(name)`): callers ask it instead of comparing
names. `env=harness` is no environment class: the user's program plays each episode through rlx's
OpenAI-compatible gateway (rlx/gateway/harness.py), so it is declared in `GATEWAY_ENVS`, not registered."""

from __future__ import annotations

from dataclasses import dataclass

from rlx.registry import Registry, publish


@dataclass(frozen=True)
class EnvNeeds:
    """How an `env.name` plays. gateway: no environment object; the program `env.target` plays each episode
    through the gateway (no expert to imitate, no per-turn budget to check before playing, its own knobs)."""

    gateway: bool = False


ENVIRONMENTS = publish("env", Registry("env", default_needs=EnvNeeds()))
CUSTOM = "custom"  # env.name that loads env.target instead of a registered environment
GATEWAY_ENVS = {"harness": EnvNeeds(gateway=True)}  # env.name -> its needs, for the names played through the gateway


def env_needs(name: str | None) -> EnvNeeds:
    """What `env.name` declares: a gateway name's, a registered entry's, or the default (custom, unknown, None)."""
    if name in GATEWAY_ENVS:
        return GATEWAY_ENVS[name]
    return ENVIRONMENTS.needs(name) if name in ENVIRONMENTS else EnvNeeds()


def plays_through_gateway(name: str | None) -> bool:
    """Whether `env.name` is played by the user's program through the gateway (env=harness), not by an env object."""
    return env_needs(name).gateway
