"""Tiles (fixed-size windows) and their spatial train/val/test split.

Splits are assigned per square block of ``block_m`` metres in map coordinates: the blocks under
a raster's tiles are ordered by a seeded per-block draw (independent of the grid) and cut at
the configured fractions, so the fractions hold exactly and sources of one region on similar
extents get (nearly) the same split map. A tile whose footprint touches blocks of different
splits is dropped: no tile straddles splits.

The same ground in several years (regions of one split group, found by
:mod:`emb.prep.footprints`) draws its blocks with the group's id over the group's extent, so a
block has one split in every year it appears in.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from affine import Affine
from rasterio.windows import Window

from emb.classes import IGNORE

SPLITS = ("train", "val", "test")


class TilingError(ValueError):
    """A tiling request that cannot give any tile."""


@dataclass(frozen=True)
class TileSpec:
    size: int = 64
    stride: int | None = None  # None: equal to size (no overlap)
    min_valid: float = 0.25  # minimum fraction of labelled pixels


@dataclass(frozen=True)
class SplitSpec:
    block_m: float = 1280.0
    fractions: dict[str, float] = field(
        default_factory=lambda: {"train": 0.7, "val": 0.15, "test": 0.15}
    )
    seed: int = 0
    buffer_m: float = 0.0  # drop tiles within this distance of a block of another split
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


@dataclass(frozen=True)
class Tile:
    row: int
    col: int
    size: int
    split: str
    labelled: int
    block: str = ""  # "{split key}:{bx},{by}": the split block holding the tile's centre

    @property
    def window(self) -> Window:
        return Window(self.col, self.row, self.size, self.size)


def tile_windows(
    height: int, width: int, spec: TileSpec, offset: tuple[int, int] = (0, 0)
) -> list[Window]:
    """Row-major windows of ``spec.size`` on the grid of stride ``spec.stride`` through pixel
    ``offset`` (row, col) that meet the raster: rows and columns may be negative or reach past
    its edge (read as nodata), so every pixel lies in some window."""
    stride = spec.stride or spec.size

    def starts(first: int, n: int) -> range:  # the grid's first start with a pixel >= 0
        return range(first + math.ceil((1 - spec.size - first) / stride) * stride, n, stride)

    return [
        Window(col, row, spec.size, spec.size)
        for row in starts(offset[0], height)
        for col in starts(offset[1], width)
    ]


def block_aligned_offset(transform: Affine, stride: int, block_m: float) -> tuple[int, int]:
    """(row, col) of the first tile origin that falls on a block edge, so tiles tessellate the
    blocks instead of straddling them (exact when the block is a multiple of the stride)."""
    col = round((math.ceil(transform.c / block_m) * block_m - transform.c) / transform.a)
    row = round((math.ceil(transform.f / block_m) * block_m - transform.f) / transform.e)
    return row % stride, col % stride


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


def _check_block_m(block_m: float, transform: Affine) -> None:
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


def _near_other_split(
    window: Window, transform: Affine, splits: dict, spec: SplitSpec, split: str
) -> bool:
    """Whether the window grown by ``spec.buffer_m`` reaches a block of another split."""
    pad = math.ceil(spec.buffer_m / abs(transform.a))
    grown = Window(window.col_off - pad, window.row_off - pad,
                   window.width + 2 * pad, window.height + 2 * pad)  # fmt: skip
    return any(splits.get(b, split) != split for b in blocks_of(grown, transform, spec.block_m))


def plan_tiles(
    labels: np.ndarray,
    transform: Affine,
    region: str,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    fixed_split: str | None = None,
) -> tuple[list[Tile], dict[str, Counter[str]]]:
    """Kept tiles of an (H, W) uint8 label raster, and the dropped tiles counted per split and
    reason (tiles straddling splits count under ``"unassigned"``).

    ``fixed_split`` puts the whole region in one split (``regions.tsv`` column ``split``).
    """
    kept, dropped, _ = _plan(labels, transform, region, tile_spec, split_spec, fixed_split)
    return kept, dropped


def _plan(
    labels: np.ndarray,
    transform: Affine,
    region: str,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    fixed_split: str | None = None,
) -> tuple[list[Tile], dict[str, Counter[str]], dict]:
    """:func:`plan_tiles` and the block -> split map it drew."""
    kept: list[Tile] = []
    dropped: dict[str, Counter[str]] = {name: Counter() for name in (*SPLITS, "unassigned")}
    stride = tile_spec.stride or tile_spec.size
    size = tile_spec.size
    _check_block_m(split_spec.block_m, transform)
    offset = (0, 0) if fixed_split else block_aligned_offset(transform, stride, split_spec.block_m)
    windows = tile_windows(*labels.shape, tile_spec, offset)
    blocks = [b for win in windows for b in blocks_of(win, transform, split_spec.block_m)]
    if split_spec.extent is not None:  # one draw over the ground every year of it shares
        blocks += blocks_in(split_spec.extent, split_spec.block_m)
    key = split_spec.group or region
    splits = assign_blocks(key, blocks, split_spec)
    padded = np.pad(labels, size, constant_values=IGNORE)  # windows past the edge: no label
    for win in windows:
        split = fixed_split or window_split(win, transform, splits, split_spec)
        if split is None:
            dropped["unassigned"]["straddles_splits"] += 1
            continue
        r, c = win.row_off + size, win.col_off + size
        labelled = int((padded[r : r + size, c : c + size] != IGNORE).sum())
        if labelled < tile_spec.min_valid * size * size:
            dropped[split]["too_little_valid"] += 1
            continue
        if (
            not fixed_split
            and split_spec.buffer_m > 0
            and _near_other_split(win, transform, splits, split_spec, split)
        ):
            dropped[split]["within_buffer"] += 1
            continue
        bx, by = _centre_block(win, transform, split_spec.block_m)
        block = f"{key}:{bx},{by}"
        kept.append(Tile(win.row_off, win.col_off, size, split, labelled, block))
    return kept, dropped, splits


def _centre_block(window: Window, transform: Affine, block_m: float) -> tuple[int, int]:
    x, y = transform @ (window.col_off + window.width / 2, window.row_off + window.height / 2)
    return math.floor(x / block_m), math.floor(y / block_m)


def label_coverage(
    labels: np.ndarray, tiles: list[Tile], fixed_split: str | None = None
) -> dict[str, dict[str, float]]:
    """Per split of the kept tiles: the region's labelled pixels inside some kept tile of that
    split (``covered``, and ``share`` of all its labelled pixels); under ``"all"`` the same
    for any kept tile, with ``labelled`` (the total). Why: a
    grid that loses the edges of a small area is visible in the data report, not silent."""
    covered = np.zeros(labels.shape, bool)
    out: dict[str, dict[str, float]] = {}
    total = int((labels != IGNORE).sum())
    height, width = labels.shape
    for split in SPLITS:
        mask = np.zeros(labels.shape, bool)
        for t in (t for t in tiles if t.split == split):
            r0, c0 = max(t.row, 0), max(t.col, 0)
            mask[r0 : min(t.row + t.size, height), c0 : min(t.col + t.size, width)] = True
        covered |= mask
        part = int((mask & (labels != IGNORE)).sum())
        out[split] = {"covered": part, "share": part / total if total else 0.0}
    all_covered = int((covered & (labels != IGNORE)).sum())
    out["all"] = {
        "covered": all_covered,
        "labelled": total,
        "share": all_covered / total if total else 0.0,
    }
    return out


def count_tiles(
    transform: Affine,
    width: int,
    height: int,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    valid: np.ndarray | None = None,
    region: str = "",
    fixed_split: str | None = None,
) -> int:
    """How many tiles a region of this raster grid would keep, before any job: ``valid`` is
    its (height, width) label-valid footprint (True = labelled); without it the whole raster
    extent counts as labelled. 0 means the area has no tile at ``min_valid``."""
    labels = np.zeros((height, width), np.uint8)
    if valid is not None:
        if valid.shape != (height, width):
            raise TilingError(
                f"valid footprint: expected shape ({height}, {width}), found {valid.shape}"
            )
        labels[~valid] = IGNORE
    kept, _ = plan_tiles(labels, transform, region, tile_spec, split_spec, fixed_split)
    return len(kept)
