"""rlx's version, in a leaf module: `rlx --version` and the package build (pyproject.toml's dynamic version) read
it without importing anything else of rlx."""

__version__ = "0.1.0"
