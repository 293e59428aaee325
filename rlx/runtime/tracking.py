"""Experiment trackers through Accelerate's tracker interface, and what every run records about itself.

metrics.jsonl is always written (rlx/runtime/rundir.py); `logger=tensorboard|wandb|mlflow|trackio` adds a
tracker that receives the same rows. Every run also writes <run>/env.json: package versions, the git
commit of the code, the command line and the process layout (config.yaml holds the resolved config).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from rlx.config.paths import REPO_DIR
from rlx.errors import UserError

# tracker name (Accelerate's) -> the package it needs
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
PACKAGES = ("torch", "transformers", "accelerate", "peft", "datasets", "hydra-core", "omegaconf", "reasoning-gym",
            "numpy", "safetensors", "tokenizers", "deepspeed", "vllm", *TRACKER_PACKAGES.values())


def tracker_names(logger_cfg) -> list[str]:
    names = [str(t) for t in (getattr(logger_cfg, "trackers", None) or [])]
    for name in names:
        if name not in TRACKER_PACKAGES:
            raise UserError(f"unknown tracker '{name}' in logger.trackers; valid choices: "
                            f"{', '.join(TRACKER_PACKAGES)}")
        try:
            importlib.metadata.version(TRACKER_PACKAGES[name])
        except importlib.metadata.PackageNotFoundError:
            raise UserError(f"logger={name} needs the '{TRACKER_PACKAGES[name]}' package: pip install "
                            f"{TRACKER_PACKAGES[name]}") from None
    return names


def tracker_environment(logger_cfg, run_dir: Path) -> None:
    """Point each tracker at the run directory and set offline modes (environment variables they read)."""
    names = getattr(logger_cfg, "trackers", None) or []
    if "wandb" in names:
        os.environ.setdefault("WANDB_DIR", str(run_dir))
        if getattr(logger_cfg, "mode", None):
            os.environ["WANDB_MODE"] = str(logger_cfg.mode)  # offline: files under <run>/wandb, `wandb sync` later
    if "mlflow" in names:
        # a sqlite store in the run folder: mlflow >= 3 refuses its file store by default
        uri = getattr(logger_cfg, "tracking_uri", None) or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"
        os.environ.setdefault("MLFLOW_TRACKING_URI", uri)
    if "trackio" in names and getattr(logger_cfg, "dir", None):
        os.environ.setdefault("TRACKIO_DIR", str(logger_cfg.dir))


def flat_config(cfg) -> dict:
    """The run's settings (a TrainConfig, or a resolved DictConfig) as {"a/b": scalar} (trackers store flat
    hyper-parameters)."""
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}/")
        else:
            out[prefix[:-1]] = node if isinstance(node, (int, float, str, bool)) else str(node)

    walk(dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else OmegaConf.to_container(cfg, resolve=True), "")
    return out


def start_trackers(accelerator, cfg, run_dir: Path) -> None:
    if not accelerator.log_with:
        return
    project = getattr(cfg.logger, "project", None) or "rlx"
    run_name = Path(run_dir).name
    init_kwargs = {"wandb": {"name": run_name, "dir": str(run_dir)}, "mlflow": {"run_name": run_name},
                   "trackio": {"name": run_name}}
    accelerator.init_trackers(project, config=flat_config(cfg), init_kwargs=init_kwargs)


def _git(*args: str) -> str | None:
    """A git query about the rlx source checkout; None for an installed package (no checkout to ask)."""
    if REPO_DIR is None:
        return None
    try:
        out = subprocess.run(["git", *args], cwd=REPO_DIR, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment_info(world_size: int) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "command": sys.argv,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": platform.node(),
        "processes": world_size,
        "packages": versions,
    }


def write_env_info(run_dir: Path, world_size: int) -> None:
    from rlx.runtime.rundir import atomic_write_text

    atomic_write_text(Path(run_dir) / "env.json", json.dumps(environment_info(world_size), indent=1) + "\n",
                      "the run's environment record (env.json)")
