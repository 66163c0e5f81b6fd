"""Multi-head cross-entropy over the L1/L2/L3 hierarchy.

Targets for L2 and L1 are derived from the L3 target by lookup tables on the device, so the
three levels can never disagree. Pixels labelled 255 are ignored; a batch with no labelled
pixel gives a loss of 0 (with a graph), not NaN.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from emb.classes import IGNORE, ClassMap

LEVELS = ("l1", "l2", "l3")


class HierarchyTargets(nn.Module):
    """(B, H, W) int64 L3 -> {"l1", "l2", "l3"} targets, 255 kept."""

    def __init__(self, cmap: ClassMap) -> None:
        super().__init__()
        self.register_buffer("l3_to_l2", torch.from_numpy(cmap.l3_to_l2.astype("int64")), False)
        self.register_buffer("l3_to_l1", torch.from_numpy(cmap.l3_to_l1.astype("int64")), False)

    def forward(self, l3: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"l1": self.l3_to_l1[l3], "l2": self.l3_to_l2[l3], "l3": l3}


def class_weights_from_histogram(hist: list[int] | np.ndarray, rule: str) -> torch.Tensor | None:
    """L3 class weights from the train split's pixel histogram, mean 1 over present classes.

    ``inverse``: 1 / frequency; ``sqrt_inverse``: 1 / sqrt(frequency); absent classes get 0
    (they never occur as targets). ``none`` gives None (unweighted).
    """
    if rule == "none":
        return None
    counts = np.asarray(hist, dtype=np.float64)
    present = counts > 0
    if not present.any():
        raise ValueError("class weights: the train histogram has no labelled pixel")
    freq = np.where(present, counts / counts.sum(), 1.0)
    power = {"inverse": 1.0, "sqrt_inverse": 0.5}.get(rule)
    if power is None:
        raise ValueError(
            f"loss.class_weights: expected none, inverse or sqrt_inverse, got {rule!r}"
        )
    weights = np.where(present, freq**-power, 0.0)
    weights /= weights[present].mean()
    return torch.tensor(weights, dtype=torch.float32)


class MultiHeadLoss(nn.Module):
    """Weighted sum of per-level CE (label smoothing, ignore 255); returns (total, per level).

    With ``l3_class_weights`` the L3 term is a weighted mean (weights of the labelled pixels).
    """

    def __init__(
        self,
        weights: dict[str, float],
        label_smoothing: float,
        l3_class_weights: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.weights = {level: float(weights[level]) for level in LEVELS}
        self.label_smoothing = label_smoothing
        self.register_buffer("l3_class_weights", l3_class_weights, persistent=False)

    def forward(
        self, logits: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        parts = {}
        for level in LEVELS:
            target = targets[level]
            weight = self.l3_class_weights if level == "l3" else None
            summed = F.cross_entropy(
                logits[level].float(),
                target,
                weight=weight,
                ignore_index=IGNORE,
                label_smoothing=self.label_smoothing,
                reduction="sum",
            )
            labelled = target != IGNORE
            if weight is None:
                norm = labelled.sum().clamp(min=1)
            else:  # the weighted mean, as reduction="mean" defines it (no boolean index:
                # it would wait for the GPU to count the pixels)
                picked = weight[torch.where(labelled, target, 0)]
                norm = torch.where(labelled, picked, 0.0).sum().clamp(min=1e-12)
            parts[level] = summed / norm
        total = sum(self.weights[level] * parts[level] for level in LEVELS)
        return total, parts
