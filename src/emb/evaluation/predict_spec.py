"""The sliding windows' settings (:class:`PredictSpec`: window, overlap, block, batch) and
their checks, without torch or matplotlib: the predict stage maps with them
(:mod:`emb.evaluation.windows`) and the workflow refuses them at parse time
(:mod:`emb.workflow.parsed_runs`), which must not import torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from emb.config_schema import config_default
from emb.models.model_config import OUTPUT_STRIDE


@dataclass(frozen=True)
class PredictSpec:
    """Window size, overlap (fraction of the window), block side and batch, in pixels; the
    defaults are the config schema's ``predict.*`` (stated there once)."""

    tile: int
    overlap: float = field(default_factory=lambda: float(config_default("predict.overlap")))
    block: int = field(default_factory=lambda: int(config_default("predict.block")))
    batch_size: int = field(default_factory=lambda: int(config_default("predict.batch_size")))

    @property
    def stride(self) -> int:
        return self.tile - int(round(self.tile * self.overlap))

    @property
    def halo(self) -> int:
        """Pixels a block's windows reach beyond it, below and to the right."""
        return self.tile - self.stride

    @property
    def grid_block(self) -> int:
        """Side of the blocks the raster is processed in: ``block`` rounded up to a multiple
        of the stride (blocks own whole rows of windows) and at least the halo (a block's
        windows reach no further than the next block)."""
        steps = max(math.ceil(self.block / self.stride), math.ceil(self.halo / self.stride), 1)
        return steps * self.stride

    def check(self, multiple: int = 1, names: dict[str, str] | None = None) -> None:
        """Refuse settings that cannot map a raster (:class:`PredictSettingsError`), each
        named as the caller knows it (``names``: the stage's options by default; the config's
        keys at parse time) with a value that would work. ``multiple``: the model's total
        downsampling (:func:`model_downsampling`)."""
        name = {**STAGE_OPTIONS, **(names or {})}
        tile, overlap = self.tile, self.overlap
        check_window_side(tile, multiple, name["tile"])
        if not 0.0 <= overlap < 1.0:
            raise PredictSettingsError(
                f"{name['overlap']} {overlap}: expected a fraction of the window in [0, 1), "
                "e.g. 0.5"
            )
        if self.stride < 1:
            raise PredictSettingsError(
                f"{name['overlap']} {overlap}: at {tile}-px windows the stride (the window "
                f"less round({tile} x {overlap}) px of overlap) is {self.stride} px: the windows "
                f"would never advance; expected at most {(tile - 1) / tile:g} (a stride of 1 px)"
                ", e.g. 0.5"
            )
        for key, value in (("block", self.block), ("batch_size", self.batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PredictSettingsError(
                    f"{name[key]} {value}: expected a whole number >= 1, e.g. "
                    f"{config_default(f'predict.{key}')} (the default)"
                )


def check_window_side(tile: int, multiple: int, name: str) -> None:
    """Refuse a window (or tile) side the model cannot map: not a positive multiple of its
    total downsampling ``multiple`` (its maps would not line up with the input's pixels);
    ``name``: the setting as the caller gave it."""
    if isinstance(tile, bool) or not isinstance(tile, int) or tile <= 0 or tile % multiple:
        below = max(multiple, tile // multiple * multiple if isinstance(tile, int) else 0)
        raise PredictSettingsError(
            f"{name} {tile}: expected a positive multiple of {multiple} (the model's total "
            f"downsampling), e.g. {below} or {below + multiple}"
        )


class PredictSettingsError(ValueError):
    """Window settings that cannot map a raster: one line naming the setting as the caller
    gave it (a stage option, a config key), the value found and one that would work."""


STAGE_OPTIONS = {"tile": "--tile", "overlap": "--overlap", "block": "--block",
                 "batch_size": "--batch-size"}  # fmt: skip
"""How :meth:`PredictSpec.check` names each setting by default: the predict stage's options."""


def model_downsampling(arch: str, stages: int) -> int:
    """Input pixels per pixel of the model's coarsest map, which a window side must be a
    multiple of: SegFormer halves at each of its ``stages`` after a stride-4 stem
    (4 x 2**(stages - 1): 32 for four); DeepLab halves only until its output stride
    (:data:`OUTPUT_STRIDE`, 16) and dilates after it (see emb.models)."""
    full = 4 * 2 ** (max(stages, 1) - 1)
    return min(full, OUTPUT_STRIDE) if arch == "deeplab" else full
