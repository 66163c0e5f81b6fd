"""The test split as counts: every test tile's pixels of every region a run trains on, held as
the joint histogram of (map L3, CDL L3) pixels (per district too), which is all a stratified
sample's estimates need (:mod:`emb.estimation.holdout_check` draws from it).

The population: every test tile's pixels (each once, tiles may overlap), where the map gives a
class and the CDL is labelled (255 on either side is left out: an unlabelled pixel has no
reference). At the scale of a state (issue 58, item 5) it is streamed from each region's test
tiles a band of tile rows at a time: memory is a few strips whatever the number of regions,
time linear in the pixels (``bench/state_scale.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from rasterio.windows import Window

from emb.classes import IGNORE, N_L1, N_L2, N_L3, ClassMap
from emb.estimation import cell_census
from emb.estimation.cell_census import add_census
from emb.estimation.districts import Districts, MapDistricts, district_burn, on_map_once
from emb.estimation.population import (
    CHUNK,
    STRIP_BYTES,
    PlaneRing,
    cache_bytes,
    level_table,
    map_pixel_ha,
    one_env,
    read_ahead,
)
from emb.forks import forked_workers, in_parts, shares
from emb.io import reading
from emb.prep.region_index import read_index, tile_origin, windows_of_test_tiles

LEVEL_CLASSES = {1: N_L1, 2: N_L2, 3: N_L3}
PAIRS = 256 * 256  # (map value, CDL value) codes of two uint8 pixels
SHARES_A_WORKER = 4  # regions differ in size: more shares than workers even out their loads


class AreaCheckError(ValueError):
    """The test split cannot be checked: a shard index, map or label raster that does not fit."""


@dataclass(frozen=True)
class TestSplitCounts:
    """The test split as its joint histogram: ``joint[i, j]`` pixels the map gives L3 class i
    and the CDL L3 class j (every estimate of a stratified sample needs no more)."""

    __test__ = False  # its name starts with Test: pytest must not collect it where imported

    joint: np.ndarray  # (N_L3, N_L3) int64
    pixel_ha: float
    regions: tuple[str, ...]
    # with districts: (D + 1, N_L3, N_L3) int64 the same counts per domain (0 the outside,
    # i district i), named by ``domain_names``; ``joint`` is their sum
    domains: np.ndarray | None = None
    domain_names: tuple[str, ...] = ()

    @classmethod
    def from_pixels(
        cls, mapped: np.ndarray, reference: np.ndarray, pixel_ha: float, regions: tuple[str, ...]
    ) -> TestSplitCounts:
        """The population of aligned per-pixel L3 vectors (map, CDL), e.g. a synthetic scene
        in a test; pixels with 255 on either side are left out, as the rasters' are."""
        return cls(_pair_counts(np.asarray(mapped), np.asarray(reference), "pixels"),
                   pixel_ha, regions)  # fmt: skip

    @property
    def pixels(self) -> int:
        """The population's size: test pixels that both the map and the CDL label."""
        return int(self.joint.sum())

    def mapped_px(self, level: int, cmap: ClassMap) -> np.ndarray:
        """(K,) int64 the map's pixels per class at ``level``."""
        return _collapse(self.joint.sum(1), level, cmap)

    def cdl_px(self, level: int, cmap: ClassMap) -> np.ndarray:
        """(K,) int64 the CDL's pixels per class at ``level``."""
        return _collapse(self.joint.sum(0), level, cmap)


def _collapse(l3_px: np.ndarray, level: int, cmap: ClassMap) -> np.ndarray:
    """(K,) int64 pixels per class at ``level`` from (N_L3,) pixels per L3 class."""
    table = level_table(level, cmap)[:N_L3]
    return np.bincount(table, weights=l3_px, minlength=LEVEL_CLASSES[level]).astype(np.int64)


def _pair_counts(mapped: np.ndarray, reference: np.ndarray, where: str) -> np.ndarray:
    """(N_L3, N_L3) int64 pixels per (map, CDL) L3 pair of two aligned uint8 arrays, 255 on
    either side left out; a value that is neither an L3 id nor 255 is refused naming
    ``where``."""
    pairs = np.zeros(PAIRS, np.int64)
    _add_pairs(pairs, mapped, reference)
    return _joint_of(pairs, where)


def _add_pairs(pairs: np.ndarray, mapped: np.ndarray, reference: np.ndarray) -> None:
    """Add to ``pairs`` (PAIRS,) the pixels per code ``map << 8 | CDL``: the two bytes side by
    side read as one little-endian uint16 (one copy, not three passes), bincounted in chunks
    (bincount copies its input as int64)."""
    m, r = mapped.ravel(), reference.ravel()
    both = np.empty((min(CHUNK, m.size), 2), np.uint8)
    for start in range(0, m.size, CHUNK):
        part = both[: min(CHUNK, m.size - start)]
        part[:, 0], part[:, 1] = r[start : start + len(part)], m[start : start + len(part)]
        pairs += np.bincount(part.view("<u2").ravel(), minlength=PAIRS)


def _joint_of(pairs: np.ndarray, where: str) -> np.ndarray:
    """(N_L3, N_L3) int64 of the (PAIRS,) counts, the pairs with 255 left out; values that
    are neither an L3 id nor 255 are refused naming ``where``."""
    grid = pairs.reshape(256, 256)
    for axis, side in ((1, "map"), (0, "CDL")):
        found = np.flatnonzero(grid.sum(axis)[N_L3:IGNORE]) + N_L3
        if found.size:
            raise AreaCheckError(
                f"{where}: {side} values {found.tolist()} are neither L3 class ids "
                f"(0..{N_L3 - 1}) nor {IGNORE}"
            )
    return grid[:N_L3, :N_L3].copy()


def bands(windows: Sequence[Window], height: int, width: int) -> Iterator[tuple[int, int, list]]:
    """The union of ``windows`` (clipped to a height x width raster) as disjoint pieces, top
    to bottom: (row0, row1, [(col0, col1), ...]) for each band of rows between two tile edges,
    its columns the merged spans of the tiles that cross it. Each pixel of the union lies in
    exactly one piece, so overlapping tiles count it once, with no mask of the raster; bands
    next to each other with the same spans are one (tiles in rows of a grid: one read)."""
    boxes = [(int(w.row_off), int(w.row_off + w.height), int(w.col_off), int(w.col_off + w.width))
             for w in windows]  # fmt: skip
    return box_bands(np.array(boxes, np.int64).reshape(-1, 4), height, width)


def box_bands(boxes: np.ndarray, height: int, width: int) -> Iterator[tuple[int, int, list]]:
    """:func:`bands` of (n, 4) int64 boxes (row0, row1, col0, col1), the tiles as arrays: a
    region's hundreds of test tiles merged in a few array passes (a tile crossing several bands
    is one entry per band), not a loop a tile."""
    b = boxes.copy()
    b[:, 0], b[:, 1] = np.maximum(b[:, 0], 0), np.minimum(b[:, 1], height)
    b[:, 2], b[:, 3] = np.maximum(b[:, 2], 0), np.minimum(b[:, 3], width)
    b = b[(b[:, 1] > b[:, 0]) & (b[:, 3] > b[:, 2])]
    edges = np.unique(b[:, :2])
    first, last = np.searchsorted(edges, b[:, 0]), np.searchsorted(edges, b[:, 1])
    each = last - first  # the bands between two edges that a tile crosses: first..last - 1
    starts = np.repeat(np.cumsum(each) - each, each)
    band = np.repeat(first, each) + np.arange(int(each.sum())) - starts
    c0, c1 = np.repeat(b[:, 2], each), np.repeat(b[:, 3], each)
    order = np.lexsort((c0, band))
    band, c0, c1 = band[order], c0[order], c1[order]
    stride = width + 1  # one band's columns apart from the next's: a running max per band
    reach = np.maximum.accumulate(band * stride + c1)
    new = np.ones(len(band), bool)
    new[1:] = band[1:] * stride + c0[1:] > reach[:-1]  # a span starts past the ones before
    first_of = np.flatnonzero(new)
    last_of = np.append(first_of[1:], len(band)) - 1
    spans: dict[int, list[tuple[int, int]]] = {}
    ends = reach[last_of] - band[first_of] * stride
    for i, a, z in zip(band[first_of].tolist(), c0[first_of].tolist(), ends.tolist(), strict=True):
        spans.setdefault(i, []).append((a, z))
    held: tuple[int, int, list] | None = None  # a band grown while the next has its spans
    for i, (row0, row1) in enumerate(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)):
        here = spans.get(i)
        if held and here and held[1] == row0 and held[2] == here:
            held = (held[0], row1, here)  # one read for rows of tiles side by side
            continue
        if held:
            yield held
        held = (row0, row1, here) if here else None
    if held:
        yield held


def test_boxes(index: Mapping, path: Path | str) -> np.ndarray:
    """(n, 4) int64 (row0, row1, col0, col1) of a region index's test tiles: the windows of
    :func:`emb.prep.region_index.windows_of_test_tiles` (which refuses an index without them,
    naming ``path``) as one array, no object a tile."""
    try:
        size, keys = int(index["tile_size"]), index["splits"]["test"]["blocks"]
    except (KeyError, TypeError, ValueError):
        windows_of_test_tiles(index, path)  # its refusal, naming the file
        raise
    rows_cols = np.array([tile_origin(key, path) for key in keys], np.int64).reshape(-1, 2)
    row, col = rows_cols[:, 0], rows_cols[:, 1]
    return np.column_stack([row, row + size, col, col + size])


def _region_reads(
    region: str, map_path: Path, label_path: Path, index_path: Path, ring: PlaneRing,
    near: _RegionDistricts | None = None,
) -> Iterator[tuple]:  # fmt: skip
    """The reads of one region's test tiles, in the order they are counted (by
    :func:`read_population`, maybe in a thread of their own): ``("grid", region, map, labels,
    tiles)``, then ``("strip", window, spans, map, CDL, local, ids)`` for each strip (its
    districts burned by ``near``, :func:`emb.estimation.districts.district_burn`; without,
    one domain: None, WHOLE), then ``("area", pixel ha)``. A band of tile rows is read at a
    time (:func:`box_bands`), in strips whose planes (map, CDL, the local district) take at
    most STRIP_BYTES (``spans``: the strip's columns in tiles), under a GDAL block cache of two
    block rows per raster: a block is decoded once, memory is flat in the number of tiles and
    regions. The (h, w) uint8 planes are buffers of ``ring`` (two planes a strip, in turn),
    reused."""
    boxes = test_boxes(read_index(index_path, ()), index_path)
    opened = (reading(map_path), reading(label_path))
    with opened[0], opened[1], rasterio.open(map_path) as mp, rasterio.open(label_path) as lab:
        if (mp.height, mp.width) != (lab.height, lab.width) or mp.transform != lab.transform:
            raise AreaCheckError(
                f"{map_path}: expected the grid of its labels {label_path} "
                f"({lab.width} x {lab.height}, {tuple(lab.transform)[:6]}), found "
                f"{mp.width} x {mp.height}, {tuple(mp.transform)[:6]}"
            )
        if near is not None:
            near.start(map_path, mp.crs, mp.transform)
        yield "grid", region, map_path, label_path, boxes
        with rasterio.Env(GDAL_CACHEMAX=cache_bytes(mp) + cache_bytes(lab)):
            for row0, row1, spans in box_bands(boxes, mp.height, mp.width):
                col0, col1 = spans[0][0], spans[-1][1]  # one read per band, then the spans
                step = max(1, STRIP_BYTES // (PLANE_BYTES * (col1 - col0)))
                for top in range(row0, row1, step):
                    win = Window(col0, top, col1 - col0, min(step, row1 - top))
                    mapped, reference = ring.next(int(win.height), int(win.width))
                    mp.read(1, window=win, out=mapped)
                    lab.read(1, window=win, out=reference)
                    local, ids = (None, WHOLE) if near is None else near.of(win)
                    yield ("strip", win, [(a - col0, b - col0) for a, b in spans], mapped,
                           reference, local, ids)  # fmt: skip
        yield "area", map_pixel_ha(mp, map_path)  # after the counts, as it was read after them


class _RegionDistricts:
    """Each strip's districts, burned where the strips are read (the reader thread, so that
    the counting thread runs only the compiled census, which lets go of the GIL); the
    districts moved onto each CRS once (kept in ``placed`` by its text)."""

    def __init__(self, districts: Districts, placed: dict[str, MapDistricts]) -> None:
        self.districts, self.placed = districts, placed

    def start(self, map_path: Path, crs: rasterio.crs.CRS | None, transform: Affine) -> None:
        """Take a region's map: the districts on its CRS; a map without one is refused."""
        if crs is None:
            raise AreaCheckError(f"{map_path}: no CRS: the districts cannot be placed on it")
        self.shapes = on_map_once(self.districts, crs, self.placed)
        self.transform = transform

    def of(self, win: Window) -> tuple[np.ndarray, np.ndarray]:
        """(local, ids) of a strip of the map (:func:`district_burn`)."""
        return district_burn(self.shapes, self.transform, win)


def _region_pairs(map_path: Path, label_path: Path, boxes: np.ndarray) -> np.ndarray:
    """(PAIRS,) pixels per code of a region's test tiles: the values a refusal names."""
    pairs = np.zeros(PAIRS, np.int64)
    with rasterio.open(map_path) as mp, rasterio.open(label_path) as lab:
        for row0, row1, spans in box_bands(boxes, mp.height, mp.width):
            for a, b in spans:
                win = Window(a, row0, b - a, row1 - row0)
                _add_pairs(pairs, mp.read(1, window=win), lab.read(1, window=win))
    return pairs


def _cell_table() -> np.ndarray:
    """(PAIRS,) uint16 the cell of each code ``map << 8 | CDL``: ``i * N_L3 + j`` for two L3
    ids, UNLABELLED where a side is 255 (and neither is foreign), FOREIGN where a side is
    neither an L3 id nor 255."""
    mapped, reference = np.divmod(np.arange(PAIRS), 256)
    table = np.where((mapped < N_L3) & (reference < N_L3), mapped * N_L3 + reference, UNLABELLED)
    foreign = ((mapped >= N_L3) & (mapped != IGNORE)) | (
        (reference >= N_L3) & (reference != IGNORE)
    )
    return np.where(foreign, FOREIGN, table).astype(np.uint16)


UNLABELLED, FOREIGN = N_L3 * N_L3, N_L3 * N_L3 + 1  # the two cells past the (map, CDL) pairs
CELLS = N_L3 * N_L3 + 2
CELL_OF = _cell_table()
PLANE_BYTES = 3  # a pixel's bytes in a strip: map, CDL, local district
WHOLE = np.zeros(1, np.int64)  # the domains of a region counted without districts: the whole


def _add_cells(
    cells: np.ndarray, ids: np.ndarray, local: np.ndarray | None, mapped: np.ndarray,
    reference: np.ndarray, spans: Sequence[tuple[int, int]],
) -> None:  # fmt: skip
    """Add to ``cells`` (D + 1, CELLS) the pixels per (domain, cell) of the columns ``spans``
    (of the planes' own columns) of a strip's map and CDL planes, a pixel's domain
    ``ids[local]`` (``ids[0]`` for all without ``local``): one compiled pass over the planes
    (:func:`emb.estimation.cell_census.add_census`)."""
    near = np.broadcast_to(np.uint8(0), mapped.shape) if local is None else local
    add_census(cells, ids, CELL_OF, mapped, reference, near,
               np.array(spans, np.int64).reshape(-1, 2))  # fmt: skip


def read_population(
    maps: Mapping[str, Path], labels: Mapping[str, Path], indexes: Mapping[str, Path],
    districts: Districts | None = None, threads: int = 1,
) -> TestSplitCounts:  # fmt: skip
    """The test split of the regions named in ``indexes`` (region -> its ``index.json``), from
    each region's map and aligned labels (region -> path), as its joint histogram; with
    ``districts``, per domain too (a district may span regions: its counts add up). Each test
    pixel is counted once (tiles may overlap) in its (domain, cell): a pixel's domain is the
    district holding its centre (:func:`emb.estimation.districts.district_burn`), burned once
    per strip; the counts, 30 KB a district, are all that grows. ``threads`` > 1: the regions
    in shares, counted in up to ``threads`` forked processes (:mod:`emb.forks`; the counts of
    the shares add up); where none can be forked, the rasters read and decoded by a thread of
    their own, a few strips ahead of the counting."""
    n_domains = 1 + (len(districts.names) if districts is not None else 0)
    regions = list(indexes)
    workers = forked_workers(threads, len(regions))
    inner = 1 if workers > 1 else threads  # a worker is one thread: its core is its own
    parts = shares(regions, workers * SHARES_A_WORKER if workers > 1 else 1)

    placed: dict[str, MapDistricts] = {}  # the districts on each CRS, once a process
    if workers > 1:
        cell_census.warm()  # once here, not once a worker

    def count(part: int) -> tuple[np.ndarray, dict[str, float]]:
        return _count_regions(parts[part], maps, labels, indexes, districts, placed, n_domains,
                              inner)  # fmt: skip

    cells, areas = np.zeros((n_domains, CELLS), np.int64), {}
    for part_cells, part_areas in in_parts(count, len(parts), workers):
        cells += part_cells
        areas.update(part_areas)
    counts = cells[:, : N_L3 * N_L3].reshape(n_domains, N_L3, N_L3)
    if not areas:
        raise AreaCheckError("no region to check: the run trains on no region with test tiles")
    first = next(iter(areas.values()))
    if any(not math.isclose(a, first, rel_tol=1e-6) for a in areas.values()):
        raise AreaCheckError(
            f"expected one pixel area over the run's maps, found {areas} (hectares per pixel)"
        )
    population = TestSplitCounts(
        counts.sum(0), first, tuple(areas), counts if districts is not None else None,
        districts.names_by_id() if districts is not None else (),
    )  # fmt: skip
    if not population.pixels:
        raise AreaCheckError(
            f"regions {list(areas)}: their test tiles hold no pixel that both the map and the "
            "CDL label"
        )
    return population


def _count_regions(
    regions: Sequence[str], maps: Mapping[str, Path], labels: Mapping[str, Path],
    indexes: Mapping[str, Path], districts: Districts | None,
    placed: dict[str, MapDistricts], n_domains: int, threads: int,
) -> tuple[np.ndarray, dict[str, float]]:  # fmt: skip
    """(D + 1, CELLS) int64 pixels per (domain, cell) of ``regions``' test tiles, and each
    region's pixel area (ha), read in turn (:func:`_region_reads`; the districts placed on
    each CRS kept in ``placed``); a region with values that are neither a class nor 255
    refused, naming its files and the values."""
    cells, areas = np.zeros((n_domains, CELLS), np.int64), {}
    ring = PlaneRing.for_threads(threads, planes=2)
    near = None if districts is None else _RegionDistricts(districts, placed)

    def reads() -> Iterator[tuple]:
        for region in regions:
            yield from _region_reads(region, Path(maps[region]), Path(labels[region]),
                                     Path(indexes[region]), ring, near)  # fmt: skip

    grid, foreign = None, 0
    for item in read_ahead(one_env(reads()), threads):
        if item[0] == "strip":
            _, win, spans, mapped, reference, local, ids = item
            _add_cells(cells, ids, local, mapped, reference, spans)
        elif item[0] == "grid":
            grid, foreign = item, int(cells[:, FOREIGN].sum())
        else:
            region, map_path, label_path, boxes = grid[1:5]
            areas[region] = item[1]
            if cells[:, FOREIGN].sum() > foreign:  # counted again as pairs, to name the values
                _joint_of(_region_pairs(map_path, label_path, boxes),
                          f"{map_path} or its labels {label_path}")  # fmt: skip
    return cells, areas
