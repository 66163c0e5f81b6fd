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
state's scale) are estimated every domain at once, many draws at a time (``DOMAIN_SHARES``
bounds the memory), from each draw's cells with units only (:func:`draw_runs`: the same
random stream, the same units as ever). :class:`DomainShares` sums each domain's terms over
its strata with units (their no-unit terms summed once, before any draw), the total's shares
are :func:`total_shares`, the tallies arrays (:class:`~emb.estimation.holdout_check.DrawTallies`).
Every figure lies within 1e-12 relative of each domain's own
:func:`~emb.estimation.holdout_check.shares_at` (the sums run in another order: not bit for
bit), every coverage count is the same (``tests/estimation/test_domain_draws.py``,
``tests/estimation/test_check_draws.py``); the first draw's estimates, as published, are each
domain's :func:`~emb.estimation.holdout_check.estimate_at` itself. With ``threads`` > 1 the
draws run in contiguous ranges in forked processes (:func:`drawn_apart`), the same figures to
the last bit (``tests/estimation/test_district_draws_forked.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from emb import forks
from emb.classes import N_L3, ClassMap
from emb.estimation.design import allocate
from emb.estimation.estimators import (
    AreaEstimateError,
    AreaEstimates,
    AreaShares,
    ClassEstimate,
    Estimate,
)
from emb.estimation.holdout_check import (
    DrawCounts,
    DrawTallies,
    LevelCheck,
    StratifiedSampler,
    draw_runs,
    estimate_at,
)
from emb.estimation.holdout_counts import LEVEL_CLASSES, TestSplitCounts
from emb.estimation.intervals import JEFFREYS, effective_n_bounds
from emb.estimation.population import level_table
from emb.estimation.settings import AreaSettings

CELLS = N_L3 * N_L3  # (map L3, CDL L3) cells of one domain
STREAM = 1  # the draws' seeds: [seed, STREAM, d], apart from the whole check's [seed, d]
DOMAIN_SHARES = 2**17  # domains x draws x L3 classes estimated at once: 1 MiB arrays, in cache
Counted = Callable[[int, int, DrawCounts], None]  # a chunk's counts: (level, tally, counts)


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


def check_districts(
    population: TestSplitCounts, cmap: ClassMap, design: AreaSettings, n: int, threads: int = 1
) -> DistrictCheck:
    """The check by district at L1, L2 and L3: ``design.draws`` seeded samples of ``n`` units
    (draw d from ``default_rng([design.seed, STREAM, d])``) stratified by district x map class
    at ``design.level``, each domain estimated from its own units, the total as their sum;
    every interval compared with the CDL's area of the domain (or of all). ``threads`` > 1:
    the draws in contiguous ranges, in up to ``threads`` forked processes
    (:func:`drawn_apart`), with the same results to the last bit."""
    if population.domains is None:
        raise ValueError("check_districts: expected a population counted per district")
    if design.draws < 1:
        raise ValueError(f"draws: expected at least 1 draw, found {design.draws}")
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
    z, total_px = design.z, int(domains.sum())
    held_px = domains[held].sum(1)
    tallies = {lv: (DrawTallies(np.array([per[d, lv][1] for d in held]), held_px),
                    DrawTallies(whole[lv][1][None, :], np.array([total_px])))
               for lv in (1, 2, 3)}  # fmt: skip
    row = np.full(n_domains, -1)
    row[held] = np.arange(len(held))  # each domain's row among the held
    domain, within = np.divmod(sampler.cells, CELLS)  # the sampler's cells with pixels
    strata_px = sizes.astype(np.int64)
    estimators = {
        lv: DomainShares(row[domain], domain * k + strata_l3[within // N_L3],
                         tables[lv][within % N_L3], strata_px, sampler.allocation,
                         np.array([per[d, lv][0] for d in held]), design.confidence)
        for lv in (1, 2, 3)
    }  # fmt: skip
    at_once = max(1, DOMAIN_SHARES // (len(held) * N_L3))

    zero = sampler.cell_runs(np.random.default_rng([design.seed, STREAM, 0]))  # as published

    def run_part(draws: range, first_of: Sequence[int], counted: Counted) -> dict:
        """The contiguous draws ``draws``, ``at_once`` at a time, each chunk's counts given to
        ``counted`` (level, 0 the domains or 1 the total, counts) in draw order; and the first
        draw's estimates of the domains ``first_of``."""
        for start in range(draws.start, draws.stop, at_once):
            chunk = range(start, min(start + at_once, draws.stop))
            draw, cell, drawn = draw_runs(sampler, chunk, [design.seed, STREAM])
            for level in (1, 2, 3):
                shares = estimators[level].shares(draw, cell, drawn, len(chunk))
                counted(level, 0, tallies[level][0].counted(shares, z))
                totals = total_shares(shares, held_px, total_px, z)
                counted(level, 1, tallies[level][1].counted(totals, z))
        return first_estimates(sampler.cells[zero[0]], zero[1], list(first_of), per,
                               strata_px.reshape(n_domains, k), strata_l3, tables,
                               design)  # fmt: skip

    first = drawn_apart(run_part, design.draws, held, threads,
                        lambda lv, i, c: tallies[lv][i].take(c))  # fmt: skip
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


def drawn_apart(
    run_part: Callable[[range, Sequence[int], Counted], dict], draws: int, held: list[int],
    threads: int, counted: Counted,
) -> dict:  # fmt: skip
    """``run_part(range(draws), held, counted)``: the first draw's estimates of the domains
    ``held`` it returns, with the draws in contiguous ranges and the domains' first estimates
    (as costly as the draws at a state's scale) in shares, a range and a share a part, in up to
    ``threads`` forked processes (:mod:`emb.forks`; here, in turn, where none can be forked). A
    worker sends its chunks' counts back untallied, and they are given to ``counted`` here in
    draw order: the half-widths' float sums round as in one process (a worker's partial sums,
    added here, would not)."""
    workers = forks.forked_workers(threads, draws)
    if workers < 2:
        return run_part(range(draws), held, counted)
    ranges = forks.shares(range(draws), workers)
    domains = forks.shares(held, workers)  # fewer than the ranges where fewer domains

    def run_range(part: int) -> tuple[dict, list[tuple[int, int, DrawCounts]]]:
        found: list[tuple[int, int, DrawCounts]] = []
        mine = domains[part] if part < len(domains) else []
        return run_part(ranges[part], mine, lambda *chunk: found.append(chunk)), found

    first = {}
    for part_first, found in forks.in_parts(run_range, len(ranges), workers):
        first.update(part_first)
        for chunk in found:
            counted(*chunk)
    return first


def first_estimates(
    cells: np.ndarray, drawn: np.ndarray, held: list[int], per: dict, strata_px: np.ndarray,
    strata_l3: np.ndarray, tables: dict[int, np.ndarray], design: AreaSettings,
) -> dict[tuple[int, int], AreaEstimates]:  # fmt: skip
    """Each held domain's estimates at every level of the first draw (``drawn`` units in each
    of ``cells``, flat indices of (domain, map L3, CDL L3)), in full, as a user would publish
    them."""
    out = {}
    order = np.argsort(cells)
    domain, within = np.divmod(cells[order], CELLS)
    drawn = drawn[order]
    for d in held:
        own = domain == d
        m3, r3 = np.divmod(np.repeat(within[own], drawn[own]), N_L3)  # its units' cells
        for level in (1, 2, 3):
            mapped_px, _, by = per[d, level]
            t = tables[level]
            out[d, level] = estimate_at(level, design.level, strata_px[d], strata_l3[m3], t[m3],
                                        t[r3], mapped_px, by, design.confidence)  # fmt: skip
    return out


class DomainShares:
    """The area shares at one level of every held domain's draws, each domain estimated from
    its own strata: Olofsson's at the design level, Stehman's at the others (one formula:
    with strata the map's classes the two are the same sums), each with the interval that
    holds (:func:`emb.estimation.intervals.area`), as each domain's
    :func:`emb.estimation.holdout_check.shares_at` gives them, to float rounding.

    Why not per domain: 101 domains x 40 classes x 200 draws at a state's scale, while a
    draw's units fill few cells (20 units a stratum). So every sum over the strata is taken
    over the cells with units only: a stratum's units per draw are its allocation (fixed), so
    its weights, its pseudo-counts and the terms of a class without a unit there are known
    before any draw; each domain's sum of those terms is computed once, and a draw adds, for
    each (stratum, class) with units, its term less the no-unit term. The sums run in another
    order than the per-domain code's: results within 1e-12 relative of it
    (``tests/estimation/test_domain_draws.py``), coverage tallies the same."""

    def __init__(
        self, row: np.ndarray, stratum: np.ndarray, reference: np.ndarray,
        strata_px: np.ndarray, strata_units: np.ndarray, mapped_px: np.ndarray,
        confidence: float | None,
    ) -> None:  # fmt: skip
        """row, stratum, reference (C,): each cell's domain (its row among the held), stratum
        (an index into strata_px and strata_units, (S,) pixels and units per stratum) and CDL
        class at the level; mapped_px (R, K) each held domain's pixels per map class."""
        big_n, n = np.asarray(strata_px, np.int64), np.asarray(strata_units, np.int64)
        bad = np.flatnonzero((n > big_n) | ((n == 0) & (big_n > 0)))
        if len(bad):
            raise AreaEstimateError(
                f"stratum {bad[0]} (N={big_n[bad[0]]} px) has {n[bad[0]]} sample units: "
                f"expected 1 to N"
            )
        self.rows, self.k = mapped_px.shape
        self.mapped = np.asarray(mapped_px) > 0
        self.confidence = confidence
        owner = np.full(len(big_n), -1)
        owner[stratum] = row  # each stratum's domain row (-1: no cell with pixels)
        sampled = owner >= 0
        domain_px = np.bincount(owner[sampled], big_n[sampled], self.rows)
        w = np.where(sampled, big_n / domain_px[np.maximum(owner, 0)], 0.0)
        n_f = n.astype(float)
        census = n >= big_n
        prior = np.where(census, 0.0, JEFFREYS)
        total = n_f + 2 * prior  # the two categories' alphas: hits and the rest
        spread = np.where(census, 0.0, 1 / np.maximum(n_f, 1))
        none_share = prior / np.maximum(total, 1)
        none_var = w**2 * none_share * (1 - none_share) * spread
        sums = {name: np.bincount(owner[sampled], v[sampled], self.rows)
                for name, v in (("x", w * (n > 0)), ("smooth", w * none_share),
                                ("var", none_var))}  # fmt: skip
        self.x, self.smooth, self.var = sums["x"], sums["smooth"], sums["var"]
        self.lone = np.bincount(owner[sampled], (n == 1)[sampled] & (big_n > 1)[sampled],
                                self.rows) > 0  # fmt: skip
        # a variance from 1 unit is none; census strata none either (1 - n / N = 0)
        olofsson_var = np.divide(w**2, (n_f - 1) * n_f**2, out=np.zeros_like(w),
                                 where=(n > 1) & ~census)  # fmt: skip
        # each stratum's terms of a class with a = 1..n_h units there: at a row of their own
        # (a draw's entry looks its terms up, computes none), n units' rows in all
        first = np.cumsum(n) - n
        of = np.repeat(np.arange(len(n)), n)
        hits = (np.arange(len(of)) - first[of] + 1).astype(float)
        smoothed = (hits + prior[of]) / total[of]
        self.terms = {
            "value": w[of] * (hits / n_f[of]),  # W_h n_hk / n_h
            "variance": olofsson_var[of] * hits * (n_f[of] - hits),
            "smooth": w[of] * smoothed - (w * none_share)[of],
            "var": (w**2 * spread)[of] * smoothed * (1 - smoothed) - none_var[of],
            "units": hits,
        }
        # the (domain, stratum, class) of each cell: several cells may be one at this level
        keys, self.key = np.unique(stratum * self.k + reference, return_inverse=True)
        self.merged = len(keys) < len(stratum)
        at, self.cls = np.divmod(keys, self.k)
        self.row = owner[at]
        self.first = first[at] - 1  # a key's row of a units: first + a

    def shares(self, draw: np.ndarray, cell: np.ndarray, units: np.ndarray, b: int) -> AreaShares:
        """AreaShares (R, B, K) of B draws from their cells with units (:func:`draw_runs`:
        each entry's draw, cell and units)."""
        keys = len(self.row)
        if self.merged:  # the units of cells that are one (stratum, class) here, summed
            got = np.bincount(draw * keys + self.key[cell], units, b * keys)
            at = np.flatnonzero(got)
            draw, key, hits = at // keys, at % keys, got[at].astype(np.int64)
        else:
            key, hits = self.key[cell], units
        term = self.first[key] + hits
        out = (self.row * (b * self.k) + self.cls)[key] + draw * self.k
        size, shape = self.rows * b * self.k, (self.rows, b, self.k)
        got = {name: np.bincount(out, v[term], size).reshape(shape)
               for name, v in self.terms.items()}  # fmt: skip
        value, n_ref = got["value"], np.rint(got["units"]).astype(np.int64)
        listed = self.mapped[:, None, :] | (n_ref > 0)
        lone = self.lone[:, None, None]
        se = np.where(lone, np.nan, np.sqrt(got["variance"]))
        lo = hi = np.full(shape, np.nan)
        if self.confidence is not None:
            x = self.x[:, None, None]
            smooth = (self.smooth[:, None, None] + got["smooth"]) / x
            var = np.maximum((self.var[:, None, None] + got["var"]) / x**2, 0)
            bounds = effective_n_bounds(value / x, smooth, var, self.confidence)
            none = lone | ~listed
            lo = np.where(none, np.nan, np.fmin(bounds.lo, value))
            hi = np.where(none, np.nan, np.fmax(bounds.hi, value))
        return AreaShares(value, se, lo, hi, listed, n_ref)


def total_shares(shares: AreaShares, px: np.ndarray, total: int, z: float) -> AreaShares:
    """:func:`with_interval` of :func:`sum_estimates`, area shares only, of the domains'
    shares (R, B, K) of ``px`` pixels each: the total's shares (1, B, K), to float rounding."""
    listed = shares.listed
    weight = np.asarray(px, float)[:, None, None]
    value = np.where(listed, weight * shares.value, 0.0).sum(0) / total
    # a listed domain's SE missing (NaN) leaves the sum's missing too
    se = np.sqrt(np.where(listed, np.square(weight * shares.se), 0.0).sum(0)) / total
    has = ~np.isnan(se) & (se != 0)  # no interval where the standard error is 0 or missing
    lo = np.where(has, np.fmin(np.fmax(0.0, value - z * se), value), np.nan)
    hi = np.where(has, np.fmax(np.fmin(1.0, value + z * se), value), np.nan)
    units = np.where(listed, shares.units_reference, 0).sum(0)
    return AreaShares(*(a[None] for a in (value, se, lo, hi, listed.any(0), units)))
