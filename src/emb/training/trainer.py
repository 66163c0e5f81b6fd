"""One optimizer step and one validation pass; no CLI, no environment, no files.

A step: de-quantize the compact micro-batches on the device, forward under autocast, loss,
backward (DDP all-reduces only on the last micro-batch), unscale (fp16), clip, then apply
(optimizer, scheduler, EMA). On a non-finite gradient norm on any rank the step changes
nothing: the fused AdamW skips its update in the kernel (``found_inf``), the EMA's weight is 0
and BatchNorm buffers are put back. All of it is decided on the device, so a step that does
not log never waits for the GPU (issue 31); :mod:`emb.training.nonfinite` counts the skips.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from emb.loading.dequantize import Dequantize
from emb.models.flat_tensors import flats_of
from emb.models.runtime import Runtime
from emb.training.checkpoint_file import unwrap
from emb.training.distributed import all_ranks_finite, average_buffers
from emb.training.ema import ModelEma
from emb.training.loss import LEVELS, HierarchyTargets, MultiHeadLoss
from emb.training.nonfinite import NonfiniteCounts, NonfiniteGuard, TrainingDiverged
from emb.training.run_config import LoopConfig
from emb.training.validation_pass import check_finite_buffers, validation_pass

__all__ = ["StepResult", "Trainer", "TrainingDiverged", "check_finite_buffers"]


@dataclass
class StepResult:
    """What one optimizer step queued. Its tensors stay on the device: reading one waits for
    the GPU, so only logging steps read them (:class:`emb.training.run_log.RunLog`)."""

    finite: torch.Tensor  # 0-d bool: the gradient norm was finite on every rank (applied)
    loss: torch.Tensor  # mean over the micro-batches
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    grad_norm: torch.Tensor = field(default_factory=lambda: torch.tensor(float("nan")))
    samples: int = 0
    pixels: int = 0

    @property
    def applied(self) -> bool:
        """Whether the step changed the model: a host read, for tests and tools."""
        return bool(self.finite)


def fused_adamw(device: torch.device) -> bool:
    """Whether this PyTorch has a fused AdamW kernel for ``device``'s type."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return device.type in _get_fused_kernels_supported_devices()


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """A fused optimizer skips a step in its kernel (``found_inf``); others need the host."""
    return bool(optimizer.defaults.get("fused"))


class Trainer:
    """A model's optimization state: steps, skips, EMA, and the validation pass.

    ``step`` counts optimizer steps taken, skipped ones included (a skipped step changes
    nothing but is a step of the schedule, as with PyTorch's GradScaler). ``runtime`` is the
    process's resolved device and numerics (:meth:`emb.models.runtime.Runtime.resolve`, once
    per process, in the stage): the model was put in its memory format by
    :meth:`~emb.models.runtime.Runtime.prepare`. ``settings`` are the run's ``train:`` values
    (clip, GradScaler, non-finite policy); the Trainer has no defaults of its own.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: MultiHeadLoss,
        targets: HierarchyTargets,
        dequantize: Dequantize,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        runtime: Runtime,
        settings: LoopConfig,
        ema: ModelEma | None,
    ) -> None:
        self.runtime, self.device = runtime, runtime.device
        self.model, self.loss_fn, self.targets = model, loss_fn, targets
        self.dequantize = dequantize
        self.optimizer, self.scheduler = optimizer, scheduler
        self.grad_clip, self.ema = settings.grad_clip, ema
        self.scaler = runtime.grad_scaler(settings.grad_scaler)  # the runtime's rule
        self.guard = NonfiniteGuard(
            self.device, settings.nonfinite_policy, settings.max_nonfinite_in_row
        )
        self.counts = NonfiniteCounts(0, 0, 0, float("nan"))  # as of the last read
        # BatchNorm statistics, put back on a skip: one flat tensor per dtype where the model's
        # buffers live in one (emb.models.flat_tensors), else each buffer
        buffers = list(unwrap(model).buffers())
        self.buffers = flats_of(buffers) or buffers
        self.saved_buffers = [b.detach().clone() for b in self.buffers]
        self.step = 0  # optimizer steps taken (skipped ones too)
        self.legacy_schedule = False

    @property
    def precision(self) -> str:
        return self.runtime.precision

    def check_nonfinite(self) -> NonfiniteCounts:
        """Read the skip counts (waits for the device); raises :class:`TrainingDiverged`
        where the policy's limit was reached. Every rank reads at the same steps."""
        self.counts = self.guard.read()
        return self.counts

    @property
    def skipped(self) -> int:
        """Steps skipped for non-finite gradients (reads the device)."""
        return self.check_nonfinite().skipped

    @property
    def skipped_in_row(self) -> int:
        return self.check_nonfinite().in_row

    def inputs(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Compact batch -> (x on the device, {"l1", "l2", "l3"} targets)."""
        on_device = {
            k: v if k == "aug" else v.to(self.device, non_blocking=True)
            for k, v in batch.items()
            if isinstance(v, torch.Tensor)
        }  # augmentation codes stay on the host: they choose the kernels to queue
        x, y = self.dequantize(on_device)
        return self.runtime.inputs(x), self.targets(y)

    def forward(self, model: nn.Module, x: torch.Tensor, targets: dict) -> tuple[dict, Any]:
        """(logits, (loss, parts)) of ``model`` on ``x`` under this run's autocast."""
        with self.runtime.autocast():
            logits = model(x)
        return logits, self.loss_fn(logits, targets)

    def train_step(self, micro_batches: Sequence[dict]) -> StepResult:
        """One optimizer step over ``micro_batches`` (gradient accumulation); no host read
        (but for an optimizer without a fused kernel, which needs one to skip)."""
        self.model.train()
        if self.buffers:
            torch._foreach_copy_(self.saved_buffers, self.buffers)
        self.optimizer.zero_grad(set_to_none=True)
        n = len(micro_batches)
        losses = []
        samples = pixels = 0
        for i, batch in enumerate(micro_batches):
            x, targets = self.inputs(batch)
            last = i == n - 1
            sync = nullcontext() if last or not hasattr(self.model, "no_sync") else None
            with sync or self.model.no_sync():
                _, (loss, parts) = self.forward(self.model, x, targets)
                scaled = loss / n
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            losses.append(torch.stack([loss, *(parts[lv] for lv in LEVELS)]).detach())
            samples += x.shape[0]
            pixels += x.shape[0] * x.shape[-2] * x.shape[-1]
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        finite = all_ranks_finite(norm)
        mean = torch.stack(losses).mean(0)
        result = StepResult(
            finite, mean[0], dict(zip(LEVELS, mean[1:], strict=True)), norm.detach(),
            samples, pixels,
        )  # fmt: skip
        self.step += 1
        self._apply(finite)
        self.scheduler.step()
        counted = ~finite
        if self.scaler:  # an fp16 overflow is routine while the scale stays >= 1
            counted = counted & (self.scaler._get_scale_async() < 1.0)
        self.guard.record(~finite, counted, norm, self.step)
        return result

    @torch.no_grad()
    def _apply(self, finite: torch.Tensor) -> None:
        """The optimizer, BatchNorm and EMA updates, each a no-op where not ``finite``."""
        if self.scaler:
            self.scaler.step(self.optimizer)  # skips on its own found_inf
            self.scaler.update()
        elif skips_on_device(self.optimizer):
            self.optimizer.found_inf = (~finite).to(torch.float32)
            self.optimizer.step()
        elif bool(finite):  # the one host read of an unfused optimizer
            self.optimizer.step()
        for buffer, saved in zip(self.buffers, self.saved_buffers, strict=True):
            buffer.copy_(torch.where(finite, buffer, saved))
        if self.ema is not None:
            self.ema.update(self.model, finite)

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer, schedule, scaler and step counters, under checkpoint keys."""
        return {
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "step": self.step,
            "skipped": self.skipped,  # a read: a diverged run raises before it is saved
            "skipped_in_row": self.counts.in_row,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # Written before the schedule was saved with its length (a plain lambda then).
        self.legacy_schedule = state["scheduler"].get("lr_lambdas", [None])[0] is None
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step = state["step"]
        self.guard.load(state["skipped"], state["skipped_in_row"])
        self.counts = self.guard.read()

    def average_buffers(self) -> None:
        """BatchNorm running statistics averaged over ranks, before validation and saving."""
        average_buffers(unwrap(self.model))

    def validate(
        self,
        batches: Iterable,
        models: dict[str, nn.Module],
        bn_batch_stats: bool,
        min_batch: int,
    ) -> dict[str, float]:
        """Loss and per-level metrics of each of ``models`` in one pass, summed over ranks
        (:func:`emb.training.validation_pass.validation_pass`); the figures are those of the
        test evaluation (:mod:`emb.metrics`, one definition). ``bn_batch_stats`` and
        ``min_batch`` are the run's ``train.val_bn_batch_stats`` and ``train.val_min_batch``
        (:class:`emb.training.validation_policy.Validator` passes them); no default of their own."""

        def forward(model: nn.Module, x: torch.Tensor, targets: dict):
            logits, (loss, _) = self.forward(model, x, targets)
            return logits, loss

        return validation_pass(
            batches, models, self.inputs, forward, self.device, bn_batch_stats, min_batch
        )
