"""Per-level segmentation figures: mIoU, macro-F1 and overall accuracy, one definition.

Validation (the trainer, which picks ``best.pt``) and test evaluation compute them the same
way: exact integer confusion matrices per level (``confusion_update``, counted on the device
and tested against torchmetrics' counts), summed over ranks (``sum_over_ranks``: integer
sums, so any number of ranks gives the same matrix), and figures from the matrix alone
(``scores_from_confusion``): macro averages over the classes present in the reference.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from emb.classes import IGNORE, N_L1, N_L2, N_L3

NUM_CLASSES = {"l1": N_L1, "l2": N_L2, "l3": N_L3}
FIGURES = ("miou", "f1", "oa")


def empty_confusions(device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """{"l1", "l2", "l3"} -> (n, n) int64 zeros (rows = reference, columns = prediction)."""
    return {
        lv: torch.zeros(n, n, dtype=torch.int64, device=device) for lv, n in NUM_CLASSES.items()
    }


def update(cms: dict[str, torch.Tensor], logits: dict[str, torch.Tensor], targets: dict) -> None:
    """Add one batch's predictions (argmax of each level's logits) to ``cms`` in place."""
    for level, cm in cms.items():
        confusion_update(cm, logits[level].argmax(1), targets[level])


def sum_over_ranks(cms: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The matrices summed over every rank (when torch.distributed is initialized), as numpy."""
    if dist.is_available() and dist.is_initialized():
        for cm in cms.values():
            dist.all_reduce(cm)  # integer sums: exact whatever the number of ranks
    return {lv: cm.cpu().numpy() for lv, cm in cms.items()}


def level_figures(cms: dict[str, np.ndarray]) -> dict[str, float]:
    """Flat {"miou_l3": ..., "f1_l1": ..., "oa_l2": ...} of one weight set's matrices."""
    flat = {}
    for level, cm in cms.items():
        scores = scores_from_confusion(cm)
        flat.update({f"{fig}_{level}": scores[fig] for fig in FIGURES})
    return flat


# --- Evaluation figures from a confusion matrix (numpy, exact integer counts) ---------------


def confusion_update(
    cm: torch.Tensor, pred: torch.Tensor, target: torch.Tensor, ignore: int = IGNORE
) -> None:
    """Add the counts of one batch to ``cm`` (n, n) int64 in place: rows = reference, columns =
    prediction. Pixels whose target is ``ignore`` never count."""
    cm += grouped_confusions(pred, target, cm.shape[0], ignore=ignore)[0]


def grouped_confusions(
    pred: torch.Tensor, target: torch.Tensor, n: int, group: torch.Tensor | None = None,
    groups: int = 1, ignore: int = IGNORE,
) -> torch.Tensor:  # fmt: skip
    """(groups, n, n) int64 counts, sample ``i`` of the batch counted in ``group[i]`` (all in
    group 0 when None): one scatter-add into ``groups * n * n + 1`` bins, the last one taking
    the ignored pixels. Not torchmetrics' confusion matrix: its ``ignore_index`` mask and
    ``bincount`` each wait for the GPU, once per batch, which a pass kept on the device must
    not (issue 31)."""
    target, pred = target.long(), pred.long()
    first = 0 if group is None else group.view(-1, *([1] * (target.dim() - 1))) * n
    code = torch.where(target != ignore, (first + target) * n + pred, groups * n * n)
    code = code.reshape(-1)
    counts = torch.zeros(groups * n * n + 1, dtype=torch.int64, device=target.device)
    counts.scatter_add_(0, code, torch.ones_like(code))
    return counts[:-1].view(groups, n, n)


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
