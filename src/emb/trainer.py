"""The training and validation loops; no CLI, no environment, no files.

The step: de-quantize the compact batch on the device, forward under autocast (bf16 on CUDA,
fp32 on CPU), multi-head loss, backward, clip, optimizer step, scheduler step (once per
optimizer step). The gradient norm is the same
on every rank after DDP's all-reduce, so a non-finite norm stops every rank at the same step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from emb import metrics as level_metrics
from emb.checkpoint import unwrap
from emb.data import Dequantize
from emb.loss import LEVELS, HierarchyTargets, MultiHeadLoss


class TrainingDiverged(RuntimeError):
    """The gradient norm became NaN or infinite."""


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CUDA when asked for; full precision otherwise (CPU runs fp32)."""
    if device.type == "cuda" and precision == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


class Trainer:
    """One model's optimization state and the two loops over batches."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: MultiHeadLoss,
        targets: HierarchyTargets,
        prepare: Dequantize,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        device: torch.device,
        precision: str = "bf16",
        grad_clip: float = 1.0,
        log_every: int = 50,
        log: Callable[[str], None] = print,
    ) -> None:
        self.model, self.loss_fn, self.targets, self.prepare = model, loss_fn, targets, prepare
        self.optimizer, self.scheduler = optimizer, scheduler
        self.device, self.precision, self.grad_clip = device, precision, grad_clip
        self.log_every, self.log = log_every, log
        self.step = 0

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_epoch(self, batches: Iterable) -> dict[str, float]:
        """One pass over ``batches``; returns mean losses, batch count and throughput."""
        self.model.train()
        sums = dict.fromkeys(("loss", *LEVELS), 0.0)
        n = samples = 0
        wait = 0.0
        start = tick = time.perf_counter()
        for batch in batches:
            wait += time.perf_counter() - tick
            x, y = self.prepare(self._to_device(batch))
            targets = self.targets(y)
            with autocast(self.device, self.precision):
                logits = self.model(x)
            loss, parts = self.loss_fn(logits, targets)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            if not torch.isfinite(norm):
                raise TrainingDiverged(
                    f"non-finite gradient norm {float(norm)} at step {self.step}"
                )
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            n += 1
            samples += x.shape[0]
            sums["loss"] += float(loss.detach())
            for level in LEVELS:
                sums[level] += float(parts[level])
            if self.step % self.log_every == 0:
                lr = self.scheduler.get_last_lr()[0]
                self.log(f"step {self.step} loss {float(loss):.4f} lr {lr:.2e}")
            tick = time.perf_counter()
        seconds = time.perf_counter() - start
        self.average_buffers()
        out = {
            f"train_{k}" if k == "loss" else f"train_loss_{k}": v / max(n, 1)
            for k, v in sums.items()
        }
        out.update(
            batches=n,
            samples_per_s=samples / max(seconds, 1e-9),
            data_wait=wait / max(seconds, 1e-9),
        )
        return out

    @torch.no_grad()
    def average_buffers(self) -> None:
        """Average float buffers (BatchNorm running stats) over ranks: each rank updated them
        on its own batches, and validation and checkpoints must see one model."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        world = dist.get_world_size()
        for buffer in unwrap(self.model).buffers():
            if buffer.is_floating_point():
                dist.all_reduce(buffer)
                buffer /= world

    @torch.no_grad()
    def validate(self, batches: Iterable) -> dict[str, float]:
        """Loss and per-level metrics over ``batches``, summed over all ranks."""
        model = unwrap(self.model)
        model.eval()
        metrics = level_metrics.level_metrics().to(self.device)
        loss_sum, count = 0.0, 0
        for batch in batches:
            x, y = self.prepare(self._to_device(batch))
            targets = self.targets(y)
            with autocast(self.device, self.precision):
                logits = model(x)
            loss, _ = self.loss_fn(logits, targets)
            loss_sum += float(loss) * x.shape[0]
            count += x.shape[0]
            level_metrics.update(metrics, logits, targets)
        loss_sum, count = _all_reduce_sum([loss_sum, count], self.device)
        out = {"val_loss": loss_sum / max(count, 1), "val_samples": int(count)}
        out.update({f"val_{k}": v for k, v in level_metrics.compute(metrics).items()})
        return out
