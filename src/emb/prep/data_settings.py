"""The settings a source's data gets from the config: its tiling and split, read in one place.

The config's ``tiles`` (size, stride, min_valid), ``splits`` (block_m, fractions, seed,
buffer_m) and ``shards`` sections hold the settings for your own data; for demo data (a source
whose training regions are the demo's rasters) the ``demo: overlay:`` sections go over them.
:func:`tiling_in_force` is the one reader of the tiling and split: the shards rule's params,
the parse-time checks (stride, block size, the model's downsampling) and the areas' tile-yield
check all get them from it, so a null stride is the tile size *of the tiling in force* (the
overlay's for demo data) wherever it is read (:func:`emb.prep.tiles.stride_or_size`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from emb.config_schema import config_default
from emb.prep.spatial_split import SPLITS, SplitSpec, TilingError
from emb.prep.tiles import TileSpec, check_stride, stride_or_size

SETTINGS = {  # the tiling's and the split's keys, per config section
    "tiles": ("size", "stride", "min_valid"),
    "splits": ("block_m", "fractions", "seed", "buffer_m"),
}


def overlaid(config: Mapping, section: str, demo: bool) -> dict:
    """``config[section]`` (tiles, splits, shards) for a source's regions, as given: the
    config's for your own data, with the demo's small settings (``demo: overlay:``) over them
    for demo data only (``demo``: the source's regions are the demo's rasters)."""
    overlay = config["demo"]["overlay"].get(section, {}) if demo else {}
    return {**(config.get(section) or {}), **overlay}


def setting_key(config: Mapping, section: str, key: str, demo: bool) -> str:
    """The config key a source's data setting comes from (``demo.overlay.tiles.size`` where the
    demo's overlay gives it, else ``tiles.size``): what a refusal names."""
    overlay = config["demo"]["overlay"].get(section, {}) if demo else {}
    return f"demo.overlay.{section}.{key}" if key in overlay else f"{section}.{key}"


@dataclass(frozen=True)
class Tiling:
    """The tiling and split in force for a source's data: ``tiles`` and ``splits`` as the
    shards rule passes them (the config's values, the overlay's over them, the stride
    resolved), and the config key each setting came from (``keys["tiles.size"]``)."""

    tiles: dict[str, Any]
    splits: dict[str, Any]
    keys: dict[str, str]

    def setting(self, name: str) -> Any:
        """``name`` (``"tiles.size"``) as in force; the schema's default where a partial config
        (a plan checked alone) lacks it, as a run of the workflow would get it."""
        section, key = name.split(".")
        given = getattr(self, section)
        return given[key] if key in given else config_default(name)

    def tile_spec(self) -> TileSpec:
        """The tiling as :mod:`emb.prep.tiles` cuts it; a stride past the tile is refused
        (:class:`TilingError`, naming the keys it came from)."""
        size, stride = int(self.setting("tiles.size")), int(self.setting("tiles.stride"))
        try:
            check_stride(size, stride, (self.keys["tiles.size"], self.keys["tiles.stride"]))
        except TilingError as err:
            raise TilingError(f"config {err}") from None
        return TileSpec(size, stride, float(self.setting("tiles.min_valid")))

    def split_spec(self, **changes: Any) -> SplitSpec:
        """The split blocks as :mod:`emb.prep.spatial_split` draws them (``changes``: fields
        replaced, e.g. a region's group key)."""
        fields = {
            "block_m": float(self.setting("splits.block_m")),
            "fractions": dict(zip(SPLITS, self.setting("splits.fractions"), strict=True)),
            "seed": int(self.setting("splits.seed")),
            "buffer_m": float(self.setting("splits.buffer_m")),
        }
        return SplitSpec(**{**fields, **changes})  # checked once, as changed


def tiling_in_force(config: Mapping, demo: bool = False) -> Tiling:
    """The tiling and split a source's shards jobs get from ``config`` (``demo``: demo data,
    the overlay's settings over the config's): the one place the config's tiling is read."""
    tiles, splits = overlaid(config, "tiles", demo), overlaid(config, "splits", demo)
    size = tiles.get("size", config_default("tiles.size"))
    tiles["stride"] = stride_or_size(size, tiles.get("stride"))
    keys = {f"{section}.{key}": setting_key(config, section, key, demo)
            for section, names in SETTINGS.items() for key in names}  # fmt: skip
    return Tiling(tiles, splits, keys)


def data_settings(config: Mapping, section: str, demo: bool) -> dict:
    """``config[section]`` (tiles, splits, shards) for a source's regions as its jobs get it:
    the tiling and split from :func:`tiling_in_force`, the other sections overlaid alike."""
    if section in SETTINGS:
        return getattr(tiling_in_force(config, demo), section)
    return overlaid(config, section, demo)
