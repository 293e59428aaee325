# ruff: noqa: UP006, UP035, UP045  (OmegaConf structured configs need typing.Optional / Dict at runtime)
"""A Hydra sweeper that asks Optuna for each trial's parameters and tells it the returned metric.

Search space (hydra.sweeper.params), in Hydra's override grammar as the old plugin read it:
    interval(a, b)              float in [a, b]          (int when both bounds are ints)
    tag(log, interval(a, b))    the same on a log scale
    choice(x, y, ...) / x,y,... categorical
    range(a, b[, step])         int in [a, b) by step
    anything else               a fixed value given to every trial
Settings: direction, n_trials, n_jobs (trials launched per batch), study_name, storage, sampler
({seed, n_startup_trials}: TPE). A trial that returns None or a non-finite value is told as failed.
Writes optimization_results.yaml (best_params, best_value) into the sweep directory.
"""

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

log = logging.getLogger("rlx")


@dataclass
class SamplerConf:
    seed: Optional[int] = 0        # TPE's seed, so a search repeats
    n_startup_trials: int = 5      # random trials before TPE models the results


@dataclass
class RlxOptunaSweeperConf:
    _target_: str = "hydra_plugins.rlx_optuna_sweeper.sweeper.RlxOptunaSweeper"
    direction: str = "maximize"
    study_name: Optional[str] = None
    storage: Optional[str] = None
    n_trials: int = 20
    n_jobs: int = 1
    sampler: SamplerConf = field(default_factory=SamplerConf)
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="rlx_optuna", node=RlxOptunaSweeperConf, provider="rlx")


def distribution(override: Override):
    """(kind, arguments) of one search-space override; kind "fixed" for a plain value."""
    value = override.value()
    if isinstance(value, IntervalSweep):
        log_scale = "log" in (value.tags or set())
        if isinstance(value.start, int) and isinstance(value.end, int):
            return "int", (int(value.start), int(value.end), log_scale)
        return "float", (float(value.start), float(value.end), log_scale)
    if isinstance(value, ChoiceSweep):
        return "categorical", tuple(value.list)
    if isinstance(value, RangeSweep):
        return "range", (int(value.start), int(value.stop), int(value.step or 1))
    return "fixed", override.get_value_element_as_str()


def suggest(trial, name: str, kind: str, args) -> Any:
    if kind == "float":
        return trial.suggest_float(name, args[0], args[1], log=args[2])
    if kind == "int":
        return trial.suggest_int(name, args[0], args[1], log=args[2])
    if kind == "categorical":
        return trial.suggest_categorical(name, list(args))
    if kind == "range":
        return trial.suggest_int(name, args[0], args[1] - 1, step=args[2])
    return args


class RlxOptunaSweeper(Sweeper):
    def __init__(self, direction="maximize", study_name=None, storage=None, n_trials=20, n_jobs=1, sampler=None,
                 params=None):
        self.direction, self.study_name, self.storage = str(direction), study_name, storage
        self.n_trials, self.n_jobs = int(n_trials), max(1, int(n_jobs))
        self.sampler_conf = (OmegaConf.to_container(sampler, resolve=True) if OmegaConf.is_config(sampler)
                             else dict(sampler or {}))
        self.params = {str(k): str(v) for k, v in (params or {}).items()}
        self.config = self.launcher = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function,
                                                               config=config)

    def sweep(self, arguments: list[str]) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" lines: rlx logs the result

        parser = OverridesParser.create()
        space = {o.get_key_element(): distribution(o)
                 for o in parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()])}
        fixed_args = []
        for override, text in zip(parser.parse_overrides(arguments), arguments):
            if override.is_sweep_override():
                space[override.get_key_element()] = distribution(override)
            else:
                fixed_args.append(text)
        sampler = optuna.samplers.TPESampler(seed=self.sampler_conf.get("seed"),
                                             n_startup_trials=int(self.sampler_conf.get("n_startup_trials", 5)))
        study = optuna.create_study(study_name=self.study_name, storage=self.storage, sampler=sampler,
                                    direction=self.direction, load_if_exists=self.storage is not None)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        done = 0
        while done < self.n_trials:
            batch = min(self.n_jobs, self.n_trials - done)
            trials = [study.ask() for _ in range(batch)]
            overrides = []
            for trial in trials:
                chosen = [f"{name}={suggest(trial, name, kind, args)}" for name, (kind, args) in space.items()]
                overrides.append(tuple(fixed_args + chosen))
            returns = self.launcher.launch(overrides, initial_job_idx=done)
            for trial, ret in zip(trials, returns):
                try:
                    value = ret.return_value
                except Exception:  # the task raised (rlx records failures itself, so this is rare)
                    value = None
                if isinstance(value, (int, float)) and math.isfinite(value):
                    study.tell(trial, float(value))
                else:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
            done += batch
        finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        results = {"name": "optuna", "optuna_version": optuna.__version__}
        if finished:
            results.update(best_params=dict(study.best_params), best_value=float(study.best_value))
        OmegaConf.save(OmegaConf.create(results), sweep_dir / "optimization_results.yaml")
        log.info("optuna %s: %d of %d trials finished%s", optuna.__version__, len(finished), self.n_trials,
                 f"; best {self.direction[:3]} value {study.best_value:.4f} with "
                 + " ".join(f"{k}={v}" for k, v in study.best_params.items()) if finished else "")
