"""Resumable checkpoints: written atomically, the last K kept, restored exactly.

    <run>/checkpoints/step_000050/
      model.safetensors  optimizer.bin        Accelerate's save_state (sharded formats under FSDP/DeepSpeed)
      random_states_<rank>.pkl                python, numpy and torch (and CUDA) RNG states of every process
      custom_checkpoint_<i>.pkl               registered objects: scheduler, data position, controllers...
      adapter/                                with LoRA: the adapter in peft's save_pretrained format
      trainer_state.json                      step counters
      checksums.json                          sha256 and size of every file above; written last

A checkpoint is written into `checkpoints/.tmp-step_XXXXXX`, every file is fsynced, and the folder is
renamed when complete, so a crash mid-write leaves a `.tmp-` folder that is never mistaken for a
checkpoint (and is removed by the next save). Only folders named `step_XXXXXX` holding
trainer_state.json count. On resume the checksums are verified: a damaged latest checkpoint is named
in a warning and the previous complete one is used. A failed write (disk full) removes the temporary
folder, leaves the earlier checkpoints as they were and stops with one line (CheckpointWriteError).
A checkpoint is never written from weights that hold NaN or inf (NonFiniteError).

A loop uses three calls:
    checkpointer = Checkpointer.from_config(cfg, accelerator, run_dir)
    start = checkpointer.restore(scheduler=scheduler, data=stream, ...)   # 0 for a fresh run
    checkpointer.step_done(step)    # end of each step: saves every N steps, at the end, and on Ctrl-C
On Ctrl-C (SIGINT) or SIGTERM the current step finishes, a checkpoint is written and
`TrainingInterrupted` is raised; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path

import torch

from rlx.errors import (
    CheckpointDamaged,
    NonFiniteError,
    TrainingInterrupted,
    set_current_step,
)
from rlx.runtime.storage import writing

log = logging.getLogger("rlx")

STATE_FILE = "trainer_state.json"
CHECKSUM_FILE = "checksums.json"

def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first."""
    folder = checkpoint_dir(run_dir)
    found = []
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.startswith("step_") and (path / STATE_FILE).is_file():
                found.append((int(path.name.split("_", 1)[1]), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def truncate_metrics(path: Path, last_step: int) -> int:
    """Drop metrics.jsonl rows logged after `last_step` (they are re-made by the resumed run), and a last
    line cut short by a crash. The file is replaced atomically."""
    from rlx.runtime.rundir import atomic_write_text, read_metrics

    if not path.is_file():
        return 0
    kept = [row for row in read_metrics(path) if row["step"] <= last_step]
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in kept), "metrics.jsonl cut back to the checkpoint")
    return len(kept)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUM_FILE)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checksums(folder: Path) -> None:
    """fsync every file of the folder and record its size and sha256 in checksums.json (written last)."""
    record = {}
    for path in _files(folder):
        _fsync(path)
        record[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    target = folder / CHECKSUM_FILE
    with target.open("w") as handle:
        handle.write(json.dumps(record, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    for sub in {p.parent for p in folder.rglob("*")} | {folder}:
        _fsync(sub)


def verify_checkpoint(folder: Path) -> None:
    """Raise CheckpointDamaged naming the first file that is missing, of the wrong size or checksum."""
    manifest = folder / CHECKSUM_FILE
    if not manifest.is_file():
        raise CheckpointDamaged(f"{manifest} is missing (the checkpoint was not completely written)")
    try:
        record = json.loads(manifest.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointDamaged(f"{manifest} is damaged ({exc})") from None
    for name, want in record.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointDamaged(f"{path} is missing")
        if path.stat().st_size != want["bytes"]:
            raise CheckpointDamaged(f"{path} has {path.stat().st_size} bytes, {want['bytes']} were written "
                                    "(truncated?)")
        if _sha256(path) != want["sha256"]:
            raise CheckpointDamaged(f"{path} does not match its checksum (damaged)")


def _assert_finite_weights(models) -> None:
    for model in models:
        for name, param in model.named_parameters():
            if not torch.isfinite(param.detach()).all():
                raise NonFiniteError(f"weight {name}")


class GeneratorState:
    """A torch.Generator as an object with state_dict / load_state_dict (for register_for_checkpointing)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


def _only_trainable_weights(models, weights, output_dir) -> None:
    """Accelerate save hook: a model with frozen weights (LoRA) saves only what trains (the adapter);
    the frozen base is rebuilt from model.path when resuming."""
    for i, model in enumerate(models):
        if i < len(weights) and any(not p.requires_grad for p in model.parameters()):
            trainable = {name for name, p in model.named_parameters() if p.requires_grad}
            weights[i] = {k: v for k, v in weights[i].items() if k in trainable}


class Checkpointer:
    def __init__(self, accelerator, run_dir: Path, every: int, keep: int, total_steps: int, resume: bool, lora=None,
                 at_end: bool = True):
        """at_end: also save at the last step (False: a finished run keeps final/ and the periodic checkpoints only).
        lora: rlx.models.lora (its is_peft and save_adapter), handed in by the builder because runtime/ sits below
        models/ (tests/test_layers.py): a LoRA policy's adapter is written beside the Accelerate state."""
        self.acc, self.run_dir, self.lora = accelerator, Path(run_dir), lora
        self.every, self.keep, self.total_steps, self.resume = every, max(1, keep), total_steps, resume
        self.at_end = at_end
        self.folder = checkpoint_dir(self.run_dir)
        logging.getLogger("accelerate").setLevel(logging.WARNING)  # a line per saved file otherwise
        logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # "removed shared tensor": tied weights
        accelerator.register_save_state_pre_hook(_only_trainable_weights)
        self._stop_requested = False
        self._previous_handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    @classmethod
    def from_config(cls, cfg, accelerator, run_dir: Path, lora=None) -> Checkpointer:
        return cls(accelerator, run_dir, cfg.checkpoint.every, cfg.checkpoint.keep, cfg.steps, cfg.resume is not None,
                   lora, at_end=cfg.checkpoint.at_end)

    def _on_signal(self, signum, frame) -> None:
        # a second Ctrl-C gives up on the checkpoint; a repeat within a second is the same Ctrl-C
        # forwarded by the launcher (the terminal signals every process of the group directly too)
        if self._stop_requested:
            if time.monotonic() - self._stop_requested_at > 1.0:
                raise KeyboardInterrupt
            return
        self._stop_requested, self._stop_requested_at = True, time.monotonic()
        if self.acc.is_main_process:
            log.warning("stop requested: finishing this step and writing a checkpoint (Ctrl-C again to abort)")

    def close(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    def restore(self, **objects) -> int:
        """Register objects that have state_dict/load_state_dict and, when resuming, load the latest
        checkpoint into them and into the prepared model and optimizer. Returns the step to continue after."""
        self.acc.register_for_checkpointing(*objects.values())
        self._object_names = list(objects)
        step = self._load_latest(objects) if self.resume else 0
        set_current_step(step + 1)
        return step

    def _load_latest(self, objects: dict) -> int:
        """Load the newest checkpoint that verifies and loads; warn naming each damaged one skipped."""
        found = list_checkpoints(self.run_dir)
        if not found:
            if self.acc.is_main_process:
                log.warning("no complete checkpoint in %s: starting from step 0", self.folder)
                truncate_metrics(self.run_dir / "metrics.jsonl", -1)
            return 0
        # schedulers prepared by Accelerate (AcceleratedScheduler, wrapping the LambdaLR) are checkpointed by
        # Accelerate itself, not registered here
        candidates = [*objects.values(), *getattr(self.acc, "_schedulers", [])]
        schedulers = [inner for inner in (getattr(o, "scheduler", o) for o in candidates)
                      if isinstance(inner, torch.optim.lr_scheduler.LambdaLR)]
        configured_lrs = [[g.get("initial_lr", g["lr"]) for g in s.optimizer.param_groups] for s in schedulers]
        problems = []
        deepspeed = self.acc.state.deepspeed_plugin is not None
        for step, path in reversed(found):
            try:
                if (path / CHECKSUM_FILE).is_file():  # checkpoints of older versions have none
                    verify_checkpoint(path)
                # strict=False: safetensors drops tied duplicates (lm_head = embeddings) and LoRA saves only adapters
                # (DeepSpeed's engine loads its own checkpoint format and names the flag load_module_strict)
                self.acc.load_state(str(path), **({"load_module_strict": False} if deepspeed else {"strict": False}))
                self._check_rng_restored(path)
            except CheckpointDamaged as exc:
                problems.append(str(exc))
            except Exception as exc:  # a file that verifies but does not load (written by another version...)
                problems.append(f"{path} does not load ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''})")
            else:
                break
            log.warning("checkpoint step %d is damaged, using an earlier one: %s", step, problems[-1])
        else:
            raise CheckpointDamaged(f"no checkpoint of {self.run_dir} loads: " + "; ".join(problems))
        for scheduler, lrs in zip(schedulers, configured_lrs):
            _apply_learning_rate(scheduler, lrs)
        if self.acc.is_main_process:
            kept = truncate_metrics(self.run_dir / "metrics.jsonl", step)
            log.info("resumed from %s (step %d; %d metrics rows kept)", path, step, kept)
        self.acc.wait_for_everyone()
        return step

    def _check_rng_restored(self, path: Path) -> None:
        """Accelerate logs and ignores a random-state file that fails to load: check it took effect."""
        rng_file = path / f"random_states_{self.acc.process_index}.pkl"
        if not rng_file.is_file():
            raise CheckpointDamaged(f"{rng_file} is missing")
        try:
            saved = torch.load(rng_file, weights_only=False)
        except Exception as exc:
            raise CheckpointDamaged(f"{rng_file} does not load ({type(exc).__name__})") from None
        if not torch.equal(saved["torch_manual_seed"], torch.get_rng_state()):
            raise CheckpointDamaged(f"{rng_file}: the random state was not restored")

    def _stop_everywhere(self) -> bool:
        """True when any process received Ctrl-C / SIGTERM (all processes must agree to save together)."""
        if self.acc.num_processes == 1:
            return self._stop_requested
        flag = torch.tensor([1.0 if self._stop_requested else 0.0], device=self.acc.device)
        return bool(self.acc.reduce(flag, reduction="sum").item() > 0)

    def step_done(self, step: int) -> Path | None:
        """End of a step: save when due; after a stop request, save and raise TrainingInterrupted."""
        set_current_step(step + 1)
        stop = self._stop_everywhere()
        due = (step == self.total_steps and self.at_end) or (self.every and step % self.every == 0)
        path = self.save(step) if (due or stop) else None
        if step == self.total_steps:
            self.close()
        if stop:
            self.close()
            raise TrainingInterrupted(step, path)
        return path

    def save(self, step: int) -> Path:
        final = self.folder / f"step_{step:06d}"
        tmp = self.folder / f".tmp-step_{step:06d}"
        _assert_finite_weights(self.acc._models)
        what = f"the checkpoint of step {step}"
        try:
            if self.acc.is_main_process:
                with writing(self.folder, what):
                    self.folder.mkdir(parents=True, exist_ok=True)
                    for stale in self.folder.glob(".tmp-*"):
                        shutil.rmtree(stale, ignore_errors=True)
            self.acc.wait_for_everyone()
            # a storage fault anywhere below (a library may report it without an errno) removes the partial folder
            # and stops with one line (StorageError); the folder is renamed to step_XXXXXX only once complete
            with writing(tmp, what, partial=tmp):
                self.acc.save_state(str(tmp))  # every process: its RNG state, and its shard under FSDP/DeepSpeed
                self.acc.wait_for_everyone()
                from rlx.runtime.parallel import gathered_trainable_weights

                policy = self.acc.unwrap_model(self.acc._models[0])
                peft = self.lora is not None and self.lora.is_peft(policy)
                adapter = gathered_trainable_weights(policy) if peft else None  # FSDP2: every rank gathers
                if self.acc.is_main_process:
                    if peft:
                        self.lora.save_adapter(policy, tmp / "adapter", adapter)
                    state = {"step": step, "total_steps": self.total_steps, "num_processes": self.acc.num_processes,
                             "objects": self._object_names}
                    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
                    write_checksums(tmp)
                    if final.exists():  # re-saving a step (resumed, then stopped at the same step)
                        _discard(final)
                    os.replace(tmp, final)
                    _fsync(self.folder)
        except Exception:
            self.close()
            raise
        if self.acc.is_main_process:
            for _, old in list_checkpoints(self.run_dir)[: -self.keep]:
                _discard(old)
            log.info("checkpoint: %s", final)
        self.acc.wait_for_everyone()
        return final


def _discard(folder: Path) -> None:
    """Delete a checkpoint folder: renamed to `.tmp-` first (one atomic step), so that a deletion cut short (a
    kill, a permission error) never leaves a step_XXXXXX folder with some of its files; a `.tmp-` folder is never
    read and the next save removes it."""
    doomed = folder.with_name(f".tmp-old-{folder.name}")
    try:
        os.replace(folder, doomed)
    except OSError as exc:
        log.warning("could not delete the old checkpoint %s (%s); it stays", folder, exc.strerror)
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _apply_learning_rate(scheduler, configured: list[float]) -> None:
    """A resumed scheduler keeps the learning rate of the run that saved it; a new optim.lr given on
    resume replaces the base rates, and the current rates follow the schedule from the restored step."""
    if [float(x) for x in scheduler.base_lrs] == [float(x) for x in configured]:
        return
    scheduler.base_lrs = list(configured)
    for group, base, factor in zip(scheduler.optimizer.param_groups, configured, scheduler.lr_lambdas):
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def what_survived(run_dir, total_steps: int) -> str:
    """What a run stopped by a fault keeps and which checkpoint `rlx train resume=` uses (for the error line)."""
    found = latest_checkpoint(run_dir)
    if found is None:
        return "no checkpoint had been written yet: resume starts again from step 0"
    step, path = found
    if step >= total_steps:
        return (f"the run's last checkpoint (step {step}, {path}) is complete: resume writes what is missing "
                f"(final/, result.json) from it")
    return f"earlier checkpoints are intact: resume continues from step {step} ({path})"
