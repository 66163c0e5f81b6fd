"""Spatial split blocks: squares of ``block_m`` metres in map coordinates, each drawn whole
into one split by a seeded per-block number, so the split map does not depend on any raster
grid (:mod:`emb.prep.tiles` puts tiles on it)."""

from __future__ import annotations

import math
import zlib
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
