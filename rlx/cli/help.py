"""`rlx train --help` (and eval, data prefs): the config files themselves, comments included.

The YAML comments are rlx's documentation of every knob, and Hydra's own `--help` prints the composed
config without them (and imports the whole training stack first, seconds of torch import). This
reads the files directly: the command's primary config, then the option file of each group the command
composes (the defaults, or the option chosen on the command line: `rlx train algorithm=dpo --help`),
and lists the other options of each of those groups. Groups the command does not compose are left out.
"""

from __future__ import annotations

import yaml

from rlx.config.paths import CONF_DIR, group_options

# `rlx <command>` -> (primary config, help header file under conf/hydra/help/)
COMMAND_CONFIGS = {"train": ("train", "rlx"), "eval": ("eval", "rlx_eval"), "data prefs": ("data_prefs", None)}
OPTIONAL_GROUPS = {"recipes", "sweep"}  # `null` by default: listed, their files not printed


def defaults_of(config_name: str) -> dict[str, str | None]:
    """{group: default option} from a primary config's defaults list (Hydra's own groups left out)."""
    config = yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text())
    groups = {}
    for entry in config.get("defaults", []):
        if isinstance(entry, dict):
            (key, value), = entry.items()
            if not key.startswith(("override ", "hydra/", "optional ")):  # optional: the tuning slots, shown apart
                groups[key] = value
    return groups


def _chosen(overrides: list[str]) -> dict[str, str]:
    chosen = {}
    for text in overrides:
        key, sep, value = text.partition("=")
        if sep and "." not in key and "," not in value and not value.startswith("["):
            chosen[key.lstrip("+~")] = value
    return chosen


def _option_chain(group: str, option: str) -> list[str]:
    """The option and the options it extends (`defaults: [grpo, _self_]` in dapo.yaml; a part included where it
    stands, `parts/single_turn@_here_` in grpo.yaml), base first."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.is_file():
        return []
    bases = [d.partition("@")[0] for d in (yaml.safe_load(path.read_text()) or {}).get("defaults", [])
             if isinstance(d, str) and d != "_self_"]
    return [name for base in bases for name in _option_chain(group, base)] + [option]


def config_help(command: str, overrides: list[str] = ()) -> str:
    config_name, help_name = COMMAND_CONFIGS[command]
    parts = []
    if help_name is not None:
        header = yaml.safe_load((CONF_DIR / "hydra" / "help" / f"{help_name}.yaml").read_text())
        parts.append(header["header"].rstrip())
    else:
        parts.append(f"rlx {command} [key=value ...]")
    groups = defaults_of(config_name)
    groups.update({k: v for k, v in _chosen(overrides).items() if k in groups})
    lines = ["== Config groups (group=option; the file of each chosen option follows) =="]
    for group, option in groups.items():
        lines.append(f"{group}: {', '.join(group_options(group))}  [{option or 'none'}]")
    parts.append("\n".join(lines))
    parts.append(f"== conf/{config_name}.yaml ==\n" + (CONF_DIR / f"{config_name}.yaml").read_text().rstrip())
    for group, option in groups.items():
        if option in (None, "null") or group in OPTIONAL_GROUPS:
            continue
        for name in _option_chain(group, option):
            parts.append(f"== {group}={name} (conf/{group}/{name}.yaml; keys under {group}.) ==\n"
                         + (CONF_DIR / group / f"{name}.yaml").read_text().rstrip())
    model = groups.get("model")
    for tuning in ([CONF_DIR / "tuning" / f"{model}.yaml",
                    CONF_DIR / "tuning" / str(model) / f"{groups.get('data')}.yaml"]
                   if model and (CONF_DIR / "tuning").is_dir() else []):
        if tuning.is_file():  # what the model preset sets in other groups, merged after them (conf/tuning/)
            parts.append(f"== tuning of model={model} (conf/{tuning.relative_to(CONF_DIR)}; merged after the groups "
                         "above) ==\n"
                         + tuning.read_text().rstrip())
    if help_name is not None:
        parts.append(header["footer"].rstrip())
    return "\n\n".join(parts) + "\n"
