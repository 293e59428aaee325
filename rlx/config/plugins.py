"""`plugins: [my_pkg.estimators, my_verifiers]`: the user's modules, imported before a config is checked, so that
what they register (`@rlx.register("advantage", "my_mean")`, docs/extending/plugins.md) is a valid name there.

Imported by every path that checks a config: the command line front (rlx.config.overrides.check_overrides,
which `rlx train/eval/data prefs/sweep`, the Python API and each worker process of a multi-process run call
first) and rlx.config.schema.check_config. Importing twice is a no-op (Python's module cache). A module that
fails to import stops the command with one line naming the real cause and where it happened
(`No module named 'numpyy' (my_plugin.py, line 3)`). This module stays light (no torch): the front imports it.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path

from rlx.errors import UserError

_RLX_DIR = Path(__file__).resolve().parents[1]  # frames inside rlx are not where a plugin went wrong


def import_plugins(names) -> list[str]:
    """Import each module named in `names` (a list of dotted module names; None or empty: nothing).
    Returns the names imported. Raises UserError (one line) for a value that is not a list of names and for a
    module that cannot be imported or fails while importing."""
    if names is None:
        return []
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise UserError(f"plugins={names} is not valid: it must be a list of module names, e.g. plugins=[my_module]")
    names = list(names)
    for name in names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise UserError(f"plugins entry {name!r} is not a module name; give importable modules, e.g. "
                            f"plugins=[my_pkg.estimators]")
        _import(name)
    return names


def _import(name: str) -> None:
    if name in sys.modules:
        return
    _import_module(name, lambda cause: f"plugin '{name}' not found: {cause}; plugins= names importable modules (a "
                                       "file in the directory `rlx` runs in, on PYTHONPATH, or in an installed "
                                       "package)",
                   lambda cause: f"plugin '{name}' failed to import: {cause}")


def _import_module(module_name: str, not_found, failed):
    """importlib.import_module(module_name), or one line (UserError): `not_found(cause)` when the module itself
    does not exist, `failed(cause (file, line N))` when it exists but fails while it runs (a module it imports is
    missing, an exception, a syntax error), naming the real cause and where, never a traceback."""
    try:
        return importlib.import_module(module_name)
    except UserError:
        raise
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        if isinstance(exc, ModuleNotFoundError) and exc.name is not None and (
                module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UserError(not_found(str(exc))) from None
        cause = (str(exc) if isinstance(exc, ImportError) else  # SyntaxError's str() holds its place already
                 f"{type(exc).__name__}: {exc.msg if isinstance(exc, SyntaxError) else exc}")
        raise UserError(failed(f"{cause}{_where(exc)}")) from None


def import_target(target: str, what: str):
    """The object a dotted path `package.module.attr` names (a reward function, an environment class, an
    adapter's to_text). Raises UserError with one line naming `what` and the real cause: the module that is not
    found, or what the user's module raised while importing and where (`No module named 'numpyy' (my_module.py,
    line 1)`), or the missing attribute; never Hydra's guesses about installation."""
    module_name, _, attr = str(target).rpartition(".")
    if not module_name or not attr:
        raise UserError(f"{what}: '{target}' is not a dotted path such as my_module.my_function")
    module = _import_module(module_name, lambda cause: f"{what}: cannot import '{target}': {cause} (a file in the "
                                                       "directory `rlx` runs in, on PYTHONPATH, or in an installed "
                                                       "package)",
                            lambda cause: f"{what}: cannot import '{target}': {cause}")
    if not hasattr(module, attr):
        raise UserError(f"{what}: module {module_name} has no attribute '{attr}'")
    return getattr(module, attr)


def _where(exc: BaseException) -> str:
    """' (file, line N)' of the failing line: a syntax error's own position, else the innermost frame of the
    traceback in the user's code (not importlib's, not rlx's own registry code that refused an entry)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({_shown_path(exc.filename)}, line {exc.lineno})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    user = [f for f in frames if not _inside_rlx(f.filename)]
    frame = (user or frames or [None])[-1]
    return f" ({_shown_path(frame.filename)}, line {frame.lineno})" if frame is not None else ""


def _inside_rlx(filename: str) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(_RLX_DIR)
    except OSError:
        return False


def _shown_path(filename: str) -> str:
    """Relative to the current directory when the file lies below it (a plugin next to the user)."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def add_current_directory() -> None:
    """Put the current directory first on the import path, as `python -m` does, so that `rlx ...` run next to
    the user's module imports it (plugins=[my_module], reward targets, env.target) without PYTHONPATH=."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
