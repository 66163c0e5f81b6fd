"""The check by district estimates every domain's draws at once (district_check.DomainShares
from the draws' cells with units, holdout_check.draw_runs; holdout_check.DrawTallies): each
domain's figures must be within 1e-12 relative of the ones its own shares (shares_at,
tally_draws) give, what it lists and its units the same, whatever the domains share."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from test_check_draws import uneven_population
from test_holdout_check import CMAP, settings

from emb.estimation import district_check
from emb.estimation.district_check import DomainShares, check_districts
from emb.estimation.estimators import AreaEstimateError, AreaShares
from emb.estimation.holdout_check import (
    ClassCoverage,
    DrawTallies,
    StratifiedSampler,
    draw_runs,
    shares_at,
    tally_draws,
)


class Domains:
    """D domains of H strata, each stratum's pixels in a few (map class, CDL class) cells:
    strata a domain lacks, strata sampled whole (a census), big and small ones, and in the
    first domain strata of 1 unit among more pixels (no variance, no interval);
    ``olofsson``: the strata are the map's classes (K = H), else each cell's map class is its
    own (K classes)."""

    def __init__(self, rng: np.random.Generator, d: int, h: int, k: int, olofsson: bool) -> None:
        cells = []  # (domain, stratum, map class, CDL class, px)
        for domain in range(d):
            for s in range(h):
                if s and rng.random() < 0.25:
                    continue  # a stratum this domain lacks
                size = int(rng.choice([1, 2, 3, 40, 900, 50_000]))
                for r in rng.choice(k, int(rng.integers(1, 5))):  # cells of one class too
                    mapped = s if olofsson else int(rng.integers(0, k))
                    cells.append((domain, s, mapped, int(r), size + int(rng.integers(0, 9))))
        self.domain, self.stratum, self.mapped, self.reference, self.px = np.array(cells).T
        self.d, self.h, self.k = d, h, k
        self.strata_px = np.bincount(self.domain * h + self.stratum, self.px, d * h).astype(int)
        units = np.minimum(self.strata_px, rng.integers(1, 25, d * h))
        units[:h][rng.random(h) < 0.3] = 1  # the first domain's: no variance (more pixels)
        self.units = np.where(self.strata_px > 0, units, 0)
        self.mapped_px = np.zeros((d, k), np.int64)
        np.add.at(self.mapped_px, (self.domain, self.mapped), self.px)

    def draws(self, rng: np.random.Generator, b: int) -> np.ndarray:
        """(B, cells) each draw's units per cell: each stratum's units without replacement."""
        out = np.zeros((b, len(self.px)), np.int64)
        of = self.domain * self.h + self.stratum
        for g in np.flatnonzero(self.units):
            mine = np.flatnonzero(of == g)
            out[:, mine] = rng.multivariate_hypergeometric(self.px[mine], self.units[g], size=b)
        return out

    def estimator(self, confidence: float | None = 0.95) -> DomainShares:
        return DomainShares(self.domain, self.domain * self.h + self.stratum, self.reference,
                            self.strata_px, self.units, self.mapped_px, confidence)  # fmt: skip

    def own_shares(self, d: int, draws: np.ndarray, olofsson: bool) -> AreaShares:
        """Domain d's shares from its own cells, as the whole's check estimates them."""
        mine = self.domain == d
        strata_mapped = np.zeros((self.h, self.k), np.int64)
        np.add.at(strata_mapped, (self.stratum[mine], self.mapped[mine]), self.px[mine])
        return shares_at(1, 1 if olofsson else 2, self.strata_px[d * self.h : (d + 1) * self.h],
                         self.stratum[mine], self.mapped[mine], self.reference[mine],
                         draws[:, mine], self.mapped_px[d], strata_mapped, 0.95)  # fmt: skip


def runs_of(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, cells) units as draw_runs gives them: (draw, cell, units) of each cell with units."""
    draw, cell = np.nonzero(draws)
    return draw, cell, draws[draw, cell]


def assert_close(got: AreaShares, d: int, want: AreaShares) -> None:
    """Domain d's shares within 1e-12 relative of ``want``'s, what it lists and its units the
    same (bounds where a class is listed: the others are never read)."""
    assert np.array_equal(got.listed[d], want.listed), d
    assert np.array_equal(got.units_reference[d], want.units_reference), d
    for f in ("value", "se", "lo", "hi"):
        mine, theirs = getattr(got, f)[d], getattr(want, f)
        if f in ("lo", "hi"):
            mine, theirs = (np.where(want.listed, v, 0.0) for v in (mine, theirs))
        assert np.array_equal(np.isnan(mine), np.isnan(theirs)), (d, f)
        assert np.allclose(mine, theirs, rtol=1e-12, atol=0, equal_nan=True), (d, f)


@pytest.mark.parametrize("olofsson", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_domain_shares_are_each_domains_own_shares(seed: int, olofsson: bool) -> None:
    """Olofsson's (strata the map's classes) and Stehman's (map classes of their own), every
    kind of stratum; the units of cells of one (stratum, CDL class) summed."""
    rng = np.random.default_rng(seed)
    h = int(rng.integers(2, 30))
    k = h if olofsson else int(rng.integers(2, 12))
    domains = Domains(rng, 4, h, k, olofsson)
    draws = domains.draws(rng, 7)
    got = domains.estimator().shares(*runs_of(draws), len(draws))
    for d in range(domains.d):
        assert_close(got, d, domains.own_shares(d, draws, olofsson))


def test_domain_shares_without_a_confidence_have_no_interval() -> None:
    domains = Domains(np.random.default_rng(1), 2, 5, 5, True)
    draws = domains.draws(np.random.default_rng(2), 3)
    got = domains.estimator(None).shares(*runs_of(draws), len(draws))
    assert np.isnan(got.lo).all() and np.isnan(got.hi).all() and not np.isnan(got.value).any()


def test_a_stratum_with_pixels_and_no_unit_is_refused() -> None:
    domains = Domains(np.random.default_rng(3), 2, 5, 5, True)
    domains.units[np.flatnonzero(domains.strata_px)[2]] = 0
    with pytest.raises(AreaEstimateError, match=r"stratum \d+ \(N=\d+ px\) has 0 sample units"):
        domains.estimator()


def test_draw_runs_are_each_draws_cells_with_units() -> None:
    """The same stream's draws as draw by draw, as (draw, cell, units) entries, draw after
    draw, each draw's cells ascending."""
    rng = np.random.default_rng(6)
    joint = rng.integers(0, 50, (6, 8)) * (rng.random((6, 8)) > 0.3)
    sampler = StratifiedSampler(joint, rng.integers(0, 4, (6, 8)), 4, 60, 5)
    draw, cell, units = draw_runs(sampler, range(3, 7), [9, 1])
    for b, d in enumerate(range(3, 7)):
        want = sampler.cell_units(np.random.default_rng([9, 1, d]))
        assert np.array_equal(cell[draw == b], np.flatnonzero(want))
        assert np.array_equal(units[draw == b], want[want > 0])
    assert np.array_equal(draw, np.sort(draw))
    with pytest.raises(ValueError, match="draws: expected at least 1 draw, found 0"):
        draw_runs(sampler, range(0), [0])


def test_draw_tallies_are_each_rows_tally_draws() -> None:
    """Random shares of 3 rows, 2 chunks of draws: every count and the half-widths' sums
    (one draw after another) as tally_draws gives each row."""
    rng = np.random.default_rng(4)
    rows, b, k, z = 3, 30, 6, 1.959963984540054
    cdl_px = rng.integers(0, 900, (rows, k)) * (rng.random((rows, k)) > 0.2)
    total = cdl_px.sum(1) + 100
    tallies = DrawTallies(cdl_px, total)
    want: list[dict[int, ClassCoverage]] = [{} for _ in range(rows)]
    for _ in range(2):
        value = rng.random((rows, b, k)) * 0.5
        se = np.where(rng.random((rows, b, k)) < 0.1, np.nan, rng.random((rows, b, k)) * 0.1)
        se[rng.random((rows, b, k)) < 0.1] = 0.0
        lo = np.maximum(value - rng.random((rows, b, k)) * 0.2, 0)
        hi = value + rng.random((rows, b, k)) * 0.2
        lo[rng.random((rows, b, k)) < 0.1] = np.nan
        exact = rng.random((rows, b, k)) < 0.1
        lo[exact], hi[exact] = value[exact], value[exact]
        value[rng.random((rows, b, k)) < 0.05] = 0.0
        listed = rng.random((rows, b, k)) < 0.9
        units = rng.integers(0, 40, (rows, b, k))
        shares = AreaShares(value, se, lo, hi, listed, units)
        tallies.add(shares, z)
        for r in range(rows):
            row = AreaShares(*(getattr(shares, f.name)[r] for f in fields(AreaShares)))
            tally_draws(want[r], row, cdl_px[r], int(total[r]), z)
    for r in range(rows):
        assert tallies.coverage(r) == want[r], r
        assert list(tallies.coverage(r)) == list(want[r])  # classes in the same order


@pytest.mark.parametrize("draws_at_once", [1, 3, 1000])
def test_domains_that_differ_and_chunks_of_any_size_give_the_same_check(
    draws_at_once: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One draw at a time, a few, or every draw at once: the same check, to the last bit (a
    figure's sums run within its draw); and a domain lacking strata the others hold."""
    population = uneven_population()
    design = settings(n=300, min_per_class=5, level=3, seed=3, draws=7)
    monkeypatch.setattr(district_check, "DOMAIN_SHARES", 2**21)
    want = check_districts(population, CMAP, design, 300)
    monkeypatch.setattr(district_check, "DOMAIN_SHARES", draws_at_once * 4 * 61)
    got = check_districts(population, CMAP, design, 300)
    for mine, theirs in zip(got.domains, want.domains, strict=True):
        for a, b in zip(mine.levels, theirs.levels, strict=True):
            assert a.coverage == b.coverage and a.estimates == b.estimates
    assert [t.coverage for t in got.total] == [t.coverage for t in want.total]
