"""Free-form config groups: keys whose children the user names (an environment's keyword arguments, reward
components, a reasoning-gym task's options), written on the command line the way the README writes them.

    rlx train env=custom env.target=my_env.MyEnv 'env.kwargs={env_id:FrozenLake-v1}'
    rlx train reward.components.mine._target_=my_rewards.mine reward.components.mine.weight=0.5
    rlx train data=reasoning_gym data.task=gcd 'data.task_config={max_value:100}'

Hydra composes a struct config, so a plain `key=value` cannot add a key that the YAML does not already have
(`env.kwargs: {}` has none), and only the `+key=value` form worked. Here such an override is handed to Hydra as
`++key=value` (add or override, merging a dict into the one the YAML gives), but only when the free-form node
exists in the config being composed: `env.kwargs=...` with no `env` selected stays an unknown key.
"""

from __future__ import annotations

# dotted keys whose children are the user's own names (schema type `dict`, rlx/config/schema.py)
FREE_FORM = ("env.kwargs", "reward.components", "data.task_config")


def _free_form_root(key: str) -> str | None:
    for root in FREE_FORM:
        if key == root or key.startswith(root + "."):
            return root
    return None


def _needs_plus(override: str) -> bool:
    if override.startswith(("+", "~", "-")) or "=" not in override:
        return False
    return _free_form_root(override.split("=", 1)[0]) is not None


def free_form_overrides(overrides: list[str], config_name: str = "train") -> list[str]:
    """`overrides` with every plain override under a FREE_FORM key present in the composed config turned into
    `++key=value`; every other argument (flags, `+`/`~` overrides, other keys) is returned unchanged and in order."""
    plain = [o for o in overrides if _needs_plus(o)]
    if not plain:
        return list(overrides)
    present = _present_roots([o for o in overrides if "=" in o and not o.startswith("-") and o not in plain],
                             config_name)
    if not present:
        return list(overrides)
    return [f"++{o}" if o in plain and _free_form_root(o.split("=", 1)[0]) in present else o for o in overrides]


def _present_roots(others: list[str], config_name: str) -> set[str]:
    """The FREE_FORM keys that exist (a dict or null) in the config composed with the other overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig

    from rlx.config.paths import CONF_DIR
    from rlx.config.sweep_values import first_values

    single, _ = first_values([o for o in others if not o.startswith(("hydra.", "hydra/"))])
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=single)
    except Exception:  # the other overrides are wrong: check_overrides names the mistake
        return set()
    finally:
        GlobalHydra.instance().clear()
    present = set()
    for root in FREE_FORM:
        parent_key, _, leaf = root.rpartition(".")
        parent = cfg.get(parent_key) if isinstance(cfg, DictConfig) else None
        if isinstance(parent, DictConfig) and leaf in parent:
            present.add(root)
    return present
