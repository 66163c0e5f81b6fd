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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from rasterio.windows import Window

from emb.classes import IGNORE, N_L1, N_L2, N_L3, ClassMap
from emb.estimation.design import allocate
from emb.estimation.estimators import AreaEstimates, Estimate, olofsson, stehman
from emb.estimation.population import pixel_hectares
from emb.estimation.settings import AreaSettings
from emb.io import reading
from emb.prep.region_index import read_index, windows_of_test_tiles

LEVEL_CLASSES = {1: N_L1, 2: N_L2, 3: N_L3}


class AreaCheckError(ValueError):
    """The test split cannot be checked: a shard index, map or label raster that does not fit."""


@dataclass(frozen=True)
class TestSplitPixels:
    """The test split's pixels as two aligned L3 vectors (the map's class, the CDL's)."""

    mapped: np.ndarray  # (P,) uint8 L3 ids of the map
    reference: np.ndarray  # (P,) uint8 L3 ids of the CDL
    pixel_ha: float
    regions: tuple[str, ...]

    def at(self, level: int, cmap: ClassMap) -> tuple[np.ndarray, np.ndarray]:
        """Both vectors at ``level`` (1, 2 or 3), through config/classes.csv."""
        key = f"l{level}"
        return cmap.levels(self.mapped)[key], cmap.levels(self.reference)[key]


def _region_pixels(
    map_path: Path, label_path: Path, windows: Sequence[Window]
) -> tuple[np.ndarray, np.ndarray, float]:
    """The (map, CDL) L3 pairs of one region's test tiles, each pixel once."""
    opened = (reading(map_path), reading(label_path))
    with opened[0], opened[1], rasterio.open(map_path) as mp, rasterio.open(label_path) as lab:
        if (mp.height, mp.width) != (lab.height, lab.width) or mp.transform != lab.transform:
            raise AreaCheckError(
                f"{map_path}: expected the grid of its labels {label_path} "
                f"({lab.width} x {lab.height}, {tuple(lab.transform)[:6]}), found "
                f"{mp.width} x {mp.height}, {tuple(mp.transform)[:6]}"
            )
        seen = np.zeros((mp.height, mp.width), bool)
        mapped, reference = [], []
        for win in windows:  # tiles may reach past the edge: clip to the raster
            r0, c0 = max(win.row_off, 0), max(win.col_off, 0)
            r1 = min(win.row_off + win.height, mp.height)
            c1 = min(win.col_off + win.width, mp.width)
            if r1 <= r0 or c1 <= c0:
                continue
            clip = Window(c0, r0, c1 - c0, r1 - r0)
            new = ~seen[r0:r1, c0:c1]
            seen[r0:r1, c0:c1] = True
            m, r = mp.read(1, window=clip)[new], lab.read(1, window=clip)[new]
            keep = (m != IGNORE) & (r != IGNORE)
            mapped.append(m[keep])
            reference.append(r[keep])
    pixel_ha = pixel_hectares(map_path)
    empty = np.zeros(0, np.uint8)
    return np.concatenate(mapped or [empty]), np.concatenate(reference or [empty]), pixel_ha


def read_population(
    maps: Mapping[str, Path], labels: Mapping[str, Path], indexes: Mapping[str, Path]
) -> TestSplitPixels:
    """The test split of the regions named in ``indexes`` (region -> its ``index.json``), from
    each region's map and aligned labels (region -> path)."""
    mapped, reference, areas = [], [], {}
    for region, index_path in indexes.items():
        windows = windows_of_test_tiles(read_index(index_path, ()), index_path)
        m, r, pixel_ha = _region_pixels(Path(maps[region]), Path(labels[region]), windows)
        mapped.append(m)
        reference.append(r)
        areas[region] = pixel_ha
    if not areas:
        raise AreaCheckError("no region to check: the run trains on no region with test tiles")
    first = next(iter(areas.values()))
    if any(not math.isclose(a, first, rel_tol=1e-6) for a in areas.values()):
        raise AreaCheckError(
            f"expected one pixel area over the run's maps, found {areas} (hectares per pixel)"
        )
    population = TestSplitPixels(np.concatenate(mapped), np.concatenate(reference), first,
                            tuple(areas))  # fmt: skip
    if not len(population.mapped):
        raise AreaCheckError(
            f"regions {list(areas)}: their test tiles hold no pixel that both the map and the "
            "CDL label"
        )
    return population


class StratifiedSampler:
    """Stratified random samples of a population's pixels, without replacement per stratum."""

    def __init__(self, strata: np.ndarray, n_strata: int, n: int, min_per_class: int) -> None:
        self.sizes = np.bincount(strata, minlength=n_strata).astype(np.int64)
        self.allocation = np.asarray(allocate(self.sizes, n, min_per_class), np.int64)
        self.order = np.argsort(strata, kind="stable")
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """Indices into the population: ``allocation[h]`` pixels of each stratum h."""
        picks = [
            self.order[start + rng.choice(size, count, replace=False)]
            for start, size, count in zip(self.starts, self.sizes, self.allocation, strict=True)
            if count
        ]
        return np.concatenate(picks) if picks else np.zeros(0, np.int64)


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
        k = len(mapped_px)
        matrix = np.zeros((k, k), np.int64)
        np.add.at(matrix, (units_mapped, units_reference), 1)
        return olofsson(mapped_px, matrix, confidence)
    return stehman(strata_px, units_stratum, units_mapped, units_reference, mapped_px,
                   strata_mapped_px, confidence)  # fmt: skip


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


def check(population: TestSplitPixels, cmap: ClassMap, design: AreaSettings) -> list[LevelCheck]:
    """The check at L1, L2 and L3: ``design.draws`` seeded stratified samples (draw d from
    ``default_rng([design.seed, d])``), each estimated at every level and its intervals (at
    ``design.confidence``) compared with the CDL's area of the population. A draw without an
    interval (none the sample can give; Wald's with a standard error of 0; a census's, of no
    width, as the table shows none) counts as not covering."""
    strata = population.at(design.level, cmap)[0].astype(np.int64)
    sampler = StratifiedSampler(strata, LEVEL_CLASSES[design.level], design.n,
                                design.min_per_class)  # fmt: skip
    levels, joint = {}, {}
    for level in (1, 2, 3):
        m, r = (a.astype(np.int64) for a in population.at(level, cmap))
        k = LEVEL_CLASSES[level]
        levels[level] = (m, r, np.bincount(m, minlength=k), np.bincount(r, minlength=k))
        joint[level] = np.bincount(strata * k + m, minlength=len(sampler.sizes) * k).reshape(-1, k)
    total, z = len(population.mapped), design.z
    first: dict[int, AreaEstimates] = {}
    coverage: dict[int, dict[int, ClassCoverage]] = {lv: {} for lv in levels}
    for draw in range(design.draws):
        units = sampler.draw(np.random.default_rng([design.seed, draw]))
        for level, (m, r, mapped_px, cdl_px) in levels.items():
            est = estimate_at(level, design.level, sampler.sizes, strata[units], m[units],
                              r[units], mapped_px, joint[level], design.confidence)  # fmt: skip
            first.setdefault(level, est)
            found = {c.cls: c for c in est.classes}
            for cls in np.flatnonzero(cdl_px):  # an area of 0 has no interval to cover it
                tally = coverage[level].setdefault(int(cls), ClassCoverage())
                got = found.get(int(cls))
                if got is None:  # in neither the map nor this sample: no interval at all
                    continue
                tally.units_reference += got.units_reference
                _tally(tally, got.proportion, cdl_px[cls] / total, z)
    return [
        LevelCheck(
            level, first[level], levels[level][2], levels[level][3], coverage[level], design.draws
        )  # fmt: skip
        for level in levels
    ]


def _tally(tally: ClassCoverage, est: Estimate, truth: float, z: float) -> None:
    """Count one draw's intervals of a class's area share against the truth."""
    bounds = est.bounds
    if bounds is not None and bounds[0] == bounds[1]:
        tally.exact += 1  # its strata sampled whole: the value itself, no interval
    elif bounds is not None:
        tally.with_interval += 1
        tally.covered += bounds[0] <= truth <= bounds[1]
    wald = est.interval(z) if est.se else None  # a standard error of 0: no Wald interval
    if wald is not None:
        tally.wald_with += 1
        tally.wald_covered += wald[0] <= truth <= wald[1]
