"""A model's hyper-parameters (``ModelConfig``), checked, and what follows from the tile size
(DeepLab's atrous rates). Below the architectures, which build from it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from emb.models.train_defaults import schema_defaults

ARCHS = ("segformer", "deeplab")
TUPLE_FIELDS = ("widths", "depths", "aspp_rates", "num_classes")
OUTPUT_STRIDE = 16  # DeepLab's ASPP reads a (tile / 16)-px map
UNKNOWN_TILE = 64  # the tile size assumed by a model built without one (e.g. in a notebook)


def aspp_rates_for(tile_size: int) -> tuple[int, ...]:
    """DeepLab's atrous rates scaled to ``tile_size``: 6/12/18 were set for a 33-px ASPP input
    (513-px crops), i.e. steps of a sixth of it; here the input is tile/16 px, and a rate at
    or above that reads only padding, so rates stop one below it (64 px -> (1, 2, 3),
    256 px -> (3, 6, 9), 32 px -> (1,))."""
    side = tile_size // OUTPUT_STRIDE
    step, top = max(1, round(side / 6)), max(1, side - 1)
    return tuple(sorted({min(step * i, top) for i in (1, 2, 3)}))


@dataclass(frozen=True)
@schema_defaults("model", tuples=TUPLE_FIELDS)
class ModelConfig:
    """Model hyper-parameters; ``ModelConfig(**yaml_dict)`` works (lists become tuples). Every
    default is the training schema's ``model:`` one (:mod:`emb.models.train_defaults`).

    Values are checked by ``validate()`` (called by ``build_model``), not on construction.
    """

    arch: str  # "segformer" | "deeplab"
    in_dim: int  # 64 (AEF) or 128 (TESSERA)
    widths: tuple[int, ...]  # channels per encoder stage
    depths: tuple[int, ...]  # blocks per stage
    decoder_dim: int  # SegFormer MLP decoder / DeepLab ASPP + decoder width
    aspp_rates: tuple[int, ...] | None  # DeepLab atrous rates; None: from the tile size
    input_norm: bool  # learned LayerNorm over channels on the raw input
    num_classes: tuple[int, int, int]  # L1, L2, L3
    drop_path: float  # max stochastic-depth rate (linear over blocks)

    def __post_init__(self) -> None:
        for name in TUPLE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def for_tile(self, tile_size: int) -> ModelConfig:
        """This config on ``tile_size``-px tiles: ``aspp_rates`` derived when None; explicit
        rates that read only padding there (at or above tile/16) are refused."""
        if self.arch != "deeplab":
            return self
        if self.aspp_rates is None:
            return replace(self, aspp_rates=aspp_rates_for(tile_size))
        top = max(1, tile_size // OUTPUT_STRIDE - 1)
        if max(self.aspp_rates) > top:
            raise ValueError(
                f"aspp_rates: expected rates of at most {top} on {tile_size}-px tiles (the "
                f"ASPP input is {tile_size // OUTPUT_STRIDE} px, larger rates read only "
                f"padding), found {list(self.aspp_rates)}; or null to derive them from the tile"
            )
        return self

    def validate(self) -> None:
        """Raise ValueError naming the offending field and what it allows."""
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        _check_positive_int("in_dim", self.in_dim)
        _check_positive_int("decoder_dim", self.decoder_dim)
        for name in TUPLE_FIELDS:
            value = getattr(self, name)
            if name == "aspp_rates" and value is None:
                continue  # derived from the tile size (for_tile)
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
