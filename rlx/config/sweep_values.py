"""The first value of each sweep in a command line's overrides (`optim.lr=1e-4,3e-4` -> `optim.lr=1e-4`), so a
config can be composed once to check a multirun's keys, and the group choices it names."""

from __future__ import annotations

from rlx.errors import fail


def first_values(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
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
