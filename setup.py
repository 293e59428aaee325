"""Packaging beyond pyproject.toml: conf/ and recipes/ live at the repository root and are mapped into the wheel
as the package data folders rlx/conf and rlx/recipes at build time (not copied in git). rlx.config.paths finds
them inside the installed package, or at the root of a source checkout (editable install). Data folders are
listed as namespace packages so that setuptools carries them without its "Package would be ignored" warning.

An editable install (`pip install -e .`, `make install`) maps nothing: mapped folders make setuptools install a
meta path finder, which ends with a warning that pip prints as a BuildBackendWarning; with the packages where
they are, it writes a plain .pth naming the checkout, and rlx reads conf/ and recipes/ at the root."""

import sys

from setuptools import find_namespace_packages, setup

code = find_namespace_packages(include=["rlx", "rlx.*", "hydra_plugins", "hydra_plugins.*"], exclude=["*.__pycache__"])
if "editable_wheel" in sys.argv:  # setuptools' build_editable hook runs `setup.py editable_wheel ...`
    setup(packages=code, package_dir={"": "."})
else:
    conf = ["rlx.conf"] + [f"rlx.conf.{name}" for name in find_namespace_packages(where="conf")]
    setup(
        packages=code + conf + ["rlx.recipes"],
        package_dir={"rlx.conf": "conf", "rlx.recipes": "recipes"},
        package_data={"": ["*.yaml", "*.json", "*.txt", "*.safetensors", "*.jsonl", "*.jinja", "*.model",
                          "*.html", "*.js", "*.css", "LICENSE"]},  # rlx/view/static: the page and its vendored uPlot
    )
