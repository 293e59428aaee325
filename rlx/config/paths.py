"""Where the configs, recipes and built-in model assets live.

`conf/` and `recipes/` sit at the repository root (the project's layout); the wheel carries them inside the
package as `rlx/conf` and `rlx/recipes` (pyproject.toml maps them at build time), so an installed rlx finds them
through the package and a source checkout (editable install) finds them at the root.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
# The source checkout (README, .git) when rlx runs from one; None for an installed package.
REPO_DIR = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "pyproject.toml").is_file() else None


def _data_dir(name: str) -> Path:
    inside = PACKAGE_DIR / name  # a built wheel
    if inside.is_dir() or REPO_DIR is None:
        return inside
    return REPO_DIR / name  # a source checkout


CONF_DIR = _data_dir("conf")
RECIPES_DIR = _data_dir("recipes")
ASSETS_DIR = PACKAGE_DIR / "models" / "assets"


def group_options(group: str) -> list[str]:
    """Option names of a config group (yaml files in conf/<group>/)."""
    folder = CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def config_groups() -> list[str]:
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def cache_dir() -> Path:
    """rlx's own cache (converted GGUF models, packaged model files): RLX_CACHE, else $XDG_CACHE_HOME/rlx,
    else ~/.cache/rlx. Read at each call, so a test or a user can point it elsewhere with the variable."""
    if os.environ.get("RLX_CACHE"):
        return Path(os.environ["RLX_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "rlx"
