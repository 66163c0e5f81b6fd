"""The multi-head loss: the weighted sum of per-level cross entropies."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from emb.training.loss import HierarchyTargets, MultiHeadLoss


def test_loss_is_the_weighted_sum_of_per_level_cross_entropies(class_map) -> None:
    torch.manual_seed(0)
    y3 = torch.randint(0, 61, (2, 8, 8))
    y3[0, :2] = 255
    logits = {k: torch.randn(2, n, 8, 8) for k, n in (("l1", 2), ("l2", 7), ("l3", 61))}
    targets = HierarchyTargets(class_map)(y3)
    weights = {"l1": 0.1, "l2": 0.3, "l3": 1.0}
    total, _ = MultiHeadLoss(weights, 0.05)(logits, targets)
    expected = sum(
        w * F.cross_entropy(logits[k], targets[k], ignore_index=255, label_smoothing=0.05)
        for k, w in weights.items()
    )
    assert torch.allclose(total, expected, atol=1e-6)
    assert (targets["l2"][0, :2] == 255).all() and (targets["l1"][0, :2] == 255).all()


def test_loss_of_a_batch_without_labels_is_zero_not_nan() -> None:
    logits = {
        k: torch.randn(1, n, 4, 4, requires_grad=True)
        for k, n in (("l1", 2), ("l2", 7), ("l3", 61))
    }
    targets = {k: torch.full((1, 4, 4), 255) for k in logits}
    total, _ = MultiHeadLoss({"l1": 0.1, "l2": 0.3, "l3": 1.0}, 0.05)(logits, targets)
    total.backward()
    assert total.item() == 0.0 and torch.isfinite(logits["l3"].grad).all()
