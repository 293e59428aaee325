"""Resumable checkpoints: written atomically, the last K kept, restored exactly.

    <run>/checkpoints/step_000050/
      model.safetensors  optimizer.bin        Accelerate's save_state (sharded formats under FSDP/DeepSpeed)
      random_states_<rank>.pkl                python, numpy and torch (and CUDA) RNG states of every process
      custom_checkpoint_<i>.pkl               registered objects: scheduler, data position, controllers...
      adapter/                                with LoRA: the adapter in peft's save_pretrained format
      trainer_state.json                      step counters; written last

A checkpoint is written into `checkpoints/.tmp-step_XXXXXX` and renamed when complete, so a crash
mid-write leaves a `.tmp-` folder that is never mistaken for a checkpoint (and is removed by the next
save). Only folders named `step_XXXXXX` holding trainer_state.json count.

A loop uses three calls:
    checkpointer = Checkpointer.from_config(cfg, accelerator, run_dir)
    start = checkpointer.restore(scheduler=scheduler, data=stream, ...)   # 0 for a fresh run
    checkpointer.step_done(step)    # end of each step: saves every N steps, at the end, and on Ctrl-C
On Ctrl-C (SIGINT) or SIGTERM the current step finishes, a checkpoint is written and
`TrainingInterrupted` is raised; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path

import torch

log = logging.getLogger("rlx")

STATE_FILE = "trainer_state.json"


class TrainingInterrupted(Exception):
    """Raised after the checkpoint written on Ctrl-C / SIGTERM; carries the step it stopped at."""

    def __init__(self, step: int, path: Path):
        super().__init__(f"interrupted after step {step}; checkpoint {path}")
        self.step, self.path = step, path


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
    """Drop metrics.jsonl rows logged after `last_step` (they are re-made by the resumed run)."""
    if not path.is_file():
        return 0
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))
    return len(kept)


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
    def __init__(self, accelerator, run_dir: Path, every: int, keep: int, total_steps: int, resume: bool):
        self.acc, self.run_dir = accelerator, Path(run_dir)
        self.every, self.keep, self.total_steps, self.resume = every, max(1, keep), total_steps, resume
        self.folder = checkpoint_dir(self.run_dir)
        logging.getLogger("accelerate").setLevel(logging.WARNING)  # a line per saved file otherwise
        logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # "removed shared tensor": tied weights
        accelerator.register_save_state_pre_hook(_only_trainable_weights)
        self._stop_requested = False
        self._previous_handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    @classmethod
    def from_config(cls, cfg, accelerator, run_dir: Path) -> Checkpointer:
        return cls(accelerator, run_dir, cfg.checkpoint.every, cfg.checkpoint.keep, cfg.steps, cfg.resume is not None)

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
        found = latest_checkpoint(self.run_dir) if self.resume else None
        if found is None:
            if self.resume and self.acc.is_main_process:
                log.warning("no complete checkpoint in %s: starting from step 0", self.folder)
                truncate_metrics(self.run_dir / "metrics.jsonl", -1)
            return 0
        step, path = found
        # strict=False: safetensors drops tied duplicates (lm_head = embeddings) and LoRA saves only adapters
        # (DeepSpeed's engine loads its own checkpoint format and names the flag load_module_strict)
        deepspeed = self.acc.state.deepspeed_plugin is not None
        self.acc.load_state(str(path), **({"load_module_strict": False} if deepspeed else {"strict": False}))
        if self.acc.is_main_process:
            kept = truncate_metrics(self.run_dir / "metrics.jsonl", step)
            log.info("resumed from %s (step %d; %d metrics rows kept)", path, step, kept)
        self.acc.wait_for_everyone()
        return step

    def _stop_everywhere(self) -> bool:
        """True when any process received Ctrl-C / SIGTERM (all processes must agree to save together)."""
        if self.acc.num_processes == 1:
            return self._stop_requested
        flag = torch.tensor([1.0 if self._stop_requested else 0.0], device=self.acc.device)
        return bool(self.acc.reduce(flag, reduction="sum").item() > 0)

    def step_done(self, step: int) -> Path | None:
        """End of a step: save when due; after a stop request, save and raise TrainingInterrupted."""
        stop = self._stop_everywhere()
        due = step == self.total_steps or (self.every and step % self.every == 0)
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
        if self.acc.is_main_process:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in self.folder.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        self.acc.wait_for_everyone()
        self.acc.save_state(str(tmp))  # every process: its RNG state, and its shard under FSDP/DeepSpeed
        self.acc.wait_for_everyone()
        if self.acc.is_main_process:
            from rlx.models.lora import save_adapter

            save_adapter(self.acc.unwrap_model(self.acc._models[0]), tmp / "adapter")
            state = {"step": step, "total_steps": self.total_steps, "num_processes": self.acc.num_processes,
                     "objects": self._object_names}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
            if final.exists():  # re-saving a step (resumed, then stopped at the same step)
                shutil.rmtree(final)
            os.replace(tmp, final)
            for _, old in list_checkpoints(self.run_dir)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
            log.info("checkpoint: %s", final)
        self.acc.wait_for_everyone()
        return final
