"""Segmentation models for embedding rasters: ``ModelConfig`` -> ``build_model`` -> nn.Module.

Every model maps (B, in_dim, H, W) float32 to ``{"l1", "l2", "l3"}`` logits of shape
(B, num_classes[i], H, W), one head per level of the label hierarchy.

Importing the package imports no torch: the workflow reads :class:`ModelConfig` at parse time
(through :mod:`emb.training.run_config`); the architectures, and torch with them, are imported
by the first :func:`build_model`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emb.models.model_config import ARCHS, UNKNOWN_TILE, ModelConfig, aspp_rates_for

if TYPE_CHECKING:
    from torch import nn

__all__ = ["ARCHS", "ModelConfig", "aspp_rates_for", "build_model", "count_parameters"]


def build_model(cfg: ModelConfig, tile_size: int | None = None) -> nn.Module:
    """Validate ``cfg`` and build the model it names (freshly initialised, CPU, float32).

    ``tile_size`` fixes DeepLab's atrous rates when ``cfg.aspp_rates`` is None (training
    records the derived rates in its checkpoints, so evaluation rebuilds the same model).
    """
    from emb.models.deeplab import DeepLabV3Plus  # torch: here, not when the package loads
    from emb.models.segformer import SegFormer

    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(cfg).__name__}")
    cfg.validate()
    if tile_size is not None or cfg.aspp_rates is None:
        cfg = cfg.for_tile(tile_size or UNKNOWN_TILE)
    return SegFormer(cfg) if cfg.arch == "segformer" else DeepLabV3Plus(cfg)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameter elements (``requires_grad``) in ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
