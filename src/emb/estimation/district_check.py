"""The test split's check by district: each district's areas estimated from its own sample,
beside the CDL's area of its test pixels, and the total over the districts as their sum.

Why a design of its own: a district's area is what a user with districts publishes, and a
sample stratified by the map's classes alone leaves a small district a handful of units, or
none in a stratum (no estimate at all). So the strata are district x map class at the design
level (domain 0, the outside, the pixels no district holds, is a domain of its own: counted,
sampled, reported, never dropped), and each district's estimates use its strata only: Olofsson
et al. 2014 within the district at the design level, Stehman 2014 at the other levels, with
the intervals that hold. The population is the check's count table per domain
(:attr:`emb.estimation.holdout_counts.TestSplitCounts.domains`): memory is counts only.

The allocation (kept simple): one call of :func:`emb.estimation.design.allocate` over every
district x class stratum, so each stratum with pixels gets ``min_per_class`` (or all it
holds) and the rest of ``n`` goes by area, which splits ``n`` among the districts by their
area. ``n`` is ``sample.n``, or with ``n: auto`` the recommended total of
:mod:`emb.estimation.sample_size`; where the minimums need more units than that (many
districts), the check draws the minimums' total and says so.

The total over the domains: the districts' strata are disjoint and drawn independently, so the
stratified estimator over all of them is the sum of the domains' estimates (in pixels) and its
variance the sum of theirs; its interval is the normal one on that variance, clipped to
[0, 1] of the area (the total gathers many independent strata, where the normal
approximation is at its best), and its coverage is measured like every other. The same holds
for overall accuracy (a share of agreeing pixels); user's and producer's accuracies are
ratios, not sums: the total gives none, each district does.

The draws (a fixed cost, apart from the pixels: 101 domains x 40 classes x 200 draws at a
state's scale) are estimated every domain at once, a few draws at a time (``DOMAIN_CELLS``
bounds the memory): each domain's units per (map L3, CDL L3) cell in one array, summed by
class at each level, then :func:`emb.estimation.estimators.olofsson_domain_shares` or
:func:`~emb.estimation.estimators.stehman_domain_shares` and the tallies as arrays
(:class:`emb.estimation.holdout_check.DrawTallies`): every number bit for bit what each
domain's :func:`emb.estimation.holdout_check.shares_at` and ``tally_draws`` give
(``tests/estimation/test_domain_draws.py``), without a loop over domains and classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from emb.classes import N_L3, ClassMap
from emb.estimation.design import allocate
from emb.estimation.estimators import (
    AreaEstimates,
    AreaShares,
    ClassEstimate,
    Estimate,
    olofsson_domain_shares,
    stehman_domain_shares,
)
from emb.estimation.holdout_check import (
    SHARES_CHUNK,
    DrawTallies,
    LevelCheck,
    StratifiedSampler,
    draw_all,
    estimate_at,
)
from emb.estimation.holdout_counts import LEVEL_CLASSES, TestSplitCounts
from emb.estimation.population import level_table
from emb.estimation.settings import AreaSettings

CELLS = N_L3 * N_L3  # (map L3, CDL L3) cells of one domain
STREAM = 1  # the draws' seeds: [seed, STREAM, d], apart from the whole check's [seed, d]
DOMAIN_CELLS = 2**21  # draws x domains x cells estimated at once: 16 MiB a float array


@dataclass(frozen=True)
class DomainCheck:
    """One domain (``name``: the outside or a district) of the check by district: its test
    pixels, and per level its first draw's estimates and coverage (none without pixels)."""

    name: str
    pixels: int
    levels: tuple[LevelCheck, ...]


@dataclass(frozen=True)
class DistrictCheck:
    """The check by district: every domain in id order (0 the outside), the total over them
    (the sum of theirs), the units drawn per domain and stratum, and why ``n`` was raised."""

    domains: tuple[DomainCheck, ...]
    total: tuple[LevelCheck, ...]
    allocation: np.ndarray  # (D + 1, K) units per domain and stratum
    note: str


def allocation(domains_px: np.ndarray, n: int, min_per_class: int) -> tuple[np.ndarray, int, str]:
    """(units per domain and stratum, shape of ``domains_px`` (D + 1, K), the units drawn, a
    note where ``n`` was raised to the minimums' total) of one allocation over every stratum."""
    sizes = np.asarray(domains_px, np.int64)
    need = int(np.minimum(sizes, min_per_class).sum())
    note = ""
    if n < need:
        note = (f"{need} units drawn, not n = {n}: the {int((sizes > 0).sum())} district x "
                f"class strata need {min_per_class} each")  # fmt: skip
        n = need
    units = allocate(sizes.ravel(), n, min_per_class).reshape(sizes.shape)
    return units, n, note


def sum_estimates(parts: Sequence[AreaEstimates]) -> AreaEstimates:
    """The estimates of the union of disjoint, independently sampled domains: each class's area
    (and the overall accuracy) the sum of the domains' in pixels, its variance the sum of
    theirs (its interval: :func:`with_interval`), no user's
    or producer's accuracy (ratios do not add)."""
    total = sum(p.total_px for p in parts)
    classes: dict[int, list] = {}
    for part in parts:
        for c in part.classes:
            classes.setdefault(c.cls, []).append((part.total_px, c))
    out = []
    for cls in sorted(classes):
        found = classes[cls]
        proportion = _summed([(n, c.proportion) for n, c in found], total)
        out.append(ClassEstimate(
            cls=cls, mapped_px=sum(c.mapped_px for _, c in found),
            units_mapped=sum(c.units_mapped for _, c in found),
            units_reference=sum(c.units_reference for _, c in found),
            proportion=proportion, users=None, producers=None,
        ))  # fmt: skip
    overall = _summed([(p.total_px, p.overall) for p in parts], total)
    return AreaEstimates(total, tuple(out), overall)


def _summed(parts: list[tuple[int, Estimate]], total: int) -> Estimate:
    """A share of ``total`` pixels from (pixels, share) per domain: value and variance add in
    pixels; a domain without a standard error leaves the sum without one."""
    value = sum(n * e.value for n, e in parts) / total
    missing = [e.why for _, e in parts if e.se is None]
    if missing:
        return Estimate(value, None, f"a district's standard error is missing ({missing[0]})")
    se = math.sqrt(sum((n * e.se) ** 2 for n, e in parts)) / total  # type: ignore[operator]
    return Estimate(value, se)


def with_interval(est: AreaEstimates, z: float) -> AreaEstimates:
    """``est`` with each area's and the overall accuracy's interval the normal one at ``z``,
    clipped to [0, 1]; none where the standard error is 0 or missing."""

    def bounded(e: Estimate) -> Estimate:
        if not e.se:
            return e
        lo, hi = max(0.0, e.value - z * e.se), min(1.0, e.value + z * e.se)
        return Estimate(e.value, e.se, e.why, min(lo, e.value), max(hi, e.value))

    classes = tuple(replace(c, proportion=bounded(c.proportion)) for c in est.classes)
    return AreaEstimates(est.total_px, classes, bounded(est.overall))


def sum_shares(parts: Sequence[tuple[int, AreaShares]], total: int, z: float) -> AreaShares:
    """:func:`with_interval` of :func:`sum_estimates`, area shares only, of B samples at once:
    ``parts`` (pixels, shares) per domain, in the order :func:`sum_estimates` adds them (so
    every figure rounds as its)."""
    value = squares = 0.0
    listed = missing = False
    units = 0
    for n, part in parts:
        value = value + np.where(part.listed, n * part.value, 0.0)
        x = n * part.se
        # Python's x ** 2 (C pow), which numpy's square is not in the last bit
        squares = squares + np.where(part.listed, np.power(x, np.full_like(x, 2.0)), 0.0)
        missing = missing | (part.listed & np.isnan(part.se))
        listed = listed | part.listed
        units = units + np.where(part.listed, part.units_reference, 0)
    value = value / total
    se = np.where(missing, np.nan, np.sqrt(squares) / total)
    has = ~np.isnan(se) & (se != 0)  # no interval where the standard error is 0 or missing
    lo = np.where(has, np.fmin(np.fmax(0.0, value - z * se), value), np.nan)
    hi = np.where(has, np.fmax(np.fmin(1.0, value + z * se), value), np.nan)
    return AreaShares(value, se, lo, hi, np.asarray(listed), np.asarray(units, np.int64))


def check_districts(
    population: TestSplitCounts, cmap: ClassMap, design: AreaSettings, n: int
) -> DistrictCheck:
    """The check by district at L1, L2 and L3: ``design.draws`` seeded samples of ``n`` units
    (draw d from ``default_rng([design.seed, STREAM, d])``) stratified by district x map class
    at ``design.level``, each domain estimated from its own units, the total as their sum;
    every interval compared with the CDL's area of the domain (or of all)."""
    if population.domains is None:
        raise ValueError("check_districts: expected a population counted per district")
    domains = population.domains.reshape(len(population.domains), CELLS)
    n_domains, k = len(domains), LEVEL_CLASSES[design.level]
    strata_l3 = level_table(design.level, cmap)[:N_L3].astype(np.int64)
    cell_stratum = np.repeat(strata_l3, N_L3)  # (CELLS,) the stratum of a (map, CDL) cell
    strata = np.arange(n_domains)[:, None] * k + cell_stratum[None, :]
    sizes = np.bincount(strata.ravel(), weights=domains.ravel(), minlength=n_domains * k)
    units, n, note = allocation(sizes.astype(np.int64).reshape(n_domains, k), n,
                                design.min_per_class)  # fmt: skip
    sampler = StratifiedSampler(domains, strata, n_domains * k, n, design.min_per_class,
                                units.ravel())  # fmt: skip
    tables = {lv: level_table(lv, cmap)[:N_L3].astype(np.int64) for lv in (1, 2, 3)}

    def counts(cells: np.ndarray, level: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """mapped px, CDL px (K_level,) and px per stratum and class (k, K_level)."""
        grid, table, size = cells.reshape(N_L3, N_L3), tables[level], LEVEL_CLASSES[level]
        by = np.zeros((k, size), np.int64)
        np.add.at(by, (strata_l3, table), grid.sum(1))
        return (np.bincount(table, grid.sum(1), size).astype(np.int64),
                np.bincount(table, grid.sum(0), size).astype(np.int64), by)  # fmt: skip

    held = [d for d in range(n_domains) if domains[d].sum()]
    per = {(d, lv): counts(domains[d], lv) for d in held for lv in (1, 2, 3)}
    whole = {lv: counts(domains.sum(0), lv) for lv in (1, 2, 3)}
    first: dict[tuple[int, int], AreaEstimates] = {}
    z, total_px = design.z, int(domains.sum())
    held_px = domains[held].sum(1)
    tallies = {lv: (DrawTallies(np.array([per[d, lv][1] for d in held]), held_px),
                    DrawTallies(whole[lv][1][None, :], np.array([total_px])))
               for lv in (1, 2, 3)}  # fmt: skip
    cells = np.flatnonzero(domains)  # (domain, map L3, CDL L3) cells with pixels
    strata_px = sizes.astype(np.int64).reshape(n_domains, k)
    domain, within = np.divmod(cells, CELLS)
    row = np.searchsorted(held, domain)  # each cell's domain among the held (all hold pixels)
    if design.draws < 1:
        raise ValueError(f"draws: expected at least 1 draw, found {design.draws}")
    at_once = max(1, min(SHARES_CHUNK, DOMAIN_CELLS // (len(held) * CELLS)))
    for start in range(0, design.draws, at_once):  # the draws of every domain, in order
        chunk = range(start, min(start + at_once, design.draws))
        samples = draw_all(sampler, chunk, [design.seed, STREAM], cells)
        if start == 0:
            first.update(first_estimates(samples[0], cells, held, per, strata_px, strata_l3,
                                         tables, design))  # fmt: skip
        grid = np.zeros((len(held), len(chunk), CELLS), np.int64)
        grid[row, :, within] = samples.T  # (D, B, map L3 x CDL L3) units of each held domain
        grid = grid.reshape(len(held), len(chunk), N_L3, N_L3)
        as_float = grid.astype(float)  # summed by class as products: exact, whole numbers
        for level in (1, 2, 3):
            mapped_px = np.array([per[d, level][0] for d in held])
            shares = domain_shares(grid, as_float, level, design.level, strata_l3, tables[level],
                                   strata_px[held], mapped_px, design.confidence)  # fmt: skip
            tallies[level][0].add(shares, z)
            parts = [(int(px), _row(shares, i)) for i, px in enumerate(held_px)]
            tallies[level][1].add(_row(sum_shares(parts, total_px, z), None), z)
    for level in (1, 2, 3):
        first[-1, level] = with_interval(sum_estimates([first[d, level] for d in held]), z)
    coverage = {(d, lv): tallies[lv][0].coverage(i) for i, d in enumerate(held) for lv in (1, 2, 3)}
    coverage.update({(-1, lv): tallies[lv][1].coverage(0) for lv in (1, 2, 3)})

    def checks(d: int, mapped: dict) -> tuple[LevelCheck, ...]:
        return tuple(LevelCheck(lv, first[d, lv], mapped[lv][0], mapped[lv][1],
                                coverage[d, lv], design.draws) for lv in (1, 2, 3))  # fmt: skip

    names = population.domain_names
    out = tuple(
        DomainCheck(names[d], int(domains[d].sum()),
                    checks(d, {lv: per[d, lv] for lv in (1, 2, 3)}) if d in held else ())
        for d in range(n_domains)
    )  # fmt: skip
    return DistrictCheck(out, checks(-1, whole), units, note)


def first_estimates(
    sample: np.ndarray, cells: np.ndarray, held: list[int], per: dict, strata_px: np.ndarray,
    strata_l3: np.ndarray, tables: dict[int, np.ndarray], design: AreaSettings,
) -> dict[tuple[int, int], AreaEstimates]:  # fmt: skip
    """Each held domain's estimates at every level of the first draw (``sample``: its units in
    ``cells``), in full, as a user would publish them."""
    out = {}
    domain, within = np.divmod(cells, CELLS)
    for d in held:
        own = domain == d
        m3, r3 = np.divmod(np.repeat(within[own], sample[own]), N_L3)  # its units' cells
        for level in (1, 2, 3):
            mapped_px, _, by = per[d, level]
            t = tables[level]
            out[d, level] = estimate_at(level, design.level, strata_px[d], strata_l3[m3], t[m3],
                                        t[r3], mapped_px, by, design.confidence)  # fmt: skip
    return out


def domain_shares(
    grid: np.ndarray, as_float: np.ndarray, level: int, design_level: int,
    strata_l3: np.ndarray, table: np.ndarray, strata_px: np.ndarray, mapped_px: np.ndarray,
    confidence: float,
) -> AreaShares:  # fmt: skip
    """The area shares at ``level`` of D domains' B draws, arrays (D, B, K): ``grid`` (D, B,
    map L3, CDL L3) their units (``as_float``: the same as floats), strata the map's classes
    at ``design_level`` (``strata_l3``: of each map L3 class), ``table`` each L3 class's at
    ``level``. Olofsson's at the design level, Stehman's at the others, as
    :func:`emb.estimation.holdout_check.shares_at` gives each domain's. Units are summed by
    class as products of floats: exact (whole numbers far below 2**53)."""
    k = int(mapped_px.shape[-1])
    by_class = _one_hot(table, k)  # (map L3 or CDL L3, class at level)
    if level == design_level:
        if _is_identity(table):
            return olofsson_domain_shares(mapped_px, grid, confidence)
        matrices = np.swapaxes(by_class, 0, 1) @ (as_float @ by_class)
        return olofsson_domain_shares(mapped_px, _whole(matrices), confidence)
    to_class = as_float @ by_class  # (D, B, map L3, class at level)
    h = strata_px.shape[-1]
    hits = to_class if _is_identity(strata_l3) else _one_hot(strata_l3, h).T @ to_class
    n_mapped = to_class.sum(-1) @ by_class
    return stehman_domain_shares(strata_px, _whole(hits), _whole(n_mapped), mapped_px, confidence)


def _one_hot(labels: np.ndarray, size: int) -> np.ndarray:
    """(len(labels), size) 1.0 where entry i has label j: sums by label as a product."""
    out = np.zeros((len(labels), size))
    out[np.arange(len(labels)), labels] = 1.0
    return out


def _is_identity(labels: np.ndarray) -> bool:
    return len(labels) == N_L3 and bool((labels == np.arange(N_L3)).all())


def _whole(counts: np.ndarray) -> np.ndarray:
    """Unit counts summed as floats (exact: whole numbers far below 2**53) as int64."""
    return np.rint(counts).astype(np.int64)


def _row(shares: AreaShares, index: int | None) -> AreaShares:
    """One row of shares with rows in front (``None``: a row in front of shares without)."""
    return AreaShares(*(getattr(shares, f.name)[index] for f in fields(shares)))
