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
from rlx.config.sweep_values import first_values
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


def check_overrides(overrides: list[str], config_name: str = "train") -> DictConfig:
    """Compose the config with these overrides; exit 2 with a one-line message on a user mistake."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlx.config.free_form import free_form_overrides

    overrides = [o for o in overrides if not o.startswith("hydra.") and not o.startswith("hydra/")]
    overrides = free_form_overrides(overrides, config_name)  # env.kwargs={...} as the README writes it
    single, choices = first_values(overrides)
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
            if peer_pointer(missing_key) is not None:  # every TRL/verl name of the command at once
                fail(_all_peer_pointers(single, config_name))
            try:
                with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                    base = compose(config_name=config_name,
                                   overrides=[o for o in single if not o.lstrip("+~").startswith(missing_key)])
            except Exception:
                base = None
            command = {"eval": "eval", "data_prefs": "data prefs"}.get(config_name, "train")
            fail(unknown_key_message(missing_key, _struct_key(exc), base, command))
        fail(message)
    finally:
        GlobalHydra.instance().clear()
    try:  # the user's modules first: what they register is valid in every check that follows
        import_plugins(cfg.get("plugins") if "plugins" in cfg else None)
    except UserError as exc:
        fail(str(exc))
    return cfg


def composed_choices(overrides: list[str], config_name: str = "train") -> dict:
    """The option each config group ended with (Hydra's runtime.choices: {"model": "smollm2-135m-instruct", ...})
    for overrides that `check_overrides` accepted; what a Hydra front reads from HydraConfig, for callers that
    compose without one (rlx.evaluate)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlx.config.free_form import free_form_overrides

    overrides = [o for o in overrides if not o.startswith("hydra.") and not o.startswith("hydra/")]
    single, _ = first_values(free_form_overrides(overrides, config_name))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=single, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    return dict(OmegaConf.to_container(cfg.hydra.runtime.choices))


def _all_peer_pointers(single: list[str], config_name: str) -> str:
    """One line naming the rlx setting of every override that is a TRL/verl name and not an rlx key of the
    config composed without them (`algorithm.beta` of algorithm=dpo is rlx's own)."""
    from hydra import compose, initialize_config_dir

    from rlx.config.peer_names import peer_pointer, peer_pointers

    keys = [o.split("=", 1)[0] for o in single]
    peers = [k for k in keys if peer_pointer(k) is not None]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            base = compose(config_name=config_name, overrides=[o for o, k in zip(single, keys) if k not in peers])
        known = set(_flat_keys(base))
    except Exception:
        known = set()
    return peer_pointers([k for k in peers if k.lstrip("+~") not in known])


def _struct_key(exc: Exception) -> str | None:
    """The full key OmegaConf refused (`optim.lrr` for `optim={lrr:1}`), from the cause Hydra wraps."""
    cause = exc.__cause__
    key = getattr(cause, "full_key", None)
    return str(key) if key else None


def unknown_key_message(key: str, refused: str | None, base, command: str) -> str:
    """One line for an override of a key the config does not have. `refused`: the deeper key OmegaConf named
    (a dict value's unknown child); `base`: the config composed without the override (None if it failed).
    The suggestion is never the refused key itself."""
    from rlx.config.paths import config_groups, group_options

    deeper = refused if refused and refused.startswith(key + ".") else None
    if deeper is not None:
        key = deeper
    if base is not None:
        for group in config_groups():  # a key of a group nothing selected: env.kwargs with env=null
            if key.startswith(group + ".") and base.get(group) is None:
                return (f"unknown key '{key}': no {group} is selected, so it has no keys; pick one first "
                        f"({group}={' | '.join(group_options(group))})")
    known = [k for k in (_flat_keys(base) if base is not None else []) if k != key]
    hint = _nearest(key, known)
    return f"unknown key '{key}'{hint}; `rlx {command} --help` shows every key with its comment"


def _missing_key(message: str) -> str | None:
    # Hydra: "Could not override 'optim.lrr'." / "Could not append to config. An item is already at 'x'."
    marker = "Could not override '"
    if marker in message:
        return message.split(marker, 1)[1].split("'", 1)[0]
    return None
