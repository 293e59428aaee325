"""The composed config as the schema's dataclasses, instantiated: what the builder and the loops receive.

`checked_settings(cfg)` is the door every command goes through: the composed config's knobs checked against the
schema (check_config: types, ranges, names, keys of the chosen option), then the typed settings made of it; the
cross-field rules (rlx/config/rules.py) and everything after them read only those. `settings(cfg)` turns the
checked DictConfig of `rlx train` into a `TrainConfig` (rlx/config/schema.py) whose
sections are the group dataclasses (the algorithm section the family's own: PolicyGradient, Agent, PPO, ...; the
rollout section the backend's), interpolations resolved. Loops then read typed attributes (`settings.algorithm.
clip_low`), never a `cfg`; a knob a schema does not declare is not there to read. Values keep their YAML form
(a name stays a str), so code compares them with plain strings.
"""

from __future__ import annotations

import dataclasses
import types
import typing

from omegaconf import DictConfig, OmegaConf

from rlx.config.schema import DISPATCH, SCHEMAS, check_config, schema_fields


def checked_settings(cfg: DictConfig, config_name: str = "train"):
    """The composed config's knobs checked (one line and exit 2 on the first bad one, plugins imported first), then
    its typed settings: what the rules, the builder and the loops read."""
    check_config(cfg, config_name)
    return settings(cfg, config_name)


def settings(cfg: DictConfig, config_name: str = "train"):
    """The whole config as its schema's dataclass instance (interpolations resolved)."""
    return build(SCHEMAS[config_name], OmegaConf.to_container(cfg, resolve=True))


def build(schema: type, node: dict):
    """One section: `schema` (dispatched on algorithm.family / rollout.backend), nested sections built in turn; a
    key the config lacks is None."""
    if schema in DISPATCH:
        key, table = DISPATCH[schema]
        schema = table.get(node.get(key), schema)
    values = {}
    for name, (kind, _meta) in schema_fields(schema).items():
        value = node.get(name)
        nested = _dataclass_of(kind)
        values[name] = build(nested, value) if nested is not None and isinstance(value, dict) else value
    return schema(**values)


def _dataclass_of(kind) -> type | None:
    """The dataclass in `X`, `X | None` or `Optional[X]`, else None."""
    if dataclasses.is_dataclass(kind):
        return kind
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        found = [k for k in typing.get_args(kind) if dataclasses.is_dataclass(k)]
        return found[0] if found else None
    return None
