"""Python entry points for scripts and notebooks: the same runs as the command line.

    import rlx

    def brevity(completions, **kwargs):                 # TRL's reward-function contract
        return [1.0 if len(c) < 40 else 0.0 for c in completions]

    result = rlx.fit(["steps=20", "algorithm=dapo"], rewards=[brevity])
    result.run_dir, result.metrics["eval/accuracy"]
    rlx.evaluate([f"run={result.run_dir}", "limit=50"]).metrics

    @rlx.register("advantage", "my_mean")     # in a module named by plugins=[...]
    def my_mean(rewards, group_ids, **knobs): ...

`fit` composes the config as `rlx train` does and calls the training function (`rlx.cli.train.train`) in this
process, with no command line in between (the run directory is the usual outputs/train/<time>_<name>, its log
train.log); it returns the run directory and the final metrics.
`rewards` are Python callables (or {name: callable} / {name: (callable, weight)}) that replace the
configured reward components; they are handed to the run as objects, and the saved config records where each
was defined (`_target_: module.function`, so `rlx train resume=` and `rlx eval run=` can import one that lives
in a module). The first one is reported as accuracy unless reward.accuracy is given.
Bad input raises `rlx.config.UserError` with the one-line message the command line prints; faults during the
run raise rlx.errors' exceptions (RewardError, NonFiniteError, StorageError, ...) as they are.
`register(kind, name)` adds a function or class to one of rlx's registries (rlx/cli/registries.py: KINDS);
the module that does so is named in the config's `plugins: [...]`, which `fit` and `evaluate` import before
they check the config (docs/extending/plugins.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rlx.errors import UserError


@dataclass
class RunResult:
    run_dir: Path                       # the run (or evaluation) directory
    metrics: dict = field(default_factory=dict)  # final metrics (fit) or summary.json (evaluate)


def _defined_at(fn: Callable) -> str:
    """Where a function was defined, as a dotted path (module.qualname). It is what a reward component's
    `_target_` records; it imports only where the function is a module-level name of an importable module."""
    return f"{getattr(fn, '__module__', None) or '<unknown module>'}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _reward_overrides(rewards, overrides: list[str], configured: Iterable[str] = ()) -> tuple[list[str], dict]:
    """Hydra overrides that replace the `configured` reward components by the given callables (a dict value
    given on the command line is merged into the configured one, so each configured name is deleted), and the
    callables by component name."""
    if isinstance(rewards, Mapping):
        items = list(rewards.items())
    else:
        items = [(getattr(fn, "__name__", f"reward_{i}"), fn) for i, fn in enumerate(rewards)]
    if not items:
        raise UserError("rewards= is empty; pass at least one reward function or leave it out")
    out, given = [f"~reward.components.{name}" for name in configured], {}
    for name, spec in items:
        fn, weight = spec if isinstance(spec, tuple) else (spec, 1.0)
        if not callable(fn) or not str(name).isidentifier():
            raise UserError(f"reward {name!r}: give callables with identifier names, e.g. rewards=[my_reward]")
        given[name] = fn
        target = _defined_at(fn).replace("\\", "\\\\").replace("'", "\\'")
        out += [f"+reward.components.{name}._target_='{target}'", f"+reward.components.{name}.weight={weight}"]
    if not any(o.startswith("reward.accuracy=") for o in overrides):
        out.append(f"reward.accuracy={items[0][0]}")
    return out, given


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """The command line's checks print `error: ...` and exit 2 (rlx.errors.fail): here that becomes UserError
    with the same line (what they print goes to this process's stderr as well)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            yield
    except SystemExit as exc:
        text = stderr.getvalue().strip().splitlines()
        message = next((line.removeprefix("error: ") for line in reversed(text) if line.startswith("error: ")),
                       text[-1] if text else f"exited with code {exc.code}")
        raise (UserError if exc.code == 2 else RuntimeError)(message) from None
    finally:
        sys.stderr.write(stderr.getvalue())


@contextlib.contextmanager
def _logged_to(log_file: Path) -> Iterator[None]:
    """rlx's log lines into `log_file` (train.log / eval.log, the format Hydra's job logging writes) and to
    stdout, as the command line shows them; the process's own logging is restored afterwards."""
    root = logging.getLogger()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handlers = [logging.FileHandler(log_file)]
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in root.handlers):
        handlers.append(logging.StreamHandler(sys.stdout))
    for handler in handlers:
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        root.addHandler(handler)
    level = root.level
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()


def _prepare_process() -> None:
    """What `rlx` does before any command: every registry publishes its names, libraries' noise is quieted."""
    import rlx.cli.registries  # noqa: F401
    from rlx.cli import cpu_deepspeed_without_a_warning, quiet_libraries

    cpu_deepspeed_without_a_warning()
    quiet_libraries()


def _new_dir(kind: str, name: str) -> Path:
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
    return Path(os.environ.get("RLX_OUTPUTS", "outputs")) / kind / f"{stamp}_{name}"


def _resumed_dir(overrides: list[str]) -> Path | None:
    """The run directory that `resume=` resolved to (launch.resolve_resume adds it as hydra.run.dir)."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    return Path(given[-1].strip("'\"").replace("\\'", "'")) if given else None


def fit(overrides: Iterable[str] = (), rewards: Iterable[Callable] | Mapping | None = None, dataset=None,
        eval_dataset=None) -> RunResult:
    """Train as `rlx train OVERRIDES` does; returns the run directory and the final metrics.

    dataset: a list of dicts, a datasets.Dataset or a DatasetDict (train split; test or validation split held
    out), with a `prompt` column as in TRL; eval_dataset: the held-out rows (without one, 1 row in 10 is held
    out). The rows are written to <run>/dataset/ and trained as data=file (rlx/data/in_memory.py).
    `resume=RUN` (or auto) continues a run as `rlx train resume=RUN` does."""
    from rlx.config.overrides import check_overrides
    from rlx.runtime.launch import check_not_externally_launched, resolve_resume

    _prepare_process()
    overrides = list(overrides)
    with _one_line_errors():
        check_not_externally_launched()
        overrides = resolve_resume(overrides)
    resumed = _resumed_dir(overrides)
    overrides = [o for o in overrides if not o.startswith("hydra.")]
    run_dir = None
    if dataset is not None:
        from rlx.data.in_memory import dataset_overrides

        run_dir = _new_dir("train", "dataset")
        overrides += dataset_overrides(dataset, eval_dataset, (run_dir / "dataset").resolve(), overrides,
                                       rewards is not None)
    elif eval_dataset is not None:
        raise UserError("eval_dataset= needs dataset= (the training rows)")
    given = {}
    try:
        with _one_line_errors():
            if rewards is not None:
                configured = list(check_overrides(overrides).reward.components)
                reward_overrides, given = _reward_overrides(rewards, overrides, configured)
                overrides += reward_overrides
            cfg = check_overrides(overrides)
    except UserError:
        if run_dir is not None:  # the dataset was written for a run that will not start
            from rlx.runtime.unstarted import discard_unstarted

            discard_unstarted(run_dir)
        raise
    if rewards is not None and int(cfg.hardware.num_processes) * int(cfg.hardware.num_machines) > 1:
        raise UserError("rewards= callables live in this process; with several processes put them in a module and "
                        "name them in reward.components.<name>._target_")
    if resumed is not None:
        run_dir = resumed
    elif run_dir is None:
        run_dir = _new_dir("train", cfg.name)
    else:  # the dataset's folder is written: name the run as a run of cfg.name is named
        named = run_dir.with_name(run_dir.name.removesuffix("_dataset") + f"_{cfg.name}")
        run_dir.rename(named)
        overrides = [o.replace(str(run_dir.resolve()), str(named.resolve())) for o in overrides]
        run_dir = named
        with _one_line_errors():
            cfg = check_overrides(overrides)  # its data paths name the renamed folder
    return RunResult(run_dir.resolve(), _train_here(cfg, run_dir, overrides, given))


def _train_here(cfg, run_dir: Path, overrides: list[str], rewards: Mapping[str, Callable]) -> dict:
    """rlx.cli.train.train in this process, logged as `rlx train` logs; a run rejected before it started leaves
    no directory behind. Returns the final metrics as result.json holds them."""
    from rlx.cli.train import train
    from rlx.runtime.storage import check_writable

    check_writable(run_dir, "the run directory")
    with _logged_to(run_dir / "train.log"):
        try:
            train(cfg, run_dir, overrides, rewards)
        except UserError:
            if cfg.resume is None:
                from rlx.runtime.unstarted import discard_unstarted

                discard_unstarted(run_dir)
            raise
    result = run_dir / "result.json"  # written by this process, by the run's main worker, or by an earlier finish
    return json.loads(result.read_text())["metrics"] if result.is_file() else {}


def evaluate(overrides: Iterable[str] = ()) -> RunResult:
    """Evaluate as `rlx eval OVERRIDES` does, in this process; returns the evaluation directory and its
    summary.json."""
    from rlx.cli.eval import eval_here
    from rlx.config.overrides import check_overrides, composed_choices
    from rlx.evaluation.run_task import benchmark_file_args

    _prepare_process()
    overrides = [o for o in benchmark_file_args(list(overrides)) if not o.startswith("hydra.")]
    with _one_line_errors():
        cfg = check_overrides(overrides, config_name="eval")
    out_dir = Path(str(cfg.resume)).expanduser() if cfg.resume else _new_dir("eval", cfg.name)
    with _logged_to(out_dir / "eval.log"):
        eval_here(cfg, out_dir, overrides, composed_choices(overrides, "eval").get("model"))
    summary = out_dir / "summary.json"
    return RunResult(out_dir.resolve(), json.loads(summary.read_text()) if summary.is_file() else {})


def register(kind: str, name: str, **options) -> Callable:
    """Decorator adding the decorated function or class to the registry of `kind` under `name`:

        @rlx.register("advantage", "my_mean")
        def my_mean(rewards, group_ids, **knobs): ...

    kinds: advantage, scale, credit, loss_agg, kl_estimator, verifier, reader, env, reward_shaper,
    advantage_transform, ... (rlx/cli/registries.py KINDS: each kind's config key and contract; an unknown kind raises
    one line listing them). verifier takes options: extract=fn(completion, problem) or a reader's name,
    needs=(columns) and own_reader=True (never read by model.answer.reader).
    A name that is taken (a built-in or another plugin's) is refused."""
    from rlx.cli.registries import register as register_in

    return register_in(kind, name, **options)
