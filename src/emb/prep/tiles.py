"""Tiles (fixed-size windows) and their spatial train/val/test split.

Splits are assigned per square block of ``block_m`` metres in map coordinates: the blocks under
a raster's tiles are ordered by a seeded per-block draw (independent of the grid) and cut at
the configured fractions, so the fractions hold exactly and sources of one region on similar
extents get (nearly) the same split map. A tile whose footprint touches blocks of different
splits is dropped: no tile straddles splits.

Tiles lie on a grid anchored to the CRS at block edges (neighbouring regions' tiles line up)
and may reach past the raster's edge (read as nodata); a tile is kept when ``min_valid`` of it
is labelled. Where that drops the pieces of a small area, training tiles half a tile off the
grid may gather them (:mod:`emb.prep.shifted_tiles`).

The same ground in several years (regions of one split group, found by
:mod:`emb.prep.footprints`) draws its blocks with the group's id over the group's extent, so a
block has one split in every year it appears in.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
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

# Spatial split blocks: squares of ``block_m`` metres in map coordinates, each drawn whole.

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


class TilingError(ValueError):
    """A tiling request that cannot give any tile."""


def _fractions() -> dict[str, float]:
    return dict(zip(SPLITS, config_default("splits.fractions"), strict=True))


# The tile and block sizes have no default: they set the tiling's scale together (the demo's
# 64 px in 1280 m blocks, the config's 256 px in 5120 m; a tile larger than a block is dropped
# as straddling), so a caller states both. The other settings default to the config schema's.
@dataclass(frozen=True)
class TileSpec:
    size: int
    stride: int | None = None  # None: equal to size (no overlap); at most size (no gaps)
    min_valid: float = field(  # minimum fraction of labelled pixels
        default_factory=lambda: float(config_default("tiles.min_valid"))
    )

    def __post_init__(self) -> None:
        check_stride(self.size, self.stride)


def check_stride(
    size: int, stride: int | None, keys: tuple[str, str] = ("tiles.size", "tiles.stride")
) -> None:
    """Refuse a stride larger than the tile (:class:`TilingError`, naming ``keys``: the size's
    and the stride's settings): the gaps between tiles would hold pixels of no tile, neither
    trained nor scored on, and :func:`tile_windows` promises every pixel a window."""
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
class SplitSpec:
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
    stride, size = tile_spec.stride or tile_spec.size, tile_spec.size
    _check_block_m(split_spec.block_m, transform)
    offset = (0, 0) if fixed_split else block_aligned_offset(transform, stride, split_spec.block_m)
    windows = tile_windows(*shape, tile_spec, offset)
    blocks = [b for win in windows for b in blocks_of(win, transform, split_spec.block_m)]
    if split_spec.extent is not None:  # one draw over the ground every year of it shares
        blocks += blocks_in(split_spec.extent, split_spec.block_m)
    key = split_spec.group or region
    splits = assign_blocks(key, blocks, split_spec)

    def buffered(win: Window, split: str) -> bool:
        return not fixed_split and split_spec.buffer_m > 0 and _near_other_split(
            win, transform, splits, split_spec, split)  # fmt: skip

    def tile(win: Window, split: str, labelled: int) -> Tile:
        bx, by = _centre_block(win, transform, split_spec.block_m)
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


def _centre_block(window: Window, transform: Affine, block_m: float) -> tuple[int, int]:
    x, y = transform @ (window.col_off + window.width / 2, window.row_off + window.height / 2)
    return math.floor(x / block_m), math.floor(y / block_m)


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
