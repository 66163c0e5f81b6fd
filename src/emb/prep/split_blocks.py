"""Spatial split blocks: squares of ``block_m`` metres in map coordinates, each drawn whole
into one split by a seeded per-block number, so the split map does not depend on any raster
grid (:mod:`emb.prep.tiles` puts tiles on it)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from emb.prep.tiles import SplitSpec

SPLITS = ("train", "val", "test")


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


class SplitBlocksError(ValueError):
    """Split blocks that cannot give every split a tile, known before any job."""


@dataclass(frozen=True)
class BlockGround:
    """A region as the block count sees it: its id, its split column, the extent its blocks
    are drawn over (x0, y0, x1, y1 in its CRS; a split group's shared one) and that draw's
    key (the group's id; the region's own when alone)."""

    region: str
    split: str
    extent: tuple[float, float, float, float]
    key: str


def check_blocks_hold_splits(
    source: str, grounds: Sequence[BlockGround], block_m: float, where: str
) -> None:
    """Refuse, before any job, a ``block_m`` that leaves a source fewer blocks than splits:
    a block goes whole to one split, so the blocks meeting the regions' extents (one draw
    per group) plus the fixed splits bound the splits that can get a tile, and the shards'
    manifest needs train, val and test each. Without this a block larger than the region is
    found at job time, after every shard was rebuilt all-train."""
    if not grounds or not math.isfinite(block_m) or block_m <= 0:
        return
    fixed = {g.split for g in grounds if g.split in SPLITS}
    drawn: dict[str, tuple[BlockGround, int]] = {}
    for g in grounds:
        if g.split in SPLITS:
            continue
        drawn.setdefault(g.key, (g, len(blocks_in(g.extent, block_m))))
    reachable = len(fixed) + sum(min(n, len(SPLITS)) for _, n in drawn.values())
    if reachable >= len(SPLITS):
        return
    sizes = "; ".join(
        f"{'group ' + key if key != g.region else 'region ' + g.region} is "
        f"{_km(g.extent[2] - g.extent[0])} x {_km(g.extent[3] - g.extent[1])} "
        f"({n} block{'s' * (n != 1)})"
        for key, (g, n) in drawn.items()
    )
    fixed_text = f"; fixed splits {sorted(fixed)}" if fixed else ""
    raise SplitBlocksError(
        f"{where}: splits.block_m {block_m:g} m: the {source} regions' extents meet blocks of "
        f"at most {reachable} of the {len(SPLITS)} splits ({sizes}{fixed_text}): a block goes "
        "whole to one split and train, val and test each need one; set splits.block_m "
        "smaller than the regions (a few blocks across each) or add regions"
    )


def _km(metres: float) -> str:
    return f"{metres / 1000:.3g} km"
