"""Collectives every rank must join, and the model wrappers for multi-process training.

Each helper is a no-op in a single process, so the same training code runs under
``torchrun --nproc-per-node 1``, plain ``python`` and DDP alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from emb.models.runtime import Runtime


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def any_rank(wants: bool, device: torch.device) -> bool:
    """True on every rank when ``wants`` is true on any rank (one small all-reduce; a host
    read, so the loop asks it every ``StopRequest.check_every`` steps, not every step)."""
    if not is_distributed():
        return wants
    flag = torch.tensor([1.0 if wants else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def all_reduce_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over ranks in place, left on the device (no host read)."""
    if is_distributed():
        dist.all_reduce(t)
    return t


def all_ranks_finite(value: torch.Tensor) -> torch.Tensor:
    """A 0-d bool on the device: ``value`` is finite on every rank. No host read: the step
    that uses it queues on without waiting (a MIN all-reduce of one flag)."""
    flag = torch.isfinite(value.detach()).to(torch.float32).reshape(1)
    if is_distributed():
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return flag[0] > 0


@torch.no_grad()
def average_buffers(model: nn.Module) -> None:
    """Average float buffers (BatchNorm running stats) over ranks: each rank updated them on
    its own batches, and validation and checkpoints must see one model."""
    if not is_distributed():
        return
    world = dist.get_world_size()
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer)
            buffer /= world


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def wrap_model(model: nn.Module, world: int, runtime: Runtime) -> nn.Module:
    """torch.compile (inside DDP, never around it) as ``runtime`` says, with its activation
    memory budget, then DDP; the model comes laid out for the device
    (:meth:`emb.models.runtime.Runtime.prepare`)."""
    if runtime.compile:
        if runtime.compile_memory_budget is not None:
            import torch._functorch.config as functorch_config

            functorch_config.activation_memory_budget = runtime.compile_memory_budget
        model = torch.compile(model)
    if world > 1:
        device = runtime.device
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    return model
