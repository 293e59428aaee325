"""Where the configs live, and checks that turn user mistakes into one-line errors (exit code 2).

Hydra composes the config; before handing the command line to `@hydra.main`, `check_overrides`
composes it once itself so that a mistyped group option (`algorithm=grpoo`) or key (`optim.lrr=1`)
becomes `error: ...` naming the valid choices or the nearest key, instead of Hydra's traceback hint. It then
imports the config's `plugins` (rlx/config/plugins.py), so that every later check knows the names they register.
"""

from __future__ import annotations

import difflib

from omegaconf import DictConfig, OmegaConf

from rlx.config.paths import CONF_DIR, config_groups, group_options
from rlx.config.plugins import import_plugins
from rlx.errors import UserError, fail


def _nearest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _flat_keys(cfg, prefix: str = "") -> list[str]:
    keys = []
    if isinstance(cfg, DictConfig):
        for key in cfg.keys():
            full = f"{prefix}{key}"
            keys.append(full)
            child = cfg._get_node(key)
            if isinstance(child, DictConfig):
                keys.extend(_flat_keys(child, full + "."))
    return keys


def _first_values(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Parse overrides; return a list with each sweep replaced by its first value, and the group choices."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # hydra's OverrideParseException carries a long message
        fail(f"cannot parse overrides: {str(exc).splitlines()[0]}")
    single, choices = [], {}
    for override, text in zip(parsed, overrides):
        key = override.key_or_group
        if override.is_sweep_override():
            values = [str(v) for v in override.sweep_string_iterator()]
            if not values:
                single.append(text)
                continue
            prefix = text.split("=", 1)[0]
            single.append(f"{prefix}={values[0]}")
        else:
            value = override.value()
            if isinstance(value, list):  # a list of group options: benchmark=[chain_sum,gsm8k]
                values = [str(v) for v in value]
            else:
                values = [override.get_value_element_as_str()] if value is not None else []
            single.append(text)
        if override.is_delete():
            continue
        choices[key] = values
    return single, choices


def check_overrides(overrides: list[str], config_name: str = "train") -> DictConfig:
    """Compose the config with these overrides; exit 2 with a one-line message on a user mistake."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [o for o in overrides if not o.startswith("hydra.") and not o.startswith("hydra/")]
    single, choices = _first_values(overrides)
    groups = config_groups()
    for key, values in choices.items():
        group = key.lstrip("+~")
        if group in groups:
            valid = group_options(group)
            for value in values:
                if value not in valid and value != "null":
                    fail(f"unknown {group} '{value}'{_nearest(value, valid)}; valid choices: {', '.join(valid)}")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=single)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        missing_key = _missing_key(message)
        if missing_key is not None:
            from rlx.config.peer_names import peer_pointer
            from rlx.config.schema import family_knob_message

            family_knob = family_knob_message(missing_key)  # a knob of another algorithm family / rollout backend
            if family_knob is not None:
                fail(family_knob)
            pointer = peer_pointer(missing_key)
            if pointer is not None:
                fail(pointer)
            try:
                with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                    base = compose(config_name=config_name, overrides=[o for o in single if not o.startswith(missing_key)])
                known = _flat_keys(base)
            except Exception:
                known = []
            command = {"eval": "eval", "data_prefs": "data prefs"}.get(config_name, "train")
            fail(f"unknown key '{missing_key}'{_nearest(missing_key, known)}; `rlx {command} --help` shows every key "
                 f"with its comment")
        fail(message)
    finally:
        GlobalHydra.instance().clear()
    try:  # the user's modules first: what they register is valid in every check that follows
        import_plugins(cfg.get("plugins") if "plugins" in cfg else None)
    except UserError as exc:
        fail(str(exc))
    return cfg


def _missing_key(message: str) -> str | None:
    # Hydra: "Could not override 'optim.lrr'." / "Could not append to config. An item is already at 'x'."
    marker = "Could not override '"
    if marker in message:
        return message.split(marker, 1)[1].split("'", 1)[0]
    return None


def as_plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
