"""The area estimator checked on a run's own errors: the test split, labelled by the CDL.

A map is honest only where its model never trained: the test blocks. There the CDL gives every
pixel's reference class, so each class's true area is known, and the estimate a user would publish
(a stratified random sample of the map's pixels, strata = the map's classes at the design level,
labelled, then Olofsson et al. 2014) can be set beside it. Drawn again and again (seeded), it shows
how often the interval (at ``area_estimates.confidence``) covers the CDL's area on this model's real
errors, and how far the map's own pixel count is off. A random sample of pixels is a probability
sample whatever the spatial structure of the errors, so the paper's analytic intervals apply: no
block bootstrap, no floor on the number of blocks.

The population: every test tile's pixels (each once, tiles may overlap) of every region the
run trains on, where the map gives a class and the CDL is labelled (255 on either side is left
out: an unlabelled pixel has no reference). The CDL is the reference as it is: its own errors
are not corrected. Error rates of the test split must never be applied to the train blocks
(the map is far better there).

At the scale of a state (issue 58, item 5): a sample's estimates depend only on how many of its
units fall in each (map L3, CDL L3) cell (the stratum is the map's class at the design level, a
function of the map's L3), so the population is held as that joint histogram, 61 x 61 counts,
streamed from each region's test tiles a band of tile rows at a time: memory is a few strips
whatever the number of regions, time linear in the pixels (``bench/state_scale.py``). A draw
is a simple random sample without replacement within each stratum, taken as ranks into the
stratum's cells (so its cell counts are multivariate hypergeometric, with no bound on the
stratum's size: numpy's ``multivariate_hypergeometric`` needs fewer than 10**9 pixels), and
every draw is estimated from those counts, all draws at once (the first also in full, as a
user would publish it). The draws' distribution is the one of sampling
pixels; the draws themselves differ from those before this change (which sampled pixel indices)
for one seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import rasterio
from rasterio.windows import Window

from emb.classes import IGNORE, N_L1, N_L2, N_L3, ClassMap
from emb.estimation.design import allocate
from emb.estimation.districts import Districts, MapDistricts, district_burn, on_map
from emb.estimation.estimators import (
    AreaEstimates,
    AreaShares,
    olofsson,
    olofsson_shares,
    stehman,
    stehman_shares,
    strata_counts,
    unit_matrix,
)
from emb.estimation.population import (
    CHUNK,
    STRIP_BYTES,
    cache_bytes,
    crs_text,
    level_table,
    map_pixel_ha,
)
from emb.estimation.settings import AreaSettings
from emb.io import reading
from emb.prep.region_index import read_index, windows_of_test_tiles

LEVEL_CLASSES = {1: N_L1, 2: N_L2, 3: N_L3}
PAIRS = 256 * 256  # (map value, CDL value) codes of two uint8 pixels
SHARES_CHUNK = 40  # draws estimated at once: (draws, K, H) arrays that stay in a cache (2x)


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


class StratifiedSampler:
    """Stratified random samples of a population held as cell counts (``joint``, cells of any
    shape; ``strata``: the stratum of each cell), without replacement per stratum: a draw is
    how many units fall in each cell."""

    def __init__(
        self, joint: np.ndarray, strata: np.ndarray, n_strata: int, n: int | str,
        min_per_class: int, allocation: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        self.shape = joint.shape
        cells, of = np.asarray(joint, np.int64).ravel(), np.asarray(strata, np.int64).ravel()
        self.sizes = np.bincount(of, weights=cells, minlength=n_strata).astype(np.int64)
        if allocation is None and not isinstance(n, int):
            raise AreaCheckError(f"sample n {n!r}: expected the allocation it stands for")
        self.allocation = np.asarray(
            allocate(self.sizes, n, min_per_class) if allocation is None
            else np.minimum(allocation, self.sizes), np.int64,
        )  # fmt: skip
        # the cells with pixels grouped by stratum (one stable sort: a loop over the strata
        # would be strata x cells, too slow for the district x class strata of the check by
        # district) and their pixels' cumulative counts: a stratum's rank u, offset by the
        # pixels of the strata before it, lies in the first cell whose bound exceeds it
        held = np.flatnonzero(cells > 0)
        self.cells = held[np.argsort(of[held], kind="stable")]
        self.bounds = np.cumsum(cells[self.cells])
        starts = np.cumsum(self.sizes) - self.sizes
        self._strata = [(int(self.sizes[h]), int(c), int(starts[h]))
                        for h, c in enumerate(self.allocation) if c]  # fmt: skip

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """Units per cell, of ``joint``'s shape: ``allocation[h]`` distinct pixels of each
        stratum h, drawn as ranks uniformly without replacement (any size of stratum), one
        stratum after another (the draws' random stream), placed in their cells at once."""
        ranks = [rng.choice(size, count, replace=False) + start
                 for size, count, start in self._strata]  # fmt: skip
        out = np.zeros(int(np.prod(self.shape)), np.int64)
        if ranks:
            hit = np.searchsorted(self.bounds, np.concatenate(ranks), side="right")
            out[self.cells] = np.bincount(hit, minlength=len(self.cells))
        return out.reshape(self.shape)


def estimate_at(
    level: int, design_level: int, strata_px: np.ndarray, units_stratum: np.ndarray,
    units_mapped: np.ndarray, units_reference: np.ndarray, mapped_px: np.ndarray,
    strata_mapped_px: np.ndarray | None = None, confidence: float | None = None,
) -> AreaEstimates:  # fmt: skip
    """The estimates at ``level`` of a sample stratified by the map's classes at
    ``design_level``: Olofsson's where the strata are the level's map classes, Stehman's
    (2014) general estimator where they differ (another level; ``strata_mapped_px``, the map's
    pixels per stratum and class, keeps a 1-unit stratum out of the SEs it does not enter),
    with every figure's interval at ``confidence``."""
    if level == design_level:
        matrix = unit_matrix(units_mapped, units_reference, len(mapped_px))
        return olofsson(mapped_px, matrix, confidence)
    return stehman(strata_px, units_stratum, units_mapped, units_reference, mapped_px,
                   strata_mapped_px, confidence)  # fmt: skip


def shares_at(
    level: int, design_level: int, strata_px: np.ndarray, cell_stratum: np.ndarray,
    cell_mapped: np.ndarray, cell_reference: np.ndarray, samples: np.ndarray,
    mapped_px: np.ndarray, strata_mapped_px: np.ndarray | None = None,
    confidence: float | None = None,
) -> AreaShares:  # fmt: skip
    """:func:`estimate_at`'s area shares of B samples at once (bit for bit each sample's
    ``proportion`` figures): ``samples`` (B, C) the units each sample has in C cells, whose
    stratum, map class and reference class at ``level`` are ``cell_*`` (C,). One pass over the
    cells for every draw of a check, not an estimate per draw."""
    k = len(mapped_px)
    table = None if strata_mapped_px is None else np.asarray(strata_mapped_px)
    holds = None if table is None else table > 0
    only = None if table is None else table == np.asarray(strata_px)[:, None]
    parts = []
    for start in range(0, len(samples), SHARES_CHUNK):
        units = samples[start : start + SHARES_CHUNK]
        if level == design_level:
            matrices = unit_matrix(cell_mapped, cell_reference, k, units)
            parts.append(olofsson_shares(mapped_px, matrices, confidence))
        else:
            counts = strata_counts(cell_stratum, cell_mapped, cell_reference, len(strata_px), k,
                                   units, holds, only)  # fmt: skip
            parts.append(stehman_shares(strata_px, counts, mapped_px, confidence))
    return AreaShares(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                         for f in fields(AreaShares)})  # fmt: skip


@dataclass
class ClassCoverage:
    """One class at one level over the draws: how often its interval (the one that holds, and
    Wald's) covered the CDL's area, in how many draws each existed, and how many draws knew
    the area exactly (its strata sampled whole: no interval needed)."""

    covered: int = 0
    with_interval: int = 0
    exact: int = 0
    wald_covered: int = 0
    wald_with: int = 0
    units_reference: int = 0  # summed over the draws (a mean per draw when divided)
    half_width: float = 0.0  # relative half-widths of the intervals, summed over the draws

    @property
    def mean_half_width(self) -> float | None:
        """The mean relative half-width of the draws' intervals (None without one)."""
        return self.half_width / self.with_interval if self.with_interval else None


@dataclass(frozen=True)
class LevelCheck:
    """A level's result: the first draw's estimates (what a user would publish from one
    sample), the map's and the CDL's pixel counts, and the coverage over every draw."""

    level: int
    estimates: AreaEstimates
    mapped_px: np.ndarray
    cdl_px: np.ndarray
    coverage: dict[int, ClassCoverage]
    draws: int


def error_matrix(population: TestSplitCounts, level: int, cmap: ClassMap) -> np.ndarray:
    """(K, K) int64 the test split's pixels by the map's class (row) and the CDL's at
    ``level``: the pilot the recommended sample size is drawn from."""
    table = level_table(level, cmap)[:N_L3].astype(np.int64)
    k = LEVEL_CLASSES[level]
    out = np.zeros((k, k), np.int64)
    np.add.at(out, (table[:, None], table[None, :]), population.joint)
    return out


def check(
    population: TestSplitCounts, cmap: ClassMap, design: AreaSettings,
    units: np.ndarray | None = None,
) -> list[LevelCheck]:  # fmt: skip
    """The check at L1, L2 and L3: ``design.draws`` seeded stratified samples (draw d from
    ``default_rng([design.seed, d])``), each estimated at every level and its intervals (at
    ``design.confidence``) compared with the CDL's area of the population. A draw without an
    interval (none the sample can give; Wald's with a standard error of 0; a census's, of no
    width, as the table shows none) counts as not covering. ``units``: the units per stratum
    (the recommended allocation), instead of ``design.n``'s. The draws are estimated all at
    once from their units per cell (:func:`shares_at`); the first draw's in full."""
    strata = level_table(design.level, cmap)[:N_L3].astype(np.int64)  # map L3 -> stratum
    n_strata = LEVEL_CLASSES[design.level]
    sampler = StratifiedSampler(population.joint, np.broadcast_to(strata[:, None], (N_L3, N_L3)),
                                n_strata, design.n, design.min_per_class, units)  # fmt: skip
    cells = np.flatnonzero(population.joint)  # a sample has units in no other cell
    m3, r3 = np.divmod(cells, N_L3)
    samples = draw_all(sampler, range(design.draws), [design.seed], cells)
    l3_px = population.joint.sum(1)
    total, z = population.pixels, design.z
    out = []
    for level in (1, 2, 3):
        table = level_table(level, cmap)[:N_L3].astype(np.int64)
        mapped_px, cdl_px = population.mapped_px(level, cmap), population.cdl_px(level, cmap)
        joint = np.zeros((n_strata, LEVEL_CLASSES[level]), np.int64)
        np.add.at(joint, (strata, table), l3_px)  # the map's pixels per stratum, class
        one = np.repeat(np.arange(len(cells)), samples[0])  # the first draw's units' cells
        first = estimate_at(level, design.level, sampler.sizes, strata[m3[one]], table[m3[one]],
                            table[r3[one]], mapped_px, joint, design.confidence)  # fmt: skip
        shares = shares_at(level, design.level, sampler.sizes, strata[m3], table[m3], table[r3],
                           samples, mapped_px, joint, design.confidence)  # fmt: skip
        coverage: dict[int, ClassCoverage] = {}
        tally_draws(coverage, shares, cdl_px, total, z)
        out.append(LevelCheck(level, first, mapped_px, cdl_px, coverage, design.draws))
    return out


def draw_all(
    sampler: StratifiedSampler, draws: range, seed: Sequence[int], cells: np.ndarray
) -> np.ndarray:
    """(len(draws), len(cells)) the units in ``cells`` (flat indices of the sampler's joint)
    of each draw d of ``draws``, drawn from ``default_rng([*seed, d])`` (the other cells hold
    none where ``cells`` are every cell with pixels: a draw's memory is theirs, not the
    joint's)."""
    if not draws:
        raise ValueError(f"draws: expected at least 1 draw, found {len(draws)}")
    out = np.empty((len(draws), len(cells)), np.int64)
    for i, d in enumerate(draws):
        out[i] = sampler.draw(np.random.default_rng([*seed, d])).ravel()[cells]
    return out


def tally_draws(
    coverage: dict[int, ClassCoverage], shares: AreaShares, cdl_px: np.ndarray, total: int,
    z: float,
) -> None:  # fmt: skip
    """Count the draws' area shares (B, K) of a population of ``total`` pixels against the
    CDL's pixels per class (``cdl_px``), in draw order: every class the CDL holds gets a tally,
    a class in neither the map nor a draw's sample no interval in that draw (an area of 0 has
    no interval to cover it). A draw with no interval that holds, or one of no width (its
    strata sampled whole: ``exact``), or no Wald interval (a standard error of 0 or none)
    counts as not covering."""
    for cls in np.flatnonzero(cdl_px):
        tally = coverage.setdefault(int(cls), ClassCoverage())
        listed = shares.listed[:, cls]
        value, se, lo, hi = (a[listed, cls] for a in (shares.value, shares.se, shares.lo,
                                                       shares.hi))  # fmt: skip
        truth = cdl_px[cls] / total
        tally.units_reference += int(shares.units_reference[listed, cls].sum())
        bounded = ~np.isnan(lo)
        exact = bounded & (lo == hi)
        interval = bounded & ~exact
        tally.exact += int(exact.sum())
        tally.with_interval += int(interval.sum())
        tally.covered += int((interval & (lo <= truth) & (truth <= hi)).sum())
        wide = interval & (value > 0)
        for width in ((hi[wide] - lo[wide]) / 2 / value[wide]).tolist():
            tally.half_width += width  # one draw after another: the sum rounds as it always has
        wald = ~np.isnan(se) & (se != 0)
        tally.wald_with += int(wald.sum())
        tally.wald_covered += int(
            (wald & (value - z * se <= truth) & (truth <= value + z * se)).sum()
        )
