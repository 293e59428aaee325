"""`rlx train`: `train(cfg, run_dir, overrides)`, one training run on a composed config (rlx/cli/training.py does
the work), and its thin Hydra front `train_app`, which adds exit codes and sweep results. `rlx.fit` calls `train`
directly.

The loop is picked by `algorithm.family`: policy_gradient (GRPO family), ppo (with a critic), agent
(multi-turn environments), sft,
preference (DPO family, SimPO, ORPO) or reward_model (Bradley-Terry).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

import rlx.cli.registries  # noqa: F401  every registry publishes its names before the config is checked
from rlx.cli.training import run
from rlx.config.paths import CONF_DIR
from rlx.config.rules import optimized_metric
from rlx.errors import (
    CheckpointDamaged,
    EpisodesFailed,
    NonFiniteError,
    RewardError,
    RolloutServerError,
    RunInUse,
    StorageError,
    TrainingInterrupted,
    UserError,
    fail,
)
from rlx.runtime.checkpoint import what_survived

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

log = logging.getLogger("rlx")


def train(cfg: DictConfig, run_dir: Path, overrides: list[str],
          rewards: Mapping[str, Callable] | None = None) -> dict | None:
    """Train according to the composed config `cfg` into `run_dir` and write its result.json. `overrides` are
    the command line's (saved for a resume, passed to worker processes); `rewards` are reward functions of this
    process by component name, used instead of importing those components' `_target_` (rlx.fit's callables).
    Returns the final metrics, or None where nothing ran here (the run had finished, a multi-process run's
    parent, a worker that is not the main process). Faults raise rlx.errors exceptions."""
    from rlx.report.sweeps import write_result

    metric = optimized_metric(cfg.optimized_metric, cfg.algorithm.family, cfg.data.source)
    final = run(cfg, run_dir, overrides, rewards)
    if final is not None:
        write_result(run_dir, final, metric)
    return final


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from rlx.report.sweeps import RESULT_FILE, is_multirun, record_failure
    from rlx.runtime import launch

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    metric = optimized_metric(cfg.optimized_metric, cfg.algorithm.family, cfg.data.source)
    try:
        final = train(cfg, run_dir, list(hydra_cfg.overrides.task))
    except TrainingInterrupted as exc:
        log.warning("stopped after step %d; checkpoint written. Continue with: rlx train resume=%s", exc.step, run_dir)
        raise SystemExit(130) from None
    except (Exception, SystemExit) as exc:
        multirun = is_multirun(hydra_cfg)
        if multirun and not isinstance(exc, StorageError):  # one crashing trial is recorded and the sweep goes on
            try:
                return record_failure(run_dir, exc, hydra_cfg)
            except StorageError as fault:  # ... unless its record cannot be written either
                exc = fault
        if isinstance(exc, StorageError) and multirun:  # a full disk would fail every later trial too
            exc.survived = f"the sweep stopped at trial {hydra_cfg.job.num}; finished trials keep their {RESULT_FILE}"
        # the parent adds it for workers
        elif isinstance(exc, (StorageError, EpisodesFailed)) and not launch.is_worker():
            exc.survived, exc.command = what_survived(run_dir, cfg.steps), f"rlx train resume={run_dir}"
        known = {UserError: 2, RunInUse: 2, RewardError: 1, NonFiniteError: 1, CheckpointDamaged: 1, EpisodesFailed: 1,
                 StorageError: 3, RolloutServerError: 1}
        code = next((c for kind, c in known.items() if isinstance(exc, kind)), None)
        if launch.is_worker() and (code is not None or launch.is_peer_failure(exc)):
            # the parent prints each distinct error once; a rank that only saw another one die stays silent
            log.debug("worker stopped: %r", exc)
            launch.record_worker_error(str(exc) if code is not None else None, code or 1)
            raise SystemExit(code or 1) from None
        if isinstance(exc, UserError) and cfg.resume is None and not launch.is_worker():
            from rlx.runtime.unstarted import discard_unstarted

            discard_unstarted(run_dir)  # rejected before it started: no directory is left behind
        if code is not None:
            fail(exc.for_run(run_dir) if isinstance(exc, RolloutServerError) else str(exc), code=code)
        raise
    if final is None:
        return None
    if metric not in final:
        log.warning("optimized_metric '%s' is not a final metric; valid choices: %s", metric, ", ".join(final))
    return final.get(metric)
