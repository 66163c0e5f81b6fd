"""Tiles: fixed-size windows of a region's raster, cut on a grid and kept by their labels.

Tiles lie on a grid anchored to the CRS at split-block edges (neighbouring regions' tiles line
up; the blocks and their draw are :mod:`emb.prep.spatial_split`'s) and may reach past the
raster's edge (read as nodata); a tile is kept when ``min_valid`` of it is labelled and its
blocks share one split. Where that drops the pieces of a small area, training tiles half a tile
off the grid may gather them (:mod:`emb.prep.shifted_tiles`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import rasterio.windows
import shapely
from affine import Affine
from rasterio.transform import array_bounds
from rasterio.windows import Window
from shapely.geometry.base import BaseGeometry

from emb.classes import IGNORE
from emb.config_schema import config_default
from emb.prep.shifted_tiles import fill_windows
from emb.prep.spatial_split import (
    SPLITS,
    SplitSpec,
    TilingError,
    assign_blocks,
    blocks_in,
    blocks_of,
    centre_block,
    check_block_m,
    near_other_split,
    window_split,
)


# The tile and block sizes have no default: they set the tiling's scale together (the demo's
# 64 px in 1280 m blocks, the config's 256 px in 5120 m; a tile larger than a block is dropped
# as straddling), so a caller states both. The other settings default to the config schema's.
@dataclass(frozen=True)
class TileSpec:
    """A tiling: the tile's side (px), the step between tile origins (px; None given: the
    size, :func:`stride_or_size`) and the share of a tile's pixels that must be labelled."""

    size: int
    stride: int | None = None  # at most size (no gaps); None given: the size, set at init
    min_valid: float = field(  # minimum fraction of labelled pixels
        default_factory=lambda: float(config_default("tiles.min_valid"))
    )

    def __post_init__(self) -> None:
        check_stride(self.size, self.stride)
        object.__setattr__(self, "stride", stride_or_size(self.size, self.stride))


def stride_or_size(size: int, stride: int | None) -> int:
    """The step between tile origins: a null stride (the config's default) is the tile size,
    tiles side by side without overlap or gaps. The one place this rule lives: the config's
    tiling (:func:`emb.prep.data_settings.tiling_in_force`, with the demo overlay's size for
    demo data) and every :class:`TileSpec` resolve it here."""
    return size if stride is None else stride


def check_stride(
    size: int, stride: int | None, keys: tuple[str, str] = ("tiles.size", "tiles.stride")
) -> None:
    """Refuse a stride larger than the tile (:class:`TilingError`, naming ``keys``: the size's
    and the stride's settings): the gaps between tiles would hold pixels of no tile, neither
    trained nor scored on, and :func:`tile_windows` promises every pixel a window. A stride
    below one pixel (a stage run by hand: the schema's minimum is 1) is refused too."""
    if stride is not None and stride < 1:
        raise TilingError(
            f"{keys[1]} {stride}: expected at least 1 pixel between tile origins (null: the "
            "tile size)"
        )
    if stride is None or stride <= size:
        return
    gaps = 1 - (size / stride) ** 2
    raise TilingError(
        f"{keys[1]} {stride} is larger than {keys[0]} {size}: the gaps between tiles would "
        f"leave {gaps:.0%} of the pixels (1 - ({size}/{stride})^2) in no tile, neither trained "
        f"nor scored on; expected a stride of at most {size} (null: the tile size, no gaps; "
        "smaller: overlapping tiles)"
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
    stride = spec.stride

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


def plan_tiles(
    labels: np.ndarray,
    transform: Affine,
    region: str,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    fixed_split: str | None = None,
) -> tuple[list[Tile], dict[str, Counter[str]]]:
    """Kept tiles of an (H, W) uint8 label raster, and the dropped tiles counted per split and
    reason (tiles straddling splits count under ``"unassigned"``). Where train tiles of the
    grid were dropped for too few labels, tiles half a tile off it may follow them
    (:mod:`emb.prep.shifted_tiles`).

    ``fixed_split`` puts the whole region in one split (``regions.tsv`` column ``split``).
    """
    valid = labels != IGNORE

    def labelled(w: Window) -> int:  # windows past the edge: no label there
        rows = slice(max(w.row_off, 0), max(w.row_off + w.height, 0))
        return int(np.count_nonzero(valid[rows, max(w.col_off, 0) : max(w.col_off + w.width, 0)]))

    return _plan(labels.shape, labelled, transform, region, tile_spec, split_spec, fixed_split)


def _plan(
    shape: tuple[int, int],
    labelled_in: Callable[[Window], int],
    transform: Affine,
    region: str,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    fixed_split: str | None = None,
) -> tuple[list[Tile], dict[str, Counter[str]]]:
    """:func:`plan_tiles` over an (H, W) grid whose windows hold ``labelled_in(window)``
    labelled pixels."""
    kept: list[Tile] = []
    dropped: dict[str, Counter[str]] = {name: Counter() for name in (*SPLITS, "unassigned")}
    stride, size = tile_spec.stride, tile_spec.size
    check_block_m(split_spec.block_m, transform)
    offset = (0, 0) if fixed_split else block_aligned_offset(transform, stride, split_spec.block_m)
    windows = tile_windows(*shape, tile_spec, offset)
    blocks = [b for win in windows for b in blocks_of(win, transform, split_spec.block_m)]
    if split_spec.extent is not None:  # one draw over the ground every year of it shares
        blocks += blocks_in(split_spec.extent, split_spec.block_m)
    key = split_spec.group or region
    splits = assign_blocks(key, blocks, split_spec)

    def buffered(win: Window, split: str) -> bool:
        return not fixed_split and split_spec.buffer_m > 0 and near_other_split(
            win, transform, splits, split_spec, split)  # fmt: skip

    def tile(win: Window, split: str, labelled: int) -> Tile:
        bx, by = centre_block(win, transform, split_spec.block_m)
        return Tile(win.row_off, win.col_off, size, split, labelled, f"{key}:{bx},{by}")

    sparse = []  # train windows with labelled pixels, too few: what shifted tiles may gather
    for win in windows:
        split = fixed_split or window_split(win, transform, splits, split_spec)
        if split is None:
            dropped["unassigned"]["straddles_splits"] += 1
            continue
        labelled = labelled_in(win)
        if labelled < tile_spec.min_valid * size * size:
            dropped[split]["too_little_valid"] += 1
            sparse += [win] if labelled and split == "train" else []
        elif buffered(win, split):
            dropped[split]["within_buffer"] += 1
        else:
            kept.append(tile(win, split, labelled))

    def shifted_split(win: Window) -> str | None:  # train, wholly in one block, off the buffer
        if len(blocks_of(win, transform, split_spec.block_m)) > 1:
            return None
        split = fixed_split or window_split(win, transform, splits, split_spec)
        return None if split != "train" or buffered(win, split) else split

    if sparse and stride == size and size % 2 == 0:  # with overlap, tiles are dense already
        need = max(tile_spec.min_valid * size * size, 1)
        done = [t.window for t in kept]
        kept += [
            tile(*f) for f in fill_windows(sparse, done, size, need, labelled_in, shifted_split)
        ]
    return kept, dropped


def label_coverage(labels: np.ndarray, tiles: list[Tile]) -> dict[str, dict[str, float]]:
    """Per split of the kept tiles: the region's labelled pixels inside some kept tile of that
    split (``covered``, and ``share`` of all its labelled pixels); under ``"all"`` the same
    for any kept tile, with ``labelled`` (the total). Why: a
    grid that loses the edges of a small area is visible in the data report, not silent."""
    valid = labels != IGNORE
    total, covered = int(valid.sum()), np.zeros(labels.shape, bool)
    out: dict[str, dict[str, float]] = {}
    for split in SPLITS:
        mask = np.zeros(labels.shape, bool)
        for t in (t for t in tiles if t.split == split):
            mask[max(t.row, 0) : t.row + t.size, max(t.col, 0) : t.col + t.size] = True
        covered |= mask
        part = int((mask & valid).sum())
        out[split] = {"covered": part, "share": part / max(total, 1)}
    part = int((covered & valid).sum())
    out["all"] = {"covered": part, "labelled": total, "share": part / max(total, 1)}
    return out


class Ground:
    """A footprint clipped to a raster's extent, with an STRtree of its (disjoint) polygons:
    a window's labelled area costs the parts near it, those wholly inside counted by their
    area and only those across its edge intersected. An area of 10,000 plots is otherwise an
    intersection with all of them per window (minutes to refuse an area). Built once per
    raster grid, it serves every tile size counted on it."""

    def __init__(self, footprint: BaseGeometry | None, extent: shapely.Polygon) -> None:
        self.extent = extent
        parts = shapely.get_parts(extent if footprint is None else footprint)
        if footprint is not None and len(parts) > 1:  # parts lie inside an area's extent
            tree = shapely.STRtree(parts)
            inside = tree.query(extent, predicate="contains_properly")
            edge = np.setdiff1d(tree.query(extent), inside)
            cut = shapely.get_parts(shapely.intersection(parts[edge], extent))
            parts = np.concatenate([parts[inside], cut])
        elif footprint is not None:
            parts = shapely.get_parts(footprint.intersection(extent))
        self.parts = parts[shapely.get_type_id(parts) == 3]  # polygons: what has an area
        self.areas = shapely.area(self.parts)
        self.tree = shapely.STRtree(self.parts)
        self.whole = shapely.multipolygons(self.parts)
        shapely.prepare(self.whole)  # most windows of a large area lie inside it
        self.known: dict[tuple[float, ...], float] = {}

    def area_in(self, box: shapely.Polygon) -> float:
        """The footprint's area inside ``box`` (map units squared); a box across its edge is
        remembered (the counts of several tile sizes and min_valid share windows)."""
        if self.whole.contains_properly(box):
            return float(box.area)
        key = box.bounds
        if (known := self.known.get(key)) is not None:
            return known
        inside = self.tree.query(box, predicate="contains_properly")
        edge = np.setdiff1d(self.tree.query(box), inside)
        cut = shapely.area(shapely.intersection(self.parts[edge], box)).sum()
        self.known[key] = area = float(self.areas[inside].sum() + cut)
        return area


def count_tiles(
    transform: Affine,
    width: int,
    height: int,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    footprint: BaseGeometry | Ground | None = None,
    region: str = "",
    fixed_split: str | None = None,
) -> int:
    """How many tiles a region of this raster grid would keep, before any job and without
    reading a pixel: ``footprint`` is its labelled ground (a geometry in the raster's CRS, or
    its :class:`Ground` on this grid; a tile's labelled pixels are its area inside it over the
    pixel's area); None: the whole raster extent. 0 means the area has no tile at
    ``min_valid``."""
    ground = (
        footprint
        if isinstance(footprint, Ground)
        else Ground(footprint, shapely.box(*array_bounds(height, width, transform)))
    )
    pixel = abs(transform.a * transform.e)

    def labelled(win: Window) -> int:
        box = shapely.box(*rasterio.windows.bounds(win, transform))
        return int(ground.area_in(box) / pixel + 0.5)

    kept, _ = _plan(
        (height, width), labelled, transform, region, tile_spec, split_spec, fixed_split
    )
    return len(kept)
