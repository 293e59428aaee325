"""Python entry points for scripts and notebooks: the same runs as the command line.

    import rlx

    def brevity(completions, **kwargs):                 # TRL's reward-function contract
        return [1.0 if len(c) < 40 else 0.0 for c in completions]

    result = rlx.fit(["steps=20", "algorithm=dapo"], rewards=[brevity])
    result.run_dir, result.metrics["eval/accuracy"]
    rlx.evaluate([f"run={result.run_dir}", "limit=50"]).metrics

    @rlx.register("advantage", "my_mean")     # in a module named by plugins=[...]
    def my_mean(rewards, group_ids, **knobs): ...

`fit` runs `rlx train` with the overrides in this process (Hydra composes the config, the run directory
is the usual outputs/train/<time>_<name>) and returns the run directory and the final metrics.
`rewards` are Python callables (or {name: callable} / {name: (callable, weight)}) that replace the
configured reward components; the first one is reported as accuracy unless reward.accuracy is given.
Bad input raises `rlx.config.UserError` with the one-line message the command line prints.
`register(kind, name)` adds a function or class to one of rlx's registries (rlx/cli/registries.py: KINDS);
the module that does so is named in the config's `plugins: [...]`, which `fit` and `evaluate` import before
they check the config (docs/extending/plugins.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rlx.errors import UserError

# Callables given to fit(rewards=...) live here, so a reward component's _target_ can name them
# (rlx.api.registered.<name>); only this process sees them (no multi-process launch).
registered = types.ModuleType("rlx.api.registered")
sys.modules[registered.__name__] = registered


@dataclass
class RunResult:
    run_dir: Path                       # the run (or evaluation) directory
    metrics: dict = field(default_factory=dict)  # final metrics (fit) or summary.json (evaluate)


def _reward_overrides(rewards, overrides: list[str], configured: Iterable[str] = ()) -> list[str]:
    """Hydra overrides that replace the `configured` reward components by the given callables (a dict value
    given on the command line is merged into the configured one, so each configured name is deleted)."""
    if isinstance(rewards, Mapping):
        items = list(rewards.items())
    else:
        items = [(getattr(fn, "__name__", f"reward_{i}"), fn) for i, fn in enumerate(rewards)]
    if not items:
        raise UserError("rewards= is empty; pass at least one reward function or leave it out")
    out = [f"~reward.components.{name}" for name in configured]
    for name, spec in items:
        fn, weight = spec if isinstance(spec, tuple) else (spec, 1.0)
        if not callable(fn) or not str(name).isidentifier():
            raise UserError(f"reward {name!r}: give callables with identifier names, e.g. rewards=[my_reward]")
        setattr(registered, name, fn)
        out += [f"+reward.components.{name}._target_=rlx.api.registered.{name}", f"+reward.components.{name}.weight={weight}"]
    if not any(o.startswith("reward.accuracy=") for o in overrides):
        out.append(f"reward.accuracy={items[0][0]}")
    return out


def _run_cli(command: list[str]) -> None:
    """rlx.cli.main in this process; a one-line error (exit 2) becomes UserError, other exits RuntimeError."""
    from rlx.cli import main

    argv, stderr = sys.argv[:], io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            main(command)
    except SystemExit as exc:
        if exc.code not in (0, None):
            text = stderr.getvalue().strip().splitlines()
            message = next((line.removeprefix("error: ") for line in reversed(text) if line.startswith("error: ")),
                           text[-1] if text else f"rlx {command[0]} exited with code {exc.code}")
            raise (UserError if exc.code == 2 else RuntimeError)(message) from None
    finally:
        sys.argv = argv
        sys.stderr.write(stderr.getvalue())


def _new_dir(kind: str, name: str) -> Path:
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
    return Path(os.environ.get("RLX_OUTPUTS", "outputs")) / kind / f"{stamp}_{name}"


def fit(overrides: Iterable[str] = (), rewards: Iterable[Callable] | Mapping | None = None, dataset=None,
        eval_dataset=None) -> RunResult:
    """Train as `rlx train OVERRIDES` does; returns the run directory and the final metrics.

    dataset: a list of dicts, a datasets.Dataset or a DatasetDict (train split; test or validation split held
    out), with a `prompt` column as in TRL; eval_dataset: the held-out rows (without one, 1 row in 10 is held
    out). The rows are written to <run>/dataset/ and trained as data=file (rlx/data/in_memory.py)."""
    import rlx.cli.registries  # noqa: F401  every registry publishes its names before the config is checked
    from rlx.config.overrides import check_overrides

    def checked(overrides: list[str]):
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                return check_overrides(overrides)
        except SystemExit:
            raise UserError(stderr.getvalue().strip().removeprefix("error: ")) from None

    overrides = list(overrides)
    run_dir = None
    if dataset is not None:
        from rlx.data.in_memory import dataset_overrides

        run_dir = _new_dir("train", "dataset")
        overrides += dataset_overrides(dataset, eval_dataset, (run_dir / "dataset").resolve(), overrides,
                                       rewards is not None)
    elif eval_dataset is not None:
        raise UserError("eval_dataset= needs dataset= (the training rows)")
    try:
        if rewards is not None:
            configured = list(checked(overrides).reward.components)
            overrides += _reward_overrides(rewards, overrides, configured)
        cfg = checked(overrides)
    except UserError:
        if run_dir is not None:  # the dataset was written for a run that will not start
            from rlx.runtime.unstarted import discard_unstarted

            discard_unstarted(run_dir)
        raise
    if rewards is not None and int(cfg.hardware.num_processes) * int(cfg.hardware.num_machines) > 1:
        raise UserError("rewards= callables live in this process; with several processes put them in a module and "
                        "name them in reward.components.<name>._target_")
    if run_dir is None:
        run_dir = _new_dir("train", cfg.name)
    else:  # the dataset's folder is written: name the run as a run of cfg.name is named
        named = run_dir.with_name(run_dir.name.removesuffix("_dataset") + f"_{cfg.name}")
        run_dir.rename(named)
        overrides = [o.replace(str(run_dir.resolve()), str(named.resolve())) for o in overrides]
        run_dir = named
    _run_cli(["train", *overrides, f"hydra.run.dir={run_dir}"])
    result = run_dir / "result.json"
    metrics = json.loads(result.read_text())["metrics"] if result.is_file() else {}
    return RunResult(run_dir.resolve(), metrics)


def evaluate(overrides: Iterable[str] = ()) -> RunResult:
    """Evaluate as `rlx eval OVERRIDES` does; returns the evaluation directory and its summary.json."""
    overrides = list(overrides)
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("name=")), "eval")
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), None)
    out_dir = Path(resume).expanduser() if resume else _new_dir("eval", name)
    _run_cli(["eval", *overrides, f"hydra.run.dir={out_dir}"])
    summary = out_dir / "summary.json"
    return RunResult(out_dir.resolve(), json.loads(summary.read_text()) if summary.is_file() else {})


def register(kind: str, name: str, **options) -> Callable:
    """Decorator adding the decorated function or class to the registry of `kind` under `name`:

        @rlx.register("advantage", "my_mean")
        def my_mean(rewards, group_ids, **knobs): ...

    kinds: advantage, scale, credit, loss_agg, kl_estimator, verifier, env, reward_shaper, advantage_transform,
    ... (rlx/cli/registries.py KINDS: each kind's config key and contract; an unknown kind raises one line
    listing them). verifier takes options: extract=fn(completion, problem) and needs=(columns).
    A name that is taken (a built-in or another plugin's) is refused."""
    from rlx.cli.registries import register as register_in

    return register_in(kind, name, **options)
