"""Typed schemas of every config, declared once: each knob's type and valid range or choices, and the check.

One dataclass per group (rlx/config/groups.py; the algorithm group: one per family, rlx/config/families.py;
rollout: one per backend) and per primary config (here: `rlx train`, `rlx eval`, `rlx data prefs`). A field's
type says what a knob holds: int, float, bool, str, a choice (rlx/config/fields.py: an Enum for a fixed set of
names, a registry's names read when the config is checked, e.g. algorithm.advantage from
rlx.algorithms.advantages, so an entry a plugin registers is valid), a nested dataclass for a sub-group,
`X | None` when null is valid (off / derived), `dict` for free-form keyword arguments. `num(...)` metadata
carries the range.

The schemas declare types only: YAML (conf/) stays the single source of defaults and their comments,
so no field has a default here. `check_config(cfg)` imports the config's `plugins` first (their registrations
count), then walks the composed config against the schemas before a model or data is loaded and stops at the
first problem with one line (UserError, exit code 2): a bad value (`optim.lr=0 is not valid: it must be a
number > 0`), an unknown name (`unknown optim.schedule 'cosin'; valid choices: ...`), or a key the chosen
option does not have (`algorithm.vf_coef is a ppo knob ...`). A new knob is one YAML line with its comment
plus one field in its group's dataclass; tests/test_config_schema.py fails when a shipped YAML key has no field
or a field no YAML key. Cross-field rules (a batch that must split evenly, settings that need each other) live
in rlx/config/rules.py.

Why a walk of rlx's own rather than `OmegaConf.structured` merged under Hydra's ConfigStore: a structured
config needs a default (or MISSING) per field, which would copy YAML's defaults here; its errors are
multi-line and worded by OmegaConf; and the algorithm group's schema depends on `algorithm.family`, which a
merge cannot pick. The dataclasses are still plain typed declarations that OmegaConf could read.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Literal

from omegaconf import DictConfig, ListConfig

from rlx.algorithms.mixture import MIXING_RULES
from rlx.config.eval_groups import BENCHMARKS, Benchmark, EvalMetrics, Sampling
from rlx.config.families import ALGORITHMS, Algorithm
from rlx.config.fields import fraction, names_of, num, positive, registry_names
from rlx.config.groups import (
    ENVS,
    ROLLOUTS,
    Checkpoint,
    Data,
    Env,
    Eval,
    Hardware,
    Log,
    Logger,
    Model,
    Optim,
    Progress,
    Reward,
    Rollout,
    Save,
)
from rlx.config.plugins import import_plugins
from rlx.errors import UserError


@dataclass
class Expected:
    """expected: a recipe's reproduced figure, read by `make reproduce` (scripts/reproduce.py)."""

    metric: str = field()
    value: float | None = field()  # null: not yet measured (`rlx recipes reproduce` reports "not yet expected")
    tolerance: float = num(0)


MixingRule = registry_names("MixingRule", lambda: ("none", *MIXING_RULES))  # mixture.rule


@dataclass
class Mixture:
    """mixture: per-objective loss weights of a run on several objectives (rlx/algorithms/mixture.py)."""

    rule: MixingRule = field()
    key: str = field()
    weights: dict | None = field()
    window: int = num(2)
    temperature: float = positive()
    floor: float = fraction()


@dataclass
class TrainConfig:
    """`rlx train` (conf/train.yaml)."""

    name: str = field()
    seed: int = num(0, 2**32 - 1)
    steps: int = num(1)
    prompts_per_step: int = num(1)
    micro_batch_size: int = num(1)
    micro_batch_tokens: int | None = num(1)
    micro_batch_split: Literal["rows", "lengths"] = field()
    micro_batch_overhead: int | None = num(0)
    packed_forward: bool = field()
    optimized_metric: str = field()
    optim: Optim = field()
    eval: Eval = field()
    log: Log = field()
    save: Save = field()
    checkpoint: Checkpoint = field()
    resume: str | None = field()
    mixture: Mixture = field()
    model: Model = field()
    algorithm: Algorithm = field()
    reward: Reward = field()
    data: Data = field()
    rollout: Rollout = field()
    env: Env | None = field()
    hardware: Hardware = field()
    logger: Logger = field()
    plugins: list[str] = field()  # modules imported before the check (their registrations count)
    expected: Expected | None = field()  # recipes only


@dataclass
class EvalConfig:
    """`rlx eval` (conf/eval.yaml)."""

    name: str = field()
    run: str | None = field()
    checkpoint: str = field()
    compare: str | None = field()
    resume: str | None = field()
    seed: int = num(0, 2**32 - 1)
    limit: int | None = num(1)
    subset: int | None = num(1)
    subset_seed: int = num(0, 2**32 - 1)
    scoring_tokens: int = num(1)
    suite: str | None = field()
    sampling: Sampling = field()
    metrics: EvalMetrics = field()
    progress: Progress = field()
    plot: bool = field()
    model: Model = field()
    benchmark: dict[str, Benchmark] = field()
    benchmark_files: list[str] = field()  # benchmark YAML files outside the package (rlx/evaluation/run_task.py)
    env: Env | None = field()
    rollout: Rollout = field()
    hardware: Hardware = field()
    plugins: list[str] = field()


@dataclass
class DataPrefsConfig:
    """`rlx data prefs` (conf/data_prefs.yaml)."""

    out: str = field()
    prompts: int = num(1)
    samples_per_prompt: int = num(2)
    pairs_per_prompt: int = num(1)
    seed: int = num(0, 2**32 - 1)
    progress: Progress = field()
    model: Model = field()
    data: Data = field()
    reward: Reward = field()
    rollout: Rollout = field()
    hardware: Hardware = field()
    plugins: list[str] = field()


# primary config name -> its schema, and the command that composes it
SCHEMAS = {"train": TrainConfig, "eval": EvalConfig, "data_prefs": DataPrefsConfig}
COMMANDS = {"train": "rlx train", "eval": "rlx eval", "data_prefs": "rlx data prefs"}
# a group whose schema depends on one of its keys: base schema -> (key, {value: schema})
DISPATCH = {Algorithm: ("family", ALGORITHMS), Rollout: ("backend", ROLLOUTS), Env: ("name", ENVS),
            Benchmark: ("kind", BENCHMARKS)}
# the `group=option` that selects a dispatched schema
_GROUP_OPTION = {Algorithm: "algorithm", Rollout: "rollout", Env: "env", Benchmark: "benchmark.NAME.kind"}


# ------------------------------------------------------------------------------------------------
# the check
# ------------------------------------------------------------------------------------------------


def check_config(cfg: DictConfig, config_name: str = "train") -> None:
    """Raise UserError naming the first knob whose value has the wrong type, lies out of range, or that
    the chosen option does not have. Keys whose value is still missing (`???`) are left to the reader
    that needs them (it names the knob). Values given directly are checked before those interpolated from
    another knob (`eval.max_new_tokens: ${rollout.max_new_tokens}`), so a bad value is named where it is set.
    The config's `plugins` are imported first: the names they register are valid choices here."""
    import_plugins(cfg.get("plugins") if "plugins" in cfg else None)
    for derived in (False, True):
        _check_section(cfg, SCHEMAS[config_name], "", config_name, derived)


def tuning_keys() -> frozenset[str]:
    """Top-level keys the model presets' tuning files set (conf/tuning/**.yaml, `@package _global_`)."""
    from omegaconf import OmegaConf

    from rlx.config.paths import CONF_DIR

    keys: set[str] = set()
    for path in sorted((CONF_DIR / "tuning").rglob("*.yaml")):
        keys |= {str(key) for key in OmegaConf.load(path).keys() if key != "defaults"}
    return frozenset(keys)


def drop_train_tuning(cfg: DictConfig, config_name: str) -> None:
    """Leaves out the top-level keys a model preset's tuning brought into a config that has no such knob. The
    tuning is written for `rlx train`; `rlx data prefs model=smollm2-135m-instruct` composes it too, for its
    sampling, reward and per-task settings, but has no run length (steps, prompts_per_step, eval)."""
    from omegaconf import open_dict

    known = schema_fields(SCHEMAS[config_name])
    extra = [str(key) for key in cfg.keys() if str(key) not in known and str(key) != "hydra"
             and str(key) in tuning_keys()]
    with open_dict(cfg):
        for key in extra:
            cfg.pop(key)


def apply_benchmark_tuning(cfg: DictConfig, model_choice: str | None) -> list[str]:
    """Merges a model preset's per-benchmark tuning (conf/tuning/<model>/benchmark_<name>.yaml, `@package
    _global_`) into `rlx eval`'s config for each benchmark it evaluates: `rlx eval model=smollm2-135m-instruct`
    then asks and scores chain_sum the way `rlx train model=smollm2-135m-instruct` trains on it. Hydra cannot
    pick these files itself (benchmark= may be a list). Returns the files merged."""
    from omegaconf import OmegaConf, open_dict

    from rlx.config.paths import CONF_DIR

    if not model_choice or not cfg.get("benchmark"):
        return []
    merged = []
    for name in list(cfg.benchmark.keys()):
        path = CONF_DIR / "tuning" / str(model_choice) / f"benchmark_{name}.yaml"
        if path.is_file():
            tuning = OmegaConf.load(path)
            with open_dict(cfg):
                cfg.benchmark[name] = OmegaConf.merge(cfg.benchmark[name], tuning.benchmark[name])
            merged.append(str(path.relative_to(CONF_DIR)))
    return merged


@functools.cache
def schema_fields(schema: type) -> dict[str, tuple[object, dict]]:
    """{field name: (type, range metadata)} of a schema dataclass (annotations resolved)."""
    hints = typing.get_type_hints(schema)
    return {f.name: (hints[f.name], dict(f.metadata)) for f in dataclasses.fields(schema)}


def dispatched(schema: type, node: DictConfig, prefix: str) -> type:
    """The schema of a group that depends on one of its keys (algorithm.family, rollout.backend)."""
    if schema not in DISPATCH:
        return schema
    key, table = DISPATCH[schema]
    value = node.get(key) if key in node else None
    if value is None and schema in table.values():  # a benchmark without `kind` generates
        return schema
    if value not in table:
        raise UserError(f"unknown {prefix}{key} '{_shown(value)}'{_nearest(str(value), list(table))}; "
                        f"valid choices: {', '.join(table)}")
    return table[value]


def _check_section(node: DictConfig, schema: type, prefix: str, config_name: str, derived: bool = False) -> None:
    """derived=False: keys and the values set directly; derived=True: the interpolated values."""
    schema = dispatched(schema, node, prefix)
    known = schema_fields(schema)
    for key in node.keys():
        if not prefix and key == "hydra":
            continue
        if str(key) not in known:
            raise UserError(unknown_key_message(prefix + str(key), node, schema, config_name))
    for key, value in _present(node):
        if prefix or key != "hydra":
            kind, meta = known[key]
            if isinstance(value, DictConfig) or node._get_node(key)._is_interpolation() == derived:
                _check_value(prefix + key, value, kind, meta, config_name, derived)


def _present(node: DictConfig):
    """(key, resolved value) of a section's keys, leaving out missing values (`???`) and interpolations
    that do not resolve here: the reader that needs them names them."""
    for key in node.keys():
        child = node._get_node(key)
        if child is None or child._is_missing():
            continue
        try:
            value = node[key]
        except Exception:
            continue
        yield str(key), value


def _check_value(name: str, value, kind, meta: dict, config_name: str, derived: bool = False) -> None:
    nullable, kinds = _unpack(kind)
    if value is None:
        if not nullable:
            raise UserError(f"{name}=null is not valid: it must be {_describe(kinds, meta)}")
        return
    mappings = [typing.get_args(k)[1] for k in kinds if typing.get_origin(k) is dict
                and dataclasses.is_dataclass(typing.get_args(k)[1])]
    if mappings and isinstance(value, DictConfig):  # benchmark.<name>: one section per entry
        for key, entry in _present(value):
            _check_value(f"{name}.{key}", entry, mappings[0], {}, config_name, derived)
        return
    sections = [k for k in kinds if dataclasses.is_dataclass(k)]
    if sections:
        if not isinstance(value, DictConfig):
            raise UserError(f"{name}={_shown(value)} is not valid: it must be a group of settings ({name}.KEY=VALUE)")
        _check_section(value, sections[0], name + ".", config_name, derived)
        return
    if any(_fits(value, k, meta) for k in kinds):
        return
    named_lists = [names_of(typing.get_args(k)[0]) for k in kinds if typing.get_origin(k) is list
                   and names_of(typing.get_args(k)[0]) is not None]
    if named_lists and isinstance(value, ListConfig):  # a list of registry names: name the entry that is not one
        valid = named_lists[0]
        bad = next((v for v in value if v not in valid), None)
        if bad is not None:
            raise UserError(f"unknown {name} entry '{_shown(bad)}'{_nearest(str(bad), valid)}; valid choices: "
                            f"{', '.join(valid)}")
    named = [names_of(k) for k in kinds if names_of(k) is not None]  # a fixed set or a registry's live names
    literals = [a for k in kinds if typing.get_origin(k) is Literal for a in typing.get_args(k)]
    if (named or literals) and len(kinds) == 1:
        valid = [n for names in named for n in names] + literals
        shown = [_shown(v) for v in valid] + (["null"] if nullable else [])
        raise UserError(f"unknown {name} '{_shown(value)}'; valid choices: {', '.join(shown)}")
    raise UserError(f"{name}={_shown(value)} is not valid: it must be {_describe(kinds, meta)}"
                    + (" (or null)" if nullable else ""))


def _unpack(kind) -> tuple[bool, list]:
    """(null allowed, the non-null member types) of `X | Y | None`."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        return type(None) in args, [a for a in args if a is not type(None)]
    return False, [kind]


def _fits(value, kind, meta: dict) -> bool:
    origin = typing.get_origin(kind)
    if kind is dict or origin is dict:
        return isinstance(value, DictConfig)
    if kind is list or origin is list:
        if not isinstance(value, ListConfig):
            return False
        item = typing.get_args(kind)[0] if origin is list else object
        if meta.get("length") is not None and len(value) != meta["length"]:
            return False
        return all(item is object or _fits(v, item, meta) for v in value)
    if origin is Literal:
        return any(value is a or (not isinstance(a, bool) and value == a) for a in typing.get_args(kind))
    if names_of(kind) is not None:
        return isinstance(value, str) and value in names_of(kind)
    if kind is bool:
        return isinstance(value, bool)
    if kind is str:  # a name or path; numbers are kept as given (a subset called 2020)
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if kind is int and not (isinstance(value, int) or value.is_integer()):
            return False
        return _in_range(value, meta)
    raise TypeError(f"rlx.config.schema has no check for the type {kind!r}")


def _in_range(value: float, meta: dict) -> bool:
    low, high = meta.get("low"), meta.get("high")
    if low is not None and (value < low or (meta.get("low_open") and value == low)):
        return False
    return high is None or not (value > high or (meta.get("high_open") and value == high))


def _describe(kinds: list, meta: dict) -> str:
    texts = []
    for kind in kinds:
        origin = typing.get_origin(kind)
        if kind is bool:
            texts.append("true or false")
        elif kind is str:
            texts.append("a string")
        elif kind is dict or origin is dict:
            texts.append("a group of settings")
        elif kind is list or origin is list:
            item = typing.get_args(kind)[0] if origin is list else None
            what = {int: "integers", float: "numbers", str: "strings"}.get(item)
            count = {2: "two"}.get(meta.get("length"), meta.get("length"))
            texts.append(f"{count} {what}{_range_text(meta)}" if count and what else
                         f"a list of {what}{_range_text(meta)}" if what else "a list")
        elif names_of(kind) is not None:
            texts.append("one of " + ", ".join(names_of(kind)))
        elif origin is Literal:
            texts.append("one of " + ", ".join(_shown(a) for a in typing.get_args(kind)))
        elif kind in (int, float):
            texts.append(("an integer" if kind is int else "a number") + _range_text(meta))
    return " or ".join(texts)


def _range_text(meta: dict) -> str:
    low, high = meta.get("low"), meta.get("high")
    if low is not None and high is not None:
        return (f" in {'(' if meta.get('low_open') else '['}{_num(low)}, {_num(high)}"
                f"{')' if meta.get('high_open') else ']'}")
    if low is not None:
        return f" {'>' if meta.get('low_open') else '>='} {_num(low)}"
    if high is not None:
        return f" {'<' if meta.get('high_open') else '<='} {_num(high)}"
    return ""


def owners(group_schema: type, key: str) -> list[type]:
    """The schemas of a dispatched group (algorithm families, rollout backends) that have `key`."""
    _, table = DISPATCH[group_schema]
    return [schema for schema in dict.fromkeys(table.values()) if key in schema_fields(schema)]


def unknown_key_message(name: str, node, schema: type, config_name: str = "train") -> str:
    """One line for a key the composed config should not have: the family (or backend) that has it, or
    the nearest known key."""
    key = name.rsplit(".", 1)[-1]
    base = next((b for b in DISPATCH if issubclass(schema, b)), None)
    if base is not None:
        having = owners(base, key)
        if having:
            group = _GROUP_OPTION[base]
            names = [k for k, v in DISPATCH[base][1].items() if v in having]
            options = [getattr(s, "PRESET", "") or k for k, s in DISPATCH[base][1].items() if s in having]
            chosen = (f", not a knob of {group}={node.get('name') or node.get(DISPATCH[base][0])}"
                      if isinstance(node, DictConfig) else "")
            options = list(dict.fromkeys(options))
            listed = options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
            return f"{name} is a {' / '.join(names)} knob{chosen}; use {group}={listed} (or leave {name} out)"
    siblings = [name[: -len(key)] + k for k in schema_fields(schema)]
    command = COMMANDS.get(config_name, config_name)
    return f"unknown key '{name}'{_nearest(name, siblings)}; `{command} --help` shows every key with its comment"


def family_knob_message(name: str) -> str | None:
    """For `algorithm.KEY` / `rollout.KEY` (or a knob under it, `algorithm.replay.enabled`) missing from the chosen
    option: the line naming who has KEY."""
    group, _, key = name.partition(".")
    key = key.partition(".")[0]
    base = {"algorithm": Algorithm, "rollout": Rollout, "env": Env}.get(group)
    if base is None or not key or not owners(base, key):
        return None
    return unknown_key_message(f"{group}.{key}", None, base)


def _nearest(word: str, choices_: list[str]) -> str:
    close = difflib.get_close_matches(word, choices_, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, ListConfig):
        return str(list(value))
    return str(value)
