"""Segmentation models for embedding rasters: ``ModelConfig`` -> ``build_model`` -> nn.Module.

Every model maps (B, in_dim, H, W) float32 to ``{"l1", "l2", "l3"}`` logits of shape
(B, num_classes[i], H, W), one head per level of the label hierarchy.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from emb.models.blocks import conv_macs

ARCHS = ("segformer", "deeplab")
TUPLE_FIELDS = ("widths", "depths", "aspp_rates", "num_classes")

__all__ = ["ARCHS", "ModelConfig", "build_model", "conv_macs", "count_parameters"]


@dataclass(frozen=True)
class ModelConfig:
    """Model hyper-parameters; ``ModelConfig(**yaml_dict)`` works (lists become tuples).

    Values are checked by ``validate()`` (called by ``build_model``), not on construction.
    """

    arch: str  # "segformer" | "deeplab"
    in_dim: int  # 64 (AEF) or 128 (TESSERA)
    widths: tuple[int, ...] = (64, 128, 256, 512)  # channels per encoder stage
    depths: tuple[int, ...] = (2, 2, 6, 2)  # blocks per stage
    decoder_dim: int = 256  # SegFormer MLP decoder / DeepLab ASPP + decoder width
    aspp_rates: tuple[int, ...] = (6, 12, 18)  # DeepLab atrous rates
    input_norm: bool = False  # learned LayerNorm over channels on the raw input
    num_classes: tuple[int, int, int] = (2, 7, 61)  # L1, L2, L3
    drop_path: float = 0.0  # max stochastic-depth rate (linear over blocks)

    def __post_init__(self) -> None:
        for name in TUPLE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def validate(self) -> None:
        """Raise ValueError naming the offending field and what it allows."""
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        _check_positive_int("in_dim", self.in_dim)
        _check_positive_int("decoder_dim", self.decoder_dim)
        for name in TUPLE_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, tuple) or not value:
                raise ValueError(f"{name} must be a non-empty list of positive ints, got {value!r}")
            for v in value:
                _check_positive_int(name, v, whole=value)
        if len(self.widths) != len(self.depths):
            raise ValueError(
                f"widths and depths must have the same length (one entry per stage), got "
                f"widths={self.widths} ({len(self.widths)}) and "
                f"depths={self.depths} ({len(self.depths)})"
            )
        if len(self.num_classes) != 3:
            raise ValueError(
                f"num_classes must have 3 entries (L1, L2, L3), got {self.num_classes}"
            )
        if not isinstance(self.input_norm, bool):
            raise ValueError(f"input_norm must be true or false, got {self.input_norm!r}")
        if not (isinstance(self.drop_path, (int, float)) and 0.0 <= self.drop_path < 1.0):
            raise ValueError(f"drop_path must be a number in [0, 1), got {self.drop_path!r}")


def _check_positive_int(name: str, value: object, whole: object = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        shown = value if whole is None else whole
        raise ValueError(f"{name} must be positive int(s), got {shown!r}")


def build_model(cfg: ModelConfig) -> nn.Module:
    """Validate ``cfg`` and build the model it names (freshly initialised, CPU, float32)."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(cfg).__name__}")
    cfg.validate()
    if cfg.arch == "segformer":
        from emb.models.segformer import SegFormer

        return SegFormer(cfg)
    from emb.models.deeplab import DeepLabV3Plus

    return DeepLabV3Plus(cfg)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameter elements (``requires_grad``) in ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
