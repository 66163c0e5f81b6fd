"""Per-level segmentation metrics (torchmetrics): mIoU, macro-F1 and overall accuracy.

Two sets of functions. ``level_metrics`` / ``update`` / ``compute`` (torchmetrics) serve the
trainer's validation: classes absent from both prediction and target are left out of the
macro averages (torchmetrics' own rule), and when torch.distributed is initialized,
``compute()`` synchronizes the states across ranks. ``confusion_update`` /
``scores_from_confusion`` serve the test-split evaluation: exact integer confusion matrices
and figures derived from them alone, macro averages over the classes present in the reference.
"""

from __future__ import annotations

import numpy as np
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


# --- Evaluation figures from a confusion matrix (numpy, exact integer counts) ---------------


def confusion_update(
    cm: torch.Tensor, pred: torch.Tensor, target: torch.Tensor, ignore: int = IGNORE
) -> None:
    """Add the counts of one batch to ``cm`` (n, n) int64 in place: rows = reference, columns =
    prediction. Pixels whose target is ``ignore`` never count."""
    n = cm.shape[0]
    keep = target != ignore
    idx = target[keep].long() * n + pred[keep].long()
    cm += torch.bincount(idx, minlength=n * n).reshape(n, n).to(cm)


def scores_from_confusion(cm: np.ndarray) -> dict:
    """Overall accuracy, mIoU and macro-F1 of one level, and per-class scores, from its
    confusion matrix (n, n) (rows = reference, columns = prediction).

    Macro averages run over the classes present in the reference (support > 0): a class the
    model predicts but the test split lacks does not count, and one it never predicts counts
    with IoU = F1 = 0. Per class: precision is NaN for a class never predicted, recall for a
    class never in the reference (0 / 0 is undefined, not zero).
    """
    cm = np.asarray(cm, dtype=np.int64)
    tp = np.diag(cm).astype(np.float64)
    support = cm.sum(1)
    predicted = cm.sum(0)
    fp, fn = predicted - tp, support - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = tp / (tp + fp + fn)
        f1 = 2 * tp / (2 * tp + fp + fn)
        precision = tp / predicted
        recall = tp / support
    present = support > 0
    total = cm.sum()
    return {
        "oa": float(tp.sum() / total) if total else float("nan"),
        "miou": float(iou[present].mean()) if present.any() else float("nan"),
        "f1": float(f1[present].mean()) if present.any() else float("nan"),
        "classes_present": int(present.sum()),
        "pixels": int(total),
        "per_class": {
            "support": support,
            "predicted": predicted,
            "iou": iou,
            "f1": f1,
            "precision": precision,
            "recall": recall,
        },
    }
