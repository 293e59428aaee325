"""`rlx` command line: a thin dispatcher onto Hydra apps.

    rlx train [RECIPE] [overrides...]     RL / preference / SFT training (Hydra: -m, --cfg job, --help)

Each subcommand with a config is an `@hydra.main` function, so Hydra's own flags keep working; this
module only picks the subcommand, turns a bare recipe name into `recipes=NAME`, and checks overrides
first so that mistakes give one line and exit code 2.
"""

from __future__ import annotations

import os
import sys

from rlx.config import CONF_DIR, RECIPES_DIR, check_overrides, fail

USAGE = """usage: rlx <command> [args...]

commands:
  train [RECIPE] [key=value ...]   train a model (RL, preference optimization, SFT); --help lists config groups

Run `rlx <command> --help` for a command's options. Configs live in conf/, recipes in recipes/."""

# Hydra flags that must reach Hydra untouched (no pre-composition).
_PASSTHROUGH_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version"}


def _split_recipe(args: list[str]) -> list[str]:
    """`rlx train dapo_tiny a=b` -> `recipes=dapo_tiny a=b`."""
    if args and not args[0].startswith("-") and "=" not in args[0]:
        name = args[0]
        valid = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
        if name not in valid:
            fail(f"unknown recipe '{name}'; valid choices: {', '.join(valid)}")
        return [f"recipes={name}"] + args[1:]
    return args


def _hydra_app(app, prog: str, args: list[str], config_name: str) -> None:
    flags = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    if not flags & _PASSTHROUGH_FLAGS:
        overrides = [a for a in args if not a.startswith("-") and "=" in a]
        check_overrides(overrides, config_name=config_name)
    sys.argv = [prog] + args
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    app()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    command, args = argv[0], argv[1:]
    if command == "train":
        from rlx.launch import resolve_resume
        from rlx.train import train_app

        _hydra_app(train_app, "rlx-train", resolve_resume(_split_recipe(args)), "train")
    else:
        fail(f"unknown command '{command}'; valid commands: train (see `rlx --help`)")


__all__ = ["main", "CONF_DIR"]
