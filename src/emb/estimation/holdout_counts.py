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
from rasterio.windows import Window

from emb.classes import IGNORE, N_L1, N_L2, N_L3, ClassMap
from emb.estimation.districts import Districts, MapDistricts, district_burn, on_map
from emb.estimation.population import (
    CHUNK,
    STRIP_BYTES,
    cache_bytes,
    crs_text,
    level_table,
    map_pixel_ha,
)
from emb.io import reading
from emb.prep.region_index import read_index, windows_of_test_tiles

LEVEL_CLASSES = {1: N_L1, 2: N_L2, 3: N_L3}
PAIRS = 256 * 256  # (map value, CDL value) codes of two uint8 pixels


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
    boxes = np.array([(max(int(w.row_off), 0), min(int(w.row_off + w.height), height),
                       max(int(w.col_off), 0), min(int(w.col_off + w.width), width))
                      for w in windows], np.int64).reshape(-1, 4)  # fmt: skip
    boxes = boxes[(boxes[:, 1] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 2])]
    edges = np.unique(boxes[:, :2])
    held: tuple[int, int, list] | None = None  # a band grown while the next has its spans
    for row0, row1 in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        cross = boxes[(boxes[:, 0] <= row0) & (boxes[:, 1] >= row1)]
        spans: list[list[int]] = []
        for c0, c1 in sorted(cross[:, 2:].tolist()):
            if spans and c0 <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], c1)
            else:
                spans.append([c0, c1])
        if held and held[1] == row0 and held[2] == spans:
            held = (held[0], row1, spans)  # one read for rows of tiles side by side
            continue
        if held:
            yield held[0], held[1], [(a, b) for a, b in held[2]]
        held = (row0, row1, spans) if spans else None
    if held:
        yield held[0], held[1], [(a, b) for a, b in held[2]]


def _count_region(
    cells: np.ndarray, map_path: Path, label_path: Path, windows: Sequence[Window],
    districts: Districts | None, placed: dict[str, MapDistricts] | None = None,
) -> float:  # fmt: skip
    """Add to ``cells`` (D + 1, CELLS) the pixels per (domain, cell) of one region's test
    tiles, each pixel once (D = 0 without ``districts``: one domain, the whole); return its
    map's pixel area (ha), from the map open here (no second open for it). Read a band of
    tile rows at a time (in strips of at most STRIP_BYTES per raster) under a GDAL block cache
    of two block rows per raster: a block is decoded once, memory is flat in the number of
    tiles and regions. A pixel's domain is the district holding its centre
    (:func:`emb.estimation.districts.district_burn`), burned once per strip: the counts, 30 KB
    a district, are all that grows. ``placed``: the districts already moved onto a CRS (by its
    text), filled here, so that the maps of one CRS reproject them once, not once each."""
    opened = (reading(map_path), reading(label_path))
    with opened[0], opened[1], rasterio.open(map_path) as mp, rasterio.open(label_path) as lab:
        if (mp.height, mp.width) != (lab.height, lab.width) or mp.transform != lab.transform:
            raise AreaCheckError(
                f"{map_path}: expected the grid of its labels {label_path} "
                f"({lab.width} x {lab.height}, {tuple(lab.transform)[:6]}), found "
                f"{mp.width} x {mp.height}, {tuple(mp.transform)[:6]}"
            )
        shapes = None
        if districts is not None:
            if mp.crs is None:
                raise AreaCheckError(f"{map_path}: no CRS: the districts cannot be placed on it")
            crs, placed = crs_text(mp.crs), {} if placed is None else placed
            shapes = placed[crs] = placed.get(crs) or on_map(districts, crs)
        foreign = int(cells[:, FOREIGN].sum())
        with rasterio.Env(GDAL_CACHEMAX=cache_bytes(mp) + cache_bytes(lab)):
            for row0, row1, spans in bands(windows, mp.height, mp.width):
                col0, col1 = spans[0][0], spans[-1][1]  # one read per band, then the spans
                step = max(1, STRIP_BYTES // (col1 - col0))
                for top in range(row0, row1, step):
                    win = Window(col0, top, col1 - col0, min(step, row1 - top))
                    codes = _read_codes(mp, lab, win)
                    local, ids = (None, WHOLE) if shapes is None else district_burn(
                        shapes, mp.transform, win)  # fmt: skip
                    for a, b in spans:
                        part = slice(None), slice(a - col0, b - col0)
                        _add_cells(cells, ids, None if local is None else local[part],
                                   codes[part])  # fmt: skip
        pixel_ha = map_pixel_ha(mp, map_path)  # after the counts, as it was read after them
    if cells[:, FOREIGN].sum() > foreign:  # counted again as pairs, to name the values found
        _joint_of(_region_pairs(map_path, label_path, windows),
                  f"{map_path} or its labels {label_path}")  # fmt: skip
    return pixel_ha


def _region_pairs(map_path: Path, label_path: Path, windows: Sequence[Window]) -> np.ndarray:
    """(PAIRS,) pixels per code of a region's test tiles: the values a refusal names."""
    pairs = np.zeros(PAIRS, np.int64)
    with rasterio.open(map_path) as mp, rasterio.open(label_path) as lab:
        for row0, row1, spans in bands(windows, mp.height, mp.width):
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
WHOLE = np.zeros(1, np.int64)  # the domains of a region counted without districts: the whole


def _read_codes(mp: rasterio.DatasetReader, lab: rasterio.DatasetReader, win: Window) -> np.ndarray:
    """(h, w) uint16 codes ``map << 8 | CDL`` of a window: each raster read straight into its
    byte of one (h, w, 2) buffer (GDAL writes with a pixel stride), seen as little-endian
    uint16: no copy to pair them."""
    both = np.empty((int(win.height), int(win.width), 2), np.uint8)
    lab.read(1, window=win, out=both[:, :, 0])
    mp.read(1, window=win, out=both[:, :, 1])
    return both.view("<u2")[:, :, 0]


def _add_cells(
    cells: np.ndarray, ids: np.ndarray, local: np.ndarray | None, codes: np.ndarray
) -> None:
    """Add to ``cells`` (D + 1, CELLS) the pixels per (domain, cell) of uint16 ``codes``
    (``map << 8 | CDL``), a pixel's domain ``ids[local]`` (``ids[0]`` for all without
    ``local``). A window in one domain bincounts its codes (65536 bins, folded into cells
    once); one across districts looks each code up to its cell and bincounts (local id,
    cell) over its few domains (L + 1, not D + 1); in chunks (bincount copies its input as
    int64)."""
    code = codes.ravel()
    near = None if local is None or len(ids) == 1 else local.ravel()
    if near is not None and near.size and near.min() == near.max():
        ids, near = ids[int(near[0]) : int(near[0]) + 1], None
    if near is None:
        pairs = np.zeros(PAIRS, np.int64)
        for start in range(0, code.size, CHUNK):
            pairs += np.bincount(code[start : start + CHUNK], minlength=PAIRS)
        cells[ids[0]] += np.bincount(CELL_OF, weights=pairs, minlength=CELLS).astype(np.int64)
        return
    width = CELLS * len(ids)
    counts = np.zeros(width, np.int64)
    for start in range(0, code.size, CHUNK):
        key = near[start : start + CHUNK].astype(np.int32) * CELLS
        key += CELL_OF[code[start : start + CHUNK]]
        counts += np.bincount(key, minlength=width)
    cells[ids] += counts.reshape(-1, CELLS)


def read_population(
    maps: Mapping[str, Path], labels: Mapping[str, Path], indexes: Mapping[str, Path],
    districts: Districts | None = None,
) -> TestSplitCounts:  # fmt: skip
    """The test split of the regions named in ``indexes`` (region -> its ``index.json``), from
    each region's map and aligned labels (region -> path), as its joint histogram; with
    ``districts``, per domain too (a district may span regions: its counts add up)."""
    n_domains = 1 + (len(districts.names) if districts is not None else 0)
    cells, areas, placed = np.zeros((n_domains, CELLS), np.int64), {}, {}
    for region, index_path in indexes.items():
        windows = windows_of_test_tiles(read_index(index_path, ()), index_path)
        areas[region] = _count_region(cells, Path(maps[region]), Path(labels[region]), windows,
                                      districts, placed)  # fmt: skip
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
