"""The environments `env.name` can name: `@ENVIRONMENTS.register("name")` on a class (or a callable returning an
environment) with reset/step in the gymnasium shape (rlx/envs/__init__.py). The built-ins register in
builtin.py, tools.py and mixture.py, which rlx/envs/__init__.py imports in that order; a plugin registers its
own with `@rlx.register("env", "name")` and runs with `env=custom env.name=name` (docs/extending/plugins.md).
`env=custom env.target=my_module.MyEnv` needs no registration."""

from __future__ import annotations

from rlx.registry import Registry, publish

ENVIRONMENTS = publish("env", Registry("env"))
CUSTOM = "custom"  # env.name that loads env.target instead of a registered environment
