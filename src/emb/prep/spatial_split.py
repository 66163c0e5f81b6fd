"""The spatial train/val/test split: square blocks of ``block_m`` metres, each drawn whole.

Splits are assigned per square block of ``block_m`` metres in map coordinates: the blocks under
a raster's tiles are ordered by a seeded per-block draw (independent of the grid) and cut at
the configured fractions, so the fractions hold exactly and sources of one region on similar
extents get (nearly) the same split map. :mod:`emb.prep.tiles` drops a tile whose footprint
touches blocks of different splits: no tile straddles splits.

The same ground in several years (regions of one split group, found by
:mod:`emb.prep.footprints`) draws its blocks with the group's id over the group's extent, so a
block has one split in every year it appears in. Before any job, :func:`check_blocks_hold_splits`
refuses a block size that cannot give train, val and test a block each.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from affine import Affine
from rasterio.windows import Window

from emb.config_schema import config_default

SPLITS = ("train", "val", "test")


class TilingError(ValueError):
    """A tiling request (tile, stride, split block or fractions) that cannot give any tile."""


class SplitBlocksError(ValueError):
    """Split blocks that cannot give every split a tile, known before any job."""


def _fractions() -> dict[str, float]:
    return dict(zip(SPLITS, config_default("splits.fractions"), strict=True))


@dataclass(frozen=True)
class SplitSpec:
    """How a region's blocks are drawn: their side, the splits' fractions, the draw's seed, the
    buffer kept off other splits' blocks, and the key and extent a split group shares."""

    block_m: float
    fractions: dict[str, float] = field(default_factory=_fractions)
    seed: int = field(default_factory=lambda: int(config_default("splits.seed")))
    buffer_m: float = field(  # drop tiles within this distance of a block of another split
        default_factory=lambda: float(config_default("splits.buffer_m"))
    )
    group: str = ""  # the id blocks are drawn with ("" = the region's own)
    extent: tuple[float, float, float, float] | None = None  # (x0, y0, x1, y1) of the group

    def __post_init__(self) -> None:
        if not math.isfinite(self.block_m) or self.block_m <= 0:
            raise TilingError(
                f"splits.block_m: expected a positive size in metres, found {self.block_m}"
            )
        bad = {k: v for k, v in self.fractions.items() if not (math.isfinite(v) and v >= 0)}
        if bad or sum(self.fractions.values()) <= 0:
            raise TilingError(
                "splits.fractions: expected non-negative numbers with a positive sum, "
                f"found {dict(self.fractions)}"
            )


def block_draw(region: str, bx: int, by: int, spec: SplitSpec) -> float:
    """A seeded uniform number per block, independent of any raster grid."""
    key = [spec.seed, zlib.crc32(region.encode()), bx & 0xFFFFFFFF, by & 0xFFFFFFFF]
    return float(np.random.default_rng(key).random())


def blocks_in(extent: tuple[float, float, float, float], block_m: float) -> list[tuple[int, int]]:
    """Every block (bx, by) meeting the extent (x0, y0, x1, y1), edges exclusive."""
    x0, y0, x1, y1 = extent
    bxs = range(math.floor(x0 / block_m), math.ceil(x1 / block_m))
    bys = range(math.floor(y0 / block_m), math.ceil(y1 / block_m))
    return [(bx, by) for bx in bxs for by in bys]


def assign_blocks(region: str, blocks: list[tuple[int, int]], spec: SplitSpec) -> dict:
    """Blocks -> split with exact fractions (largest remainder, every asked-for split >= 1
    block when there are enough), in the order of each block's seeded draw."""
    blocks = sorted(set(blocks), key=lambda b: block_draw(region, *b, spec))
    weights = np.array([spec.fractions.get(s, 0.0) for s in SPLITS], float)
    exact = weights / weights.sum() * len(blocks)
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: len(blocks) - counts.sum()]:
        counts[i] += 1
    for i in np.flatnonzero((weights > 0) & (counts == 0)):
        donor = int(np.argmax(counts))
        if counts[donor] > 1:
            counts[donor] -= 1
            counts[i] += 1
    names = [s for s, n in zip(SPLITS, counts, strict=True) for _ in range(n)]
    return dict(zip(blocks, names, strict=True))


def blocks_of(window: Window, transform: Affine, block_m: float) -> list[tuple[int, int]]:
    """Indices (bx, by) of every block holding a pixel centre of the window."""
    corners = [
        transform @ (window.col_off + dc, window.row_off + dr)
        for dr in (0.5, window.height - 0.5)
        for dc in (0.5, window.width - 0.5)
    ]
    xs, ys = zip(*corners, strict=True)
    bxs = range(math.floor(min(xs) / block_m), math.floor(max(xs) / block_m) + 1)
    bys = range(math.floor(min(ys) / block_m), math.floor(max(ys) / block_m) + 1)
    return [(bx, by) for bx in bxs for by in bys]


def check_block_m(block_m: float, transform: Affine) -> None:
    """A block smaller than a pixel would list one block per sub-pixel step: MemoryError."""
    pixel = max(abs(transform.a), abs(transform.e))
    if block_m < pixel:
        raise TilingError(
            f"splits.block_m: expected >= the pixel size ({pixel:g} m), found {block_m:g}"
        )


def window_split(window: Window, transform: Affine, splits: dict, spec: SplitSpec) -> str | None:
    """The split of the blocks under ``window``, or None when they disagree."""
    found = {splits[b] for b in blocks_of(window, transform, spec.block_m)}
    return found.pop() if len(found) == 1 else None


def near_other_split(
    window: Window, transform: Affine, splits: dict, spec: SplitSpec, split: str
) -> bool:
    """Whether the window grown by ``spec.buffer_m`` reaches a block of another split."""
    pad = math.ceil(spec.buffer_m / abs(transform.a))
    grown = Window(window.col_off - pad, window.row_off - pad,
                   window.width + 2 * pad, window.height + 2 * pad)  # fmt: skip
    return any(splits.get(b, split) != split for b in blocks_of(grown, transform, spec.block_m))


def centre_block(window: Window, transform: Affine, block_m: float) -> tuple[int, int]:
    """(bx, by) of the block holding the window's centre: a tile's block in the shards' index
    (the unit of evaluate's spatial-block bootstrap)."""
    x, y = transform @ (window.col_off + window.width / 2, window.row_off + window.height / 2)
    return math.floor(x / block_m), math.floor(y / block_m)


@dataclass(frozen=True)
class BlockGround:
    """A region as the block count sees it: its id, its split column, the extent its blocks
    are drawn over (x0, y0, x1, y1 in its CRS; a split group's shared one), that draw's key
    (the group's id; the region's own when alone) and its pixel size (metres; 0: unknown)."""

    region: str
    split: str
    extent: tuple[float, float, float, float]
    key: str
    pixel_m: float = 0.0


def block_count(extent: tuple[float, float, float, float], block_m: float) -> int:
    """How many blocks :func:`blocks_in` lists for ``extent``, without listing them (a block far
    below a pixel would list billions)."""
    x0, y0, x1, y1 = extent
    nx = math.ceil(x1 / block_m) - math.floor(x0 / block_m)
    ny = math.ceil(y1 / block_m) - math.floor(y0 / block_m)
    return max(nx, 0) * max(ny, 0)


def check_block_above_pixel(
    source: str, block_m: float, pixel_m: float, where: str, key: str = "splits.block_m"
) -> None:
    """Refuse a split block smaller than the ``source`` rasters' pixels (``pixel_m`` metres)
    before anything counts blocks: they would be listed one per sub-pixel step (a
    MemoryError at 1 mm), and a block holds whole tiles."""
    if block_m < pixel_m:
        raise SplitBlocksError(
            f"{where}: {key} {block_m:g} m: expected at least the pixel size of the {source} "
            f"rasters ({pixel_m:g} m): a split block is drawn whole into one split and holds "
            f"whole tiles; e.g. {config_default('splits.block_m'):g} (splits.block_m's default)"
        )


def check_blocks_hold_splits(
    source: str,
    grounds: Sequence[BlockGround],
    block_m: float,
    where: str,
    key: str = "splits.block_m",
) -> None:
    """Refuse, before any job, a ``block_m`` (the config's ``key``) smaller than the rasters'
    pixels or one that leaves a source fewer blocks than splits: a block goes whole to one
    split, so the blocks meeting the regions' extents (one draw per group) plus the fixed
    splits bound the splits that can get a tile, and the shards' manifest needs train, val
    and test each. Without this a block larger than the region is found at job time, after
    every shard was rebuilt all-train."""
    if not grounds or not math.isfinite(block_m) or block_m <= 0:
        return
    check_block_above_pixel(source, block_m, max(g.pixel_m for g in grounds), where, key)
    fixed = {g.split for g in grounds if g.split in SPLITS}
    drawn: dict[str, tuple[BlockGround, int]] = {}
    for g in grounds:
        if g.split in SPLITS:
            continue
        drawn.setdefault(g.key, (g, block_count(g.extent, block_m)))
    reachable = len(fixed) + sum(min(n, len(SPLITS)) for _, n in drawn.values())
    if reachable >= len(SPLITS):
        return
    if not drawn:  # every region has its split fixed: no block size can help
        missing = [s for s in SPLITS if s not in fixed]
        raise SplitBlocksError(
            f"{where}: every {source} region has a fixed split, together only "
            f"{sorted(fixed)}: train, val and test each need a region; set the split of a "
            f"region to auto (drawn by {key} blocks) or give regions of {missing}"
        )
    sizes = "; ".join(
        f"{'group ' + k if k != g.region else 'region ' + g.region} is "
        f"{_km(g.extent[2] - g.extent[0])} x {_km(g.extent[3] - g.extent[1])} "
        f"({n} block{'s' * (n != 1)})"
        for k, (g, n) in drawn.items()
    )
    fixed_text = f"; fixed splits {sorted(fixed)}" if fixed else ""
    raise SplitBlocksError(
        f"{where}: {key} {block_m:g} m: the {source} regions' extents meet blocks of "
        f"at most {reachable} of the {len(SPLITS)} splits ({sizes}{fixed_text}): a block goes "
        f"whole to one split and train, val and test each need one; set {key} "
        "smaller than the regions (a few blocks across each) or add regions"
    )


def _km(metres: float) -> str:
    return f"{metres / 1000:.3g} km"
