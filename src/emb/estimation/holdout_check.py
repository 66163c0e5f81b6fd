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

The population arrives as counts (:mod:`emb.estimation.holdout_counts`, read from each
region's test tiles): a sample's estimates depend only on how many of its units fall in each
(map L3, CDL L3) cell. A draw is a simple random sample without replacement within each
stratum, taken as ranks into the stratum's cells (so its cell counts are multivariate
hypergeometric, with no bound on the stratum's size: numpy's ``multivariate_hypergeometric``
needs fewer than 10**9 pixels), and every draw is estimated from those counts, all draws at
once (the first also in full, as a user would publish it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from emb.classes import N_L3, ClassMap
from emb.estimation.design import allocate
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
from emb.estimation.holdout_counts import LEVEL_CLASSES, AreaCheckError, TestSplitCounts
from emb.estimation.population import level_table
from emb.estimation.settings import AreaSettings

SHARES_CHUNK = 40  # draws estimated at once: (draws, K, H) arrays that stay in a cache (2x)


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
        self._choices = StrataChoices(self._strata)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """Units per cell, of ``joint``'s shape: ``allocation[h]`` distinct pixels of each
        stratum h, drawn as ranks uniformly without replacement (any size of stratum), one
        stratum after another (the draws' random stream), placed in their cells at once."""
        out = np.zeros(int(np.prod(self.shape)), np.int64)
        out[self.cells] = self.cell_units(rng)
        return out.reshape(self.shape)

    def cell_units(self, rng: np.random.Generator) -> np.ndarray:
        """:meth:`draw`'s units in the cells with pixels only, in ``self.cells``' order."""
        return np.bincount(self._hits(rng), minlength=len(self.cells))

    def cell_runs(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`cell_units`' cells that got units (positions in ``self.cells``, ascending)
        and their units: a draw's few cells, not every cell with pixels."""
        hit = self._hits(rng)
        starts = np.flatnonzero(np.diff(hit, prepend=-1))
        return hit[starts], np.diff(starts, append=len(hit))

    def _hits(self, rng: np.random.Generator) -> np.ndarray:
        """Each unit's cell (a position in ``self.cells``), ascending."""
        ranks = self._choices.ranks(rng)  # sorted: a search of sorted keys walks its array once
        return np.searchsorted(self.bounds, ranks, side="right")


class StrataChoices:
    """``rng.choice(size, count, replace=False) + start`` of each stratum (size, count, start)
    in turn, as one set of ranks, sorted: the same units from the same random stream, without
    a call per stratum (the check by district has thousands of strata, 10 us a call).

    numpy's choice (``Generator.choice``, ``numpy/random/_generator.pyx``) takes a stratum's
    ranks by Floyd's algorithm (one bounded integer on [0, j] for each j of size - count ..
    size - 1, kept where new, else j itself; then a shuffle of the count ranks, a bounded
    integer on [0, i] for i = count - 1 .. 1) or, where size > 10,000 and count > size // 50,
    by the tail of a partial Fisher-Yates shuffle of range(size) (one bounded integer on [0, i]
    for i = size - 1 .. max(size - count, 1)). Every one of those integers is
    ``random_bounded_uint64``'s, which ``rng.integers(0, high)`` of an int64 array of bounds
    calls once per entry, in order: one call gives every integer of a draw. What a stratum
    keeps follows from its integers: Floyd's draws where none repeats nor reaches
    size - count (then a later j could equal it), else the algorithm replayed; the tail's
    replayed; a stratum taken whole is all its ranks, whatever the order. Tested against
    numpy's choice itself (``tests/estimation/test_check_draws.py``)."""

    def __init__(self, strata: Sequence[tuple[int, int, int]]) -> None:
        highs, floyd, census, self._replays = [], [], [], []
        at = 0
        for size, count, start in strata:
            if size > 10_000 and count > size // 50:  # the tail of a partial shuffle
                first = max(size - count, 1)
                highs.append(np.arange(size, first, -1))  # exclusive bounds of [0, i]
                if count < size:
                    self._replays.append((at, size - first, size, count, start))
                at += size - first
            else:  # Floyd's algorithm, then the shuffle of its ranks
                highs += [np.arange(size - count + 1, size + 1), np.arange(count, 1, -1)]
                if count < size:
                    floyd.append((at, size, count, start))
                at += 2 * count - 1
            if count == size:
                census.append(np.arange(start, start + size))
        self._highs = np.concatenate(highs).astype(np.int64) if highs else np.zeros(0, np.int64)
        self._census = np.concatenate(census) if census else np.zeros(0, np.int64)
        counts = np.array([c for _, _, c, _ in floyd], np.int64)
        self._at = np.concatenate([np.arange(a, a + c) for a, _, c, _ in floyd]
                                  or [np.zeros(0, np.int64)]).astype(np.int64)  # fmt: skip
        self._offset = np.repeat([s for *_, s in floyd], counts).astype(np.int64)
        self._low = np.repeat([z - c for _, z, c, _ in floyd], counts).astype(np.int64)
        self._owner = np.repeat(np.arange(len(floyd)), counts)
        self._starts = np.array([s for *_, s in floyd], np.int64)
        self._counts = counts
        self._firsts = np.cumsum(counts) - counts  # each one's first rank
        self._within = np.arange(len(self._at)) - np.repeat(self._firsts, counts)  # its place
        # every stratum the same count (the check by district's minimums): sorted stratum by
        # stratum, rows of a few ranks, not one long sort (a third of its time)
        self._row = int(counts[0]) if len(counts) and (counts == counts[0]).all() else 0

    def ranks(self, rng: np.random.Generator) -> np.ndarray:
        """The ranks of one draw (every stratum's, each offset by its start), sorted."""
        if not len(self._highs):
            return self._census
        drawn = rng.integers(0, self._highs)
        kept = drawn[self._at]
        keys = kept + self._offset  # stratum after stratum, count ranks each
        ranks = np.sort(keys.reshape(-1, self._row), -1).ravel() if self._row else np.sort(keys)
        # a rank drawn twice in a stratum (ranks of strata apart never meet), or one a later j
        # may equal: that stratum's Floyd replayed (rare where count << size), in its place
        twice = ranks[1:][ranks[1:] == ranks[:-1]]
        redo = np.union1d(self._owner[kept >= self._low],
                          np.searchsorted(self._starts, twice, side="right") - 1)  # fmt: skip
        if len(redo):
            at = _ranges(self._firsts[redo], self._counts[redo])  # their draws, their ranks
            ranks[at] = self._replayed(kept, at)
        tails = [_tail(drawn[at : at + n], size, count) + start
                 for at, n, size, count, start in self._replays]  # fmt: skip
        if not tails and not len(self._census):
            return ranks
        return np.sort(np.concatenate([self._census, ranks, *tails]))

    def _replayed(self, kept: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Floyd's ranks of the strata whose draws are ``kept[at]`` (whole strata, in order),
        sorted: draw i (of j = size - count + i) is kept where new, else j is. Draw i is not
        new where an earlier draw of its stratum was the same, or where it equals an earlier
        j = size - count + m whose draw m was not new (m < i: a chain, followed back until
        nothing changes), every stratum at once."""
        draws, low, offset = kept[at], self._low[at], self._offset[at]
        i = self._within[at]  # each draw's place in its stratum
        key = draws + offset
        order = np.argsort(key, kind="stable")  # a value's first draw first
        repeated = np.zeros(len(at), bool)
        repeated[order[1:]] = key[order[1:]] == key[order[:-1]]
        m = draws - low
        chained = (m >= 0) & (m < i)
        earlier = np.where(chained, np.arange(len(at)) - i + m, 0)  # draw m's place here
        taken = repeated
        while True:
            again = repeated | (chained & taken[earlier])
            if np.array_equal(again, taken):
                break
            taken = again
        return np.sort(np.where(taken, low + i, draws) + offset)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions start .. start + count - 1 of each (start, count), one after another."""
    before = np.cumsum(counts) - counts
    return np.repeat(starts - before, counts) + np.arange(int(counts.sum()))


def _tail(drawn: np.ndarray, size: int, count: int) -> np.ndarray:
    """The last ``count`` entries of range(size) after the partial Fisher-Yates shuffle that
    swaps entry i with entry drawn[size - 1 - i], for i = size - 1 down: a sparse replay."""
    moved: dict[int, int] = {}
    for i, j in zip(range(size - 1, size - 1 - len(drawn), -1), drawn.tolist(), strict=True):
        moved[i], moved[j] = moved.get(j, j), moved.get(i, i)
    return np.array([moved.get(i, i) for i in range(size - count, size)], np.int64)


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
    joint = np.zeros(int(np.prod(sampler.shape)), np.int64)  # one buffer: every draw fills it
    for i, d in enumerate(draws):
        joint[sampler.cells] = sampler.cell_units(np.random.default_rng([*seed, d]))
        out[i] = joint[cells]
    return out


def draw_runs(
    sampler: StratifiedSampler, draws: range, seed: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each draw d of ``draws`` (from ``default_rng([*seed, d])``) as its cells with units:
    (the draw's index in ``draws``, the cell's position in ``sampler.cells``, its units), one
    entry per cell with units, draw after draw (:meth:`StratifiedSampler.cell_runs`)."""
    if not draws:
        raise ValueError(f"draws: expected at least 1 draw, found {len(draws)}")
    runs = [sampler.cell_runs(np.random.default_rng([*seed, d])) for d in draws]
    which = np.repeat(np.arange(len(runs)), [len(cells) for cells, _ in runs])
    return (which, np.concatenate([c for c, _ in runs]),
            np.concatenate([u for _, u in runs]))  # fmt: skip


class DrawTallies:
    """:func:`tally_draws` of many populations at once (rows: e.g. the domains of the check by
    district), as arrays: each row's draws counted against its CDL pixels per class, all
    classes and rows in one pass per chunk of draws, the same counts and half-width sums
    (added one draw after another) as a :class:`ClassCoverage` per row and class."""

    def __init__(self, cdl_px: np.ndarray, total: np.ndarray) -> None:
        self.cdl_px = np.asarray(cdl_px, np.int64)  # (R, K)
        self.truth = self.cdl_px / np.asarray(total, np.int64)[:, None]
        shape = self.cdl_px.shape
        self.counts = {name: np.zeros(shape, np.int64) for name in _COUNTS}
        self.half_width = np.zeros(shape)

    def add(self, shares: AreaShares, z: float) -> None:
        """Count the draws' area shares, arrays (R, B, K), in draw order."""
        self.take(self.counted(shares, z))

    def counted(self, shares: AreaShares, z: float) -> DrawCounts:
        """The draws' area shares (R, B, K) counted, not yet added: what :meth:`add` adds,
        for draws counted in another process and taken here in draw order."""
        truth = self.truth[:, None, :]
        listed = shares.listed
        value, se, lo, hi = shares.value, shares.se, shares.lo, shares.hi
        bounded = listed & ~np.isnan(lo)
        exact = bounded & (lo == hi)
        interval = bounded & ~exact
        wald = listed & ~np.isnan(se) & (se != 0)
        with np.errstate(invalid="ignore", divide="ignore"):  # NaN where no interval: not read
            widths = np.where(interval & (value > 0), (hi - lo) / 2 / value, 0.0)
        found = {
            "covered": interval & (lo <= truth) & (truth <= hi),
            "with_interval": interval,
            "exact": exact,
            "wald_covered": wald & (value - z * se <= truth) & (truth <= value + z * se),
            "wald_with": wald,
        }
        counts = {name: hit.sum(1) for name, hit in found.items()}
        counts["units_reference"] = np.where(listed, shares.units_reference, 0).sum(1)
        return DrawCounts(counts, widths)

    def take(self, found: DrawCounts) -> None:
        """Add draws counted by :meth:`counted` (of these tallies, or of a forked copy), in
        draw order."""
        for name, count in found.counts.items():
            self.counts[name] += count
        for b in range(found.widths.shape[1]):  # one draw after another: the sums round as they did
            self.half_width = self.half_width + found.widths[:, b]

    def coverage(self, row: int) -> dict[int, ClassCoverage]:
        """Row ``row``'s tallies: every class its CDL holds, ascending."""
        return {
            int(cls): ClassCoverage(**{n: int(c[row, cls]) for n, c in self.counts.items()},
                                    half_width=float(self.half_width[row, cls]))
            for cls in np.flatnonzero(self.cdl_px[row])
        }  # fmt: skip


@dataclass(frozen=True)
class DrawCounts:
    """Some draws' tallies before they are added: the counts summed over the draws, (R, K)
    each (integers: any grouping adds them exactly), and each draw's relative half-widths
    (R, B, K), kept apart because float sums round by their order (:meth:`DrawTallies.take`
    adds them draw by draw). What a worker process sends back."""

    counts: dict[str, np.ndarray]
    widths: np.ndarray


_COUNTS = ("covered", "with_interval", "exact", "wald_covered", "wald_with", "units_reference")


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
