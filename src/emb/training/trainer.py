"""One optimizer step and one validation pass; no CLI, no environment, no files.

A step: de-quantize the compact micro-batches on the device, forward under autocast, loss,
backward (DDP all-reduces only on the last micro-batch), unscale (fp16), clip, then either
apply (optimizer, scheduler, EMA) or, on a non-finite gradient norm, skip with every rank
agreeing and BatchNorm buffers restored: a bad batch leaves weights, buffers and EMA untouched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from emb import metrics
from emb.loading.dequantize import Dequantize
from emb.training.checkpoint import unwrap
from emb.training.config import check_grad_scaler
from emb.training.distributed import all_ranks_agree, all_reduce_sum, average_buffers
from emb.training.ema import ModelEma
from emb.training.loss import LEVELS, HierarchyTargets, MultiHeadLoss

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TrainingDiverged(RuntimeError):
    """Non-finite gradients that the configured policy does not allow to skip."""


def autocast(device: torch.device, precision: str):
    """Autocast to bf16/fp16 when asked for; fp32 runs without autocast."""
    if precision not in AUTOCAST_DTYPES:
        return nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision])


@dataclass
class StepResult:
    """What one optimizer step did; losses are means over its micro-batches."""

    applied: bool
    loss: float
    parts: dict[str, float] = field(default_factory=dict)
    grad_norm: float = math.nan
    samples: int = 0
    pixels: int = 0


def model_is_channels_last(model: nn.Module) -> bool:
    """Whether the model's 4-D weights were put in channels_last (inputs must follow them)."""
    return any(
        p.dim() == 4
        and not p.is_contiguous()
        and p.is_contiguous(memory_format=torch.channels_last)
        for p in model.parameters()
    )


class Trainer:
    """A model's optimization state: steps, skips, EMA, and the validation pass."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: MultiHeadLoss,
        targets: HierarchyTargets,
        dequantize: Dequantize,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        device: torch.device,
        *,
        precision: str,
        grad_scaler: bool = False,
        grad_clip: float = 1.0,
        ema: ModelEma | None = None,
        nonfinite_policy: str = "skip",
        max_nonfinite_in_row: int = 5,
        channels_last: bool | str = "auto",
    ) -> None:
        check_grad_scaler(precision, grad_scaler)
        self.model, self.loss_fn, self.targets = model, loss_fn, targets
        self.dequantize = dequantize
        self.optimizer, self.scheduler, self.device = optimizer, scheduler, device
        self.precision, self.grad_clip, self.ema = precision, grad_clip, ema
        self.scaler = torch.amp.GradScaler(device.type) if grad_scaler else None
        self.nonfinite_policy, self.max_nonfinite_in_row = nonfinite_policy, max_nonfinite_in_row
        if channels_last == "auto":  # the format the model was put in (wrap_model)
            channels_last = model_is_channels_last(model)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.step = 0  # optimizer steps applied
        self.skipped = 0  # steps skipped for non-finite gradients
        self.skipped_in_row = 0
        self.legacy_schedule = False

    def inputs(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Compact batch -> (x on the device, {"l1", "l2", "l3"} targets)."""
        on_device = {
            k: v.to(self.device, non_blocking=True)
            for k, v in batch.items()
            if isinstance(v, torch.Tensor)
        }
        x, y = self.dequantize(on_device)
        return x.contiguous(memory_format=self.memory_format), self.targets(y)

    def train_step(self, micro_batches: Sequence[dict]) -> StepResult:
        """One optimizer step over ``micro_batches`` (gradient accumulation)."""
        self.model.train()
        saved_buffers = self._buffers_copy()
        self.optimizer.zero_grad(set_to_none=True)
        n = len(micro_batches)
        loss_sum, parts_sum = 0.0, dict.fromkeys(LEVELS, 0.0)
        samples = pixels = 0
        for i, batch in enumerate(micro_batches):
            x, targets = self.inputs(batch)
            last = i == n - 1
            sync = nullcontext() if last or not hasattr(self.model, "no_sync") else None
            with sync or self.model.no_sync():
                with autocast(self.device, self.precision):
                    logits = self.model(x)
                loss, parts = self.loss_fn(logits, targets)
                scaled = loss / n
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += float(loss.detach())
            for level in LEVELS:
                parts_sum[level] += float(parts[level].detach())
            samples += x.shape[0]
            pixels += x.shape[0] * x.shape[-2] * x.shape[-1]
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        result = StepResult(
            False,
            loss_sum / n,
            {k: v / n for k, v in parts_sum.items()},
            float(norm),
            samples,
            pixels,
        )
        if not all_ranks_agree(bool(torch.isfinite(norm)), self.device):
            self._skip(saved_buffers, result)
            return result
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)
        self.step += 1
        self.skipped_in_row = 0
        result.applied = True
        return result

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer, schedule, scaler and step counters, under checkpoint keys."""
        return {
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "step": self.step,
            "skipped": self.skipped,
            "skipped_in_row": self.skipped_in_row,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # Written before the schedule was saved with its length (a plain lambda then).
        self.legacy_schedule = state["scheduler"].get("lr_lambdas", [None])[0] is None
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.skipped = state["step"], state["skipped"]
        self.skipped_in_row = state["skipped_in_row"]

    def _buffers_copy(self) -> list[torch.Tensor]:
        """BatchNorm statistics and counters before a step (a few KB; cloned every step)."""
        return [b.detach().clone() for b in unwrap(self.model).buffers()]

    @torch.no_grad()
    def _skip(self, saved_buffers: list[torch.Tensor], result: StepResult) -> None:
        """Undo what the bad forward pass changed (BatchNorm statistics); count; maybe stop."""
        for buffer, saved in zip(unwrap(self.model).buffers(), saved_buffers, strict=True):
            buffer.copy_(saved)
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped += 1
        if self.scaler:
            self.scaler.update()  # lowers the scale; an fp16 overflow is routine until < 1
            if self.scaler.get_scale() >= 1.0:
                return
        self.skipped_in_row += 1
        where = f"optimizer step {self.step + 1}: gradient norm {result.grad_norm}, "
        if self.nonfinite_policy == "stop":
            raise TrainingDiverged(where + "train.nonfinite_policy is stop")
        if self.skipped_in_row >= self.max_nonfinite_in_row:
            raise TrainingDiverged(
                where + f"{self.skipped_in_row} non-finite steps in a row "
                f"(train.max_nonfinite_in_row = {self.max_nonfinite_in_row}): the run diverged"
            )

    def average_buffers(self) -> None:
        """BatchNorm running statistics averaged over ranks, before validation and saving."""
        average_buffers(unwrap(self.model))

    @torch.no_grad()
    def validate(
        self,
        batches: Iterable,
        models: dict[str, nn.Module],
        bn_batch_stats: bool = False,
        min_batch: int = 1,
    ) -> dict[str, float]:
        """Loss and per-level metrics of each of ``models`` in one pass, summed over ranks;
        the figures are those of the test evaluation (:mod:`emb.metrics`, one definition).

        Keys: ``val_loss``, ``val_miou_l3``, ... for the first model, ``val_{name}_...`` for
        every model. ``bn_batch_stats`` (defence in depth) runs BatchNorm on batch statistics
        without changing its running statistics; batches smaller than ``min_batch`` are skipped.
        """
        for name, model in models.items():
            check_finite_buffers(model, name)
            _eval_mode(model, bn_batch_stats)
        states = {name: metrics.empty_confusions(self.device) for name in models}
        sums = {name: 0.0 for name in models}
        count = 0
        try:
            for batch in batches:
                x, targets = self.inputs(batch)
                if x.shape[0] < min_batch:
                    continue
                count += x.shape[0]
                for name, model in models.items():
                    with autocast(self.device, self.precision):
                        logits = model(x)
                    loss, _ = self.loss_fn(logits, targets)
                    sums[name] += float(loss) * x.shape[0]
                    metrics.update(states[name], logits, targets)
        finally:
            for model in models.values():
                _restore_bn(model)
        names = list(models)
        totals = all_reduce_sum([*(sums[n] for n in names), count], self.device)
        count_all = totals[-1]
        out: dict[str, float] = {"val_samples": int(count_all)}
        for i, name in enumerate(names):
            figures = {"loss": totals[i] / max(count_all, 1)}
            figures.update(metrics.level_figures(metrics.sum_over_ranks(states[name])))
            for key, value in figures.items():
                out[f"val_{name}_{key}"] = value
                if i == 0:
                    out[f"val_{key}"] = value
        return out


def check_finite_buffers(model: nn.Module, name: str = "model") -> None:
    """Raise naming the first buffer (BatchNorm statistics) holding NaN or Inf."""
    for key, buffer in unwrap(model).named_buffers():
        if buffer.is_floating_point() and not bool(torch.isfinite(buffer).all()):
            raise TrainingDiverged(f"{name}: buffer {key} holds non-finite values")


_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _eval_mode(model: nn.Module, bn_batch_stats: bool) -> None:
    model.eval()
    if not bn_batch_stats:
        return
    for m in model.modules():
        if isinstance(m, _BN):
            m._emb_tracking = m.track_running_stats  # restored by _restore_bn
            m.track_running_stats = False  # batch statistics used, running ones left untouched
            m.train()


def _restore_bn(model: nn.Module) -> None:
    for m in model.modules():
        if hasattr(m, "_emb_tracking"):
            m.track_running_stats = m._emb_tracking
            del m._emb_tracking
            m.eval()
