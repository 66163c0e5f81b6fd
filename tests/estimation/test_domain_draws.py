"""The check by district estimates every domain's draws at once (estimators'
olofsson_domain_shares / stehman_domain_shares, intervals.area_by_stratum, holdout_check's
DrawTallies): each domain's numbers must be the ones its own shares (olofsson_shares,
stehman_shares, area, tally_draws) give, to the last bit, whatever the domains share."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from test_check_draws import uneven_population
from test_holdout_check import CMAP, settings

from emb.classes import N_L3
from emb.estimation import district_check, intervals
from emb.estimation.district_check import check_districts
from emb.estimation.estimators import (
    AreaShares,
    olofsson_domain_shares,
    olofsson_shares,
    stehman_domain_shares,
    stehman_shares,
    strata_counts,
)
from emb.estimation.holdout_check import ClassCoverage, DrawTallies, tally_draws


def strata_of_domains(rng: np.random.Generator, d: int, h: int) -> np.ndarray:
    """(D, H) pixels per domain and stratum: strata without pixels in some domains (not all),
    a stratum of 2 pixels (1 unit in every other draw: no variance there)."""
    big_n = rng.integers(1, 5000, (d, h)) * (rng.random((d, h)) > 0.3)
    big_n[:, 0] += 50
    big_n[0, -1] = 2
    return big_n


def units_of(rng: np.random.Generator, big_n: np.ndarray, b: int, k: int) -> np.ndarray:
    """(D, B, H, K) units per stratum and reference class, at most a stratum's pixels, a
    stratum's units mostly of one class (as a map's errors leave them)."""
    d, h = big_n.shape
    out = np.zeros((d, b, h, k), np.int64)
    for i, s in zip(*np.nonzero(big_n), strict=True):
        for draw in range(b):
            take = 1 + draw % 2 if big_n[i, s] == 2 else min(big_n[i, s], int(rng.integers(1, 30)))
            out[i, draw, s] = rng.multinomial(take, rng.dirichlet(np.full(k, 0.1)))
    return out


def assert_rows_equal(got: AreaShares, d: int, want: AreaShares) -> None:
    """Domain d's shares are ``want``'s bit for bit (bounds where a class is listed: the
    others are never read)."""
    for f in fields(AreaShares):
        mine, theirs = getattr(got, f.name)[d], getattr(want, f.name)
        if f.name in ("lo", "hi"):
            mine, theirs = (np.where(want.listed, v, 0.0) for v in (mine, theirs))
        assert np.array_equal(mine, theirs, equal_nan=True), (d, f.name)


@pytest.mark.parametrize("seed", range(6))
def test_the_area_by_stratum_is_areas_bit_for_bit(seed: int) -> None:
    """Lone units, census strata, strata without pixels or units, classes without hits."""
    rng = np.random.default_rng(seed)
    d, b, h, k = 3, 4, int(rng.integers(2, 45)), int(rng.integers(2, 45))
    big_n = strata_of_domains(rng, d, h)
    hits = units_of(rng, big_n, b, k)
    units = hits.sum(-1)
    census = rng.random((d, h)) < 0.1  # a stratum sampled whole
    hits[:, :, census.any(0)] = 0
    for i, s in zip(*np.nonzero(census), strict=True):
        hits[i, :, s, 0] = big_n[i, s]
    units = hits.sum(-1)
    got = intervals.area_by_stratum(big_n[:, None, :], units, hits, 0.95)
    for i in range(d):
        want = intervals.area(big_n[i], units[i][:, None, :], np.swapaxes(hits[i], -1, -2), 0.95)
        for mine, theirs in zip(got, want, strict=True):
            assert np.array_equal(mine[i], theirs, equal_nan=True), i


@pytest.mark.parametrize("seed", range(6))
def test_olofsson_domain_shares_are_each_domains_shares_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.choice([2, 7, 25, 61]))
    big_n = strata_of_domains(rng, 4, k)
    matrices = units_of(rng, big_n, 5, k)
    got = olofsson_domain_shares(big_n, matrices, 0.95)
    for d in range(len(big_n)):
        assert_rows_equal(got, d, olofsson_shares(big_n[d], matrices[d], 0.95))


@pytest.mark.parametrize("seed", range(6))
def test_stehman_domain_shares_are_each_domains_shares_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, k = int(rng.integers(3, 61)), int(rng.choice([2, 7]))
    big_n = strata_of_domains(rng, 4, h)
    mapped_as = rng.integers(0, k, h)  # each stratum's pixels mapped as one class
    hits = units_of(rng, big_n, 5, k)
    stratum, reference = (a.ravel() for a in np.indices((h, k)))
    n_mapped = np.zeros((len(big_n), 5, k), np.int64)
    for d in range(len(big_n)):
        mapped_px = np.bincount(mapped_as, big_n[d], k).astype(np.int64)
        table = np.zeros((h, k), np.int64)
        table[np.arange(h), mapped_as] = big_n[d]
        units = hits[d].reshape(5, -1)
        n_mapped[d] = [np.bincount(mapped_as[stratum], u, k) for u in units]
        counts = strata_counts(stratum, mapped_as[stratum], reference, h, k, units, table > 0,
                               table == big_n[d][:, None])  # fmt: skip
        want = stehman_shares(big_n[d], counts, mapped_px, 0.95)
        all_px = np.array([np.bincount(mapped_as, n, k) for n in big_n]).astype(np.int64)
        got = stehman_domain_shares(big_n, hits, n_mapped, all_px, 0.95)
        assert_rows_equal(got, d, want)


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


@pytest.mark.parametrize("cells", [N_L3 * N_L3, 2**21])
def test_domains_that_differ_and_chunks_of_any_size_give_the_same_check(
    cells: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One draw at a time (each domain's units of one draw held at once) or every draw at
    once: the same check; and a domain lacking strata the others hold."""
    population = uneven_population()
    design = settings(n=300, min_per_class=5, level=3, seed=3, draws=7)
    monkeypatch.setattr(district_check, "DOMAIN_CELLS", 2**21)
    want = check_districts(population, CMAP, design, 300)
    monkeypatch.setattr(district_check, "DOMAIN_CELLS", cells)
    got = check_districts(population, CMAP, design, 300)
    for mine, theirs in zip(got.domains, want.domains, strict=True):
        for a, b in zip(mine.levels, theirs.levels, strict=True):
            assert a.coverage == b.coverage and a.estimates == b.estimates
    assert [t.coverage for t in got.total] == [t.coverage for t in want.total]
