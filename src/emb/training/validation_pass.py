"""One validation pass over several models (the raw model and its EMA) at once.

Losses and confusion matrices accumulate on the device; the host reads them once, after the
last batch, when the ranks' sums are reduced (a read per batch would stall the GPU queue).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from emb import metrics
from emb.training.checkpoint_file import unwrap
from emb.training.distributed import all_reduce_tensor
from emb.training.nonfinite import TrainingDiverged

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@torch.no_grad()
def validation_pass(
    batches: Iterable,
    models: dict[str, nn.Module],
    inputs: Callable,
    forward: Callable,
    device: torch.device,
    bn_batch_stats: bool,
    min_batch: int,
) -> dict[str, float]:
    """Loss and per-level metrics of each of ``models``, summed over ranks.

    ``inputs(batch) -> (x, targets)`` and ``forward(model, x, targets) -> (logits, loss)``
    come from the trainer. Keys: ``val_loss``, ``val_miou_l3``, ... for the first model,
    ``val_{name}_...`` for every model. ``bn_batch_stats`` runs BatchNorm on batch statistics
    without changing its running statistics; batches smaller than ``min_batch`` are skipped
    (the run's ``train.val_bn_batch_stats`` and ``train.val_min_batch``, given by the caller).
    """
    for name, model in models.items():
        check_finite_buffers(model, name)
        _eval_mode(model, bn_batch_stats)
    states = {name: metrics.empty_confusions(device) for name in models}
    sums = torch.zeros(len(models) + 1, dtype=torch.float64, device=device)
    try:
        for batch in batches:
            x, targets = inputs(batch)
            if x.shape[0] < min_batch:
                continue
            sums[-1] += x.shape[0]
            for i, (name, model) in enumerate(models.items()):
                logits, loss = forward(model, x, targets)
                sums[i] += loss.detach().to(torch.float64) * x.shape[0]
                metrics.update(states[name], logits, targets)
    finally:
        for model in models.values():
            _restore_bn(model)
    totals = all_reduce_tensor(sums).tolist()
    count_all = totals[-1]
    out: dict[str, float] = {"val_samples": int(count_all)}
    for i, name in enumerate(models):
        figures = {"loss": totals[i] / max(count_all, 1)}
        figures.update(metrics.level_figures(metrics.sum_over_ranks(states[name])))
        for key, value in figures.items():
            out[f"val_{name}_{key}"] = value
            if i == 0:
                out[f"val_{key}"] = value
    return out


def check_finite_buffers(model: nn.Module, name: str = "model") -> None:
    """Raise naming the first buffer (BatchNorm statistics) holding NaN or Inf."""
    floats = [(k, b) for k, b in unwrap(model).named_buffers() if b.is_floating_point()]
    if not floats or bool(torch.stack([torch.isfinite(b).all() for _, b in floats]).all()):
        return  # one read for the whole model
    for key, buffer in floats:
        if not bool(torch.isfinite(buffer).all()):
            raise TrainingDiverged(f"{name}: buffer {key} holds non-finite values")


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
