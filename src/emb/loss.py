"""Multi-head cross-entropy over the L1/L2/L3 hierarchy.

Targets for L2 and L1 are derived from the L3 target by lookup tables on the device, so the
three levels can never disagree. Pixels labelled 255 are ignored; a batch with no labelled
pixel gives a loss of 0 (with a graph), not NaN.
"""

from __future__ import annotations

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


class MultiHeadLoss(nn.Module):
    """Weighted sum of per-level CE (label smoothing, ignore 255); returns (total, per level)."""

    def __init__(self, weights: dict[str, float], label_smoothing: float = 0.05) -> None:
        super().__init__()
        self.weights = {level: float(weights[level]) for level in LEVELS}
        self.label_smoothing = label_smoothing

    def forward(
        self, logits: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        parts = {}
        for level in LEVELS:
            target = targets[level]
            summed = F.cross_entropy(
                logits[level].float(),
                target,
                ignore_index=IGNORE,
                label_smoothing=self.label_smoothing,
                reduction="sum",
            )
            parts[level] = summed / (target != IGNORE).sum().clamp(min=1)
        total = sum(self.weights[level] * parts[level] for level in LEVELS)
        return total, parts
