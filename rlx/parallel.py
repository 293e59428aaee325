"""Data parallelism inside a loop: each process takes its shard of the global batch, and every
statistic that defines the update (group advantages, token-mean normalisers) is computed over the
global batch, so N processes take exactly the optimizer step one process would take.

Gradients: DistributedDataParallel averages gradients over processes. A loss normalised by a global
count (all tokens of the batch) gives on process r the gradient g_r of its share of the global loss,
and the full gradient is sum_r g_r = N * mean_r g_r; so each process scales its loss by N
(`gradient_scale`) and DDP's average becomes that sum.
"""

from __future__ import annotations

import torch


def shard(count: int, accelerator) -> slice:
    """This process's contiguous share of `count` items (count must split evenly; see launch.check_batch)."""
    per = count // accelerator.num_processes
    return slice(accelerator.process_index * per, (accelerator.process_index + 1) * per)


def gradient_scale(accelerator) -> float:
    """Factor on a globally normalised loss so that DDP's gradient average becomes the global gradient."""
    return float(accelerator.num_processes)


def gather(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate a per-process (n, ...) tensor in process order -> (N * n, ...) on the CPU."""
    if accelerator.num_processes == 1:
        return tensor
    return accelerator.gather(tensor.to(accelerator.device)).cpu()


def gather_padded(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate per-process (n, T_r) tensors whose width differs (each process pads its completions to
    its own longest) -> (N * n, max_r T_r) on the CPU, right-padded with zeros."""
    if accelerator.num_processes == 1:
        return tensor
    padded = accelerator.pad_across_processes(tensor.to(accelerator.device), dim=1, pad_index=0)
    return accelerator.gather(padded).cpu()


def global_sum(accelerator, value: float) -> float:
    if accelerator.num_processes == 1:
        return value
    total = torch.tensor([float(value)], dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(total, reduction="sum").item()


def global_mean(accelerator, value: float) -> float:
    return global_sum(accelerator, value) / accelerator.num_processes
