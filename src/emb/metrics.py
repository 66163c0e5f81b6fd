"""Per-level segmentation metrics (torchmetrics): mIoU, macro-F1 and overall accuracy.

Classes absent from both prediction and target are left out of the macro averages
(torchmetrics' own rule), so a region without rice is not scored on rice. When torch.distributed
is initialized, ``compute()`` synchronizes the states across ranks.
"""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassJaccardIndex,
)

from emb.classes import IGNORE, N_L1, N_L2, N_L3

NUM_CLASSES = {"l1": N_L1, "l2": N_L2, "l3": N_L3}


def level_metrics(confusion: bool = False) -> nn.ModuleDict:
    """{"l1", "l2", "l3"} -> MetricCollection of miou, f1 (macro) and oa (micro accuracy)."""
    out = {}
    for level, n in NUM_CLASSES.items():
        metrics = {
            "miou": MulticlassJaccardIndex(n, average="macro", ignore_index=IGNORE),
            "f1": MulticlassF1Score(n, average="macro", ignore_index=IGNORE),
            "oa": MulticlassAccuracy(n, average="micro", ignore_index=IGNORE),
        }
        if confusion:
            metrics["confusion"] = MulticlassConfusionMatrix(n, ignore_index=IGNORE)
        out[level] = MetricCollection(metrics)
    return nn.ModuleDict(out)


def update(metrics: nn.ModuleDict, logits: dict[str, torch.Tensor], targets: dict) -> None:
    for level, collection in metrics.items():
        collection.update(logits[level].argmax(1), targets[level])


def compute(metrics: nn.ModuleDict) -> dict[str, float]:
    """Flat {"miou_l3": ..., "f1_l1": ..., "oa_l2": ...}; confusion matrices are left out."""
    flat = {}
    for level, collection in metrics.items():
        for name, value in collection.compute().items():
            if name != "confusion":
                flat[f"{name}_{level}"] = float(value)
    return flat
