"""The test split's check estimates its draws all at once (emb.estimation.holdout_check.shares_at,
tally_draws): every number must be the one that estimating each draw in full (estimate_at,
olofsson, stehman) and counting its intervals gives, to the last bit, and the draws themselves
the sampler's random stream as before. The check by district (district_check.DomainShares,
total_shares) sums in another order: its figures within 1e-12 relative, its counts the same."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from test_holdout_check import CMAP, settings

from emb.classes import N_L3
from emb.estimation import district_check, holdout_check
from emb.estimation.district_check import (
    STREAM,
    check_districts,
    sum_estimates,
    total_shares,
    with_interval,
)
from emb.estimation.estimators import (
    AreaEstimates,
    AreaShares,
    ClassEstimate,
    Estimate,
    olofsson,
    olofsson_shares,
    stehman,
    stehman_shares,
    strata_counts,
    unit_matrix,
)
from emb.estimation.holdout_check import (
    ClassCoverage,
    StrataChoices,
    StratifiedSampler,
    check,
    draw_all,
    estimate_at,
    tally_draws,
)
from emb.estimation.holdout_counts import LEVEL_CLASSES, TestSplitCounts
from emb.estimation.population import level_table


def shares_of(estimates: AreaEstimates, k: int) -> np.ndarray:
    """(5, K) value, se, lo, hi, units_reference of each listed class's area (NaN elsewhere)."""
    out = np.full((5, k), np.nan)
    for c in estimates.classes:
        p = c.proportion
        out[:, c.cls] = [p.value, np.nan if p.se is None else p.se,
                         np.nan if p.lo is None else p.lo, np.nan if p.hi is None else p.hi,
                         c.units_reference]  # fmt: skip
    return out


def batch_of(shares: object, b: int | tuple[int, int]) -> np.ndarray:
    rows = [shares.value[b], shares.se[b], shares.lo[b], shares.hi[b], shares.units_reference[b]]
    return np.where(shares.listed[b], np.array(rows, float), np.nan)


def cells_sample(rng: np.random.Generator, big_n: np.ndarray, k: int, draws: int) -> np.ndarray:
    """(draws, H * K * K) units per (stratum, map, reference) cell; at most N_h per stratum."""
    h = len(big_n)
    out = np.zeros((draws, h, k * k), np.int64)
    for s in np.flatnonzero(big_n):
        take = np.minimum(big_n[s], rng.integers(1, 25, draws))
        if big_n[s] == 2:  # 1 unit of 2 px in every other draw: no variance estimate there
            take = 1 + np.arange(draws) % 2
        for b in range(draws):
            out[b, s] = rng.multinomial(take[b], rng.dirichlet(np.full(k * k, 0.2)))
    return out.reshape(draws, -1)


@pytest.mark.parametrize("seed", range(4))
def test_stehman_shares_are_each_samples_stehman_estimates_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, k, draws = int(rng.integers(8, 40)), int(rng.choice([2, 7, 12])), 9
    big_n = rng.integers(1, 4000, h) * (rng.random(h) > 0.3)  # strata without pixels too
    big_n[:2] = 50, 2
    stratum, mapped, reference = (a.ravel() for a in np.indices((h, k, k)))
    samples = cells_sample(rng, big_n, k, draws)
    mapped_px = np.bincount(mapped, samples.sum(0), k).astype(np.int64) * 3
    mapped_px[mapped_px == 0] = 0  # a class no unit is mapped as and the map lacks: never listed
    got = stehman_shares(big_n, strata_counts(stratum, mapped, reference, h, k, samples),
                         mapped_px, 0.95)  # fmt: skip
    for b in range(draws):
        units = np.repeat(np.arange(samples.shape[1]), samples[b])
        want = stehman(big_n, stratum[units], mapped[units], reference[units], mapped_px,
                       confidence=0.95)  # fmt: skip
        assert np.array_equal(batch_of(got, b), shares_of(want, k), equal_nan=True), b


@pytest.mark.parametrize("seed", range(4))
def test_olofsson_shares_are_each_samples_olofsson_estimates_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, draws = int(rng.choice([7, 25, 61])), 9
    big_n = rng.integers(1, 4000, k) * (rng.random(k) > 0.4)
    big_n[:2] = 30, 2
    matrices = np.zeros((draws, k, k), np.int64)
    for s in np.flatnonzero(big_n):
        for b in range(draws):
            take = 1 + b % 2 if big_n[s] == 2 else min(big_n[s], int(rng.integers(1, 25)))
            matrices[b, s] = rng.multinomial(take, rng.dirichlet(np.full(k, 0.2)))
    got = olofsson_shares(big_n, matrices, 0.95)
    for b in range(draws):
        assert np.array_equal(batch_of(got, b), shares_of(olofsson(big_n, matrices[b], 0.95), k),
                              equal_nan=True), b  # fmt: skip


def test_the_shares_of_one_class_in_many_strata_are_its_estimates_bit_for_bit() -> None:
    """Every unit of one class (the map's only class at a level): the class's row alone is
    summed over the strata as the estimates sum it (one row of a stack is laid out apart)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        h, draws = int(rng.integers(8, 61)), 5
        big_n = rng.integers(100, 100_000, h) * (rng.random(h) > 0.3)
        big_n[0] = 77
        n_h = np.minimum(big_n, rng.integers(2, 40, (draws, h)))
        one, mapped_px = np.ones(h, np.int64), np.array([0, big_n.sum()])
        got = stehman_shares(big_n, strata_counts(np.arange(h), one, one, h, 2, n_h), mapped_px,
                             0.95)  # fmt: skip
        for b in range(draws):
            units = np.repeat(np.arange(h), n_h[b])
            want = stehman(big_n, units, one[units], one[units], mapped_px, confidence=0.95)
            assert np.array_equal(batch_of(got, b), shares_of(want, 2), equal_nan=True), b


def test_counts_of_cells_are_the_counts_of_their_units() -> None:
    rng = np.random.default_rng(3)
    h, k = 5, 4
    stratum, mapped, reference = (a.ravel() for a in np.indices((h, k, k)))
    samples = rng.integers(0, 4, (3, h * k * k))
    batched = strata_counts(stratum, mapped, reference, h, k, samples)
    matrices = unit_matrix(mapped, reference, k, samples)
    for b in range(3):
        units = np.repeat(np.arange(h * k * k), samples[b])
        one = strata_counts(stratum[units], mapped[units], reference[units], h, k)
        for name in ("hits", "right", "wrong", "omitted", "agree"):
            assert np.array_equal(getattr(batched, name)[b], getattr(one, name)), name
        by_hand = np.zeros((k, k), np.int64)
        np.add.at(by_hand, (mapped[units], reference[units]), 1)
        assert np.array_equal(matrices[b], by_hand)
        assert np.array_equal(one.hits.sum(0), np.bincount(stratum[units], minlength=h))


def test_a_stratum_whose_units_agree_adds_no_variance() -> None:
    # stratum 0: every unit mapped 0 is right; stratum 1: every unit mapped 0 is wrong. Each
    # stratum's d = y - R x is one value throughout: the user's accuracy has a variance of 0
    # (exactly: its squares are summed over pairs of units that differ, of which there is none)
    big_n, stratum, mapped = np.array([1000, 1000]), np.repeat([0, 1], 5), np.zeros(10, int)
    est = stehman(big_n, stratum, mapped, np.repeat([0, 1], 5), np.array([2000, 0]))
    assert est.classes[0].users.value == 0.5 and est.classes[0].users.se == 0.0
    assert est.classes[0].proportion.se == 0.0
    # 2 of stratum 1's 5 units of class 0: s2 = 5 (0.4 x 0.6) / 4, V = N_h^2 s2 / n_h / N^2
    est = stehman(big_n, stratum, mapped, np.array([0] * 7 + [1] * 3), np.array([2000, 0]))
    assert est.classes[0].proportion.se == pytest.approx(math.sqrt(1000**2 * 0.3 / 5) / 2000)


def test_the_sampler_keeps_its_random_stream() -> None:
    """A draw is each stratum's ``rng.choice`` ranks, stratum after stratum, placed in the
    stratum's cells by their pixels' cumulative counts (what earlier draws were)."""
    rng = np.random.default_rng(5)
    joint = rng.integers(0, 50, (6, 8)) * (rng.random((6, 8)) > 0.3)
    strata = rng.integers(0, 4, (6, 8))
    sampler = StratifiedSampler(joint, strata, 4, 60, 5)
    for seed in range(5):
        got = sampler.draw(np.random.default_rng(seed))
        stream, want = np.random.default_rng(seed), np.zeros(joint.size, np.int64)
        for h, count in enumerate(sampler.allocation):
            cells = np.flatnonzero((strata.ravel() == h) & (joint.ravel() > 0))
            if count:
                ranks = stream.choice(int(joint.ravel()[cells].sum()), int(count), replace=False)
                hit = np.searchsorted(np.cumsum(joint.ravel()[cells]), ranks, side="right")
                np.add.at(want, cells[hit], 1)
        assert np.array_equal(got.ravel(), want), seed


STRATA_KINDS = {  # (size, count) of each path of numpy's choice, and their edges
    "floyd, few of many": lambda r: (int(r.integers(2, 10**9)), int(r.integers(1, 60))),
    "floyd, most of few": lambda r: (s := int(r.integers(1, 30)), int(r.integers(1, s + 1))),
    "floyd, below the tail's size": lambda r: (s := int(r.integers(50, 10_001)),
                                               int(r.integers(1, s + 1))),
    "floyd, beyond 32 bits": lambda r: (2**33 + int(r.integers(0, 99)), int(r.integers(1, 9))),
    "tail of a shuffle": lambda r: (s := int(r.integers(10_001, 40_000)),
                                    int(r.integers(s // 50 + 1, s // 50 + 3000))),
    "tail, taken whole": lambda r: (s := int(r.integers(10_001, 12_000)), s),
}  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_the_strata_choices_are_numpys_choice_of_each_stratum_in_turn(seed: int) -> None:
    """Every path of ``Generator.choice(size, count, replace=False)`` (Floyd's algorithm, its
    repeats replayed; the tail of a partial shuffle; a stratum taken whole), strata after
    strata from one stream: the same ranks as numpy's own calls."""
    meta = np.random.default_rng(seed)
    kinds = list(STRATA_KINDS.values())
    strata, start = [], 0
    for _ in range(int(meta.integers(1, 12))):
        size, count = kinds[int(meta.integers(0, len(kinds)))](meta)
        strata.append((size, count, start))
        start += size
    choices = StrataChoices(strata)
    for d in range(3):
        stream = np.random.default_rng([seed, d])
        want = [stream.choice(size, count, replace=False) + at for size, count, at in strata]
        got = choices.ranks(np.random.default_rng([seed, d]))
        assert np.array_equal(got, np.sort(np.concatenate(want))), (d, strata)


@pytest.mark.parametrize("seed", range(10))
def test_strata_of_one_count_are_numpys_choice(seed: int) -> None:
    """Every stratum the same count (sorted row by row): small strata whose draws repeat
    (replayed), big ones, and one taken whole (apart)."""
    meta = np.random.default_rng(seed)
    count = int(meta.integers(1, 25))
    sizes = [count, *meta.integers(count, 60, 20), *meta.integers(10**4, 10**9, 20)]
    strata = [(int(s), count, int(a)) for s, a in zip(sizes, np.cumsum(sizes) - sizes, strict=True)]
    choices = StrataChoices(strata)
    for d in range(3):
        stream = np.random.default_rng([seed, d])
        want = [stream.choice(size, n, replace=False) + at for size, n, at in strata]
        got = choices.ranks(np.random.default_rng([seed, d]))
        assert np.array_equal(got, np.sort(np.concatenate(want))), d


def test_strata_choices_replay_floyd_where_a_rank_repeats() -> None:
    """A stratum of 3 of 4 pixels: Floyd's draws meet often (replayed), its ranks distinct."""
    choices = StrataChoices([(4, 3, 0), (10**6, 2, 4)])
    for d in range(50):
        stream = np.random.default_rng(d)
        want = [stream.choice(4, 3, replace=False), stream.choice(10**6, 2, replace=False) + 4]
        assert np.array_equal(choices.ranks(np.random.default_rng(d)),
                              np.sort(np.concatenate(want)))  # fmt: skip


def test_draw_all_refuses_no_draw() -> None:
    sampler = StratifiedSampler(np.array([[3, 4]]), np.array([[0, 0]]), 1, 2, 1)
    with pytest.raises(ValueError, match="draws: expected at least 1 draw, found 0"):
        draw_all(sampler, range(0), [0], np.array([0, 1]))


def test_stehman_shares_refuses_counts_of_another_shape() -> None:
    counts = strata_counts(np.array([0, 1]), np.array([0, 1]), np.array([1, 1]), 2, 2)
    with pytest.raises(ValueError, match=r"counts: expected \(B, K, H\) = \(B, 2, 2\)"):
        stehman_shares(np.array([5, 5]), counts, np.array([5, 5]))


def test_a_draw_counts_where_its_interval_and_its_wald_interval_exist() -> None:
    """Five draws of one class (truth 0.3): an interval that covers, one that misses, a census
    (lo = hi: exact), a withheld SE (no interval, no Wald), and a draw without the class."""
    nan = np.nan
    shares = AreaShares(
        value=np.array([[0.31], [0.5], [0.3], [0.2], [0.0]]),
        se=np.array([[0.02], [0.05], [0.0], [nan], [0.0]]),
        lo=np.array([[0.27], [0.45], [0.3], [nan], [nan]]),
        hi=np.array([[0.35], [0.56], [0.3], [nan], [nan]]),
        listed=np.array([[True], [True], [True], [True], [False]]),
        units_reference=np.array([[7], [9], [4], [1], [0]]),
    )
    coverage: dict[int, ClassCoverage] = {}
    tally_draws(coverage, shares, np.array([30]), 100, 1.96)
    got = coverage[0]
    counts = (got.covered, got.with_interval, got.exact, got.wald_covered, got.wald_with)
    assert counts == (1, 2, 1, 1, 2) and got.units_reference == 21
    assert got.half_width == pytest.approx(0.04 / 0.31 + 0.055 / 0.5)


def scene_population(
    seed: int = 11, districts: int = 2, among: np.ndarray | None = None, lost: bool = False
) -> TestSplitCounts:
    """25 L3 classes (of ``among``, default all) of uneven areas, mapped right 80% of the time,
    split into districts; ``lost``: a class the map never gives, so some draws hold none of
    it (in neither the map nor the sample: no estimate in that draw)."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(np.arange(N_L3) if among is None else among, 25, replace=False))
    truth = rng.multinomial(400_000, rng.dirichlet(np.full(25, 0.6)))
    joint = np.zeros((N_L3, N_L3), np.int64)
    for j, n in zip(ids, truth, strict=True):
        weights = np.where(ids == j, 0.8, 0.2 / 24)
        joint[ids, j] = rng.multinomial(n, weights)
    if lost:  # a twentieth of a stratum: some draws take none of it, some do
        joint[ids[0], np.setdiff1d(np.arange(N_L3), ids)[0]] = joint[ids[0]].sum() // 20
    domains = np.zeros((districts + 1, N_L3, N_L3), np.int64)
    for i, j in zip(*np.nonzero(joint), strict=True):
        domains[:, i, j] = rng.multinomial(joint[i, j], rng.dirichlet(np.ones(districts + 1)))
    names = tuple(f"d{d}" for d in range(districts + 1))
    return TestSplitCounts(joint, 0.01, ("scene",), domains, names)


def uneven_population() -> TestSplitCounts:
    """Districts of different classes: a stratum one domain holds and another lacks; a
    district without test pixels (no check) before the others."""
    base = scene_population(seed=5, districts=4, among=CROPS)
    domains = base.domains.copy()
    classes = np.flatnonzero(base.joint.sum(1))
    domains[1] = 0  # district 1: no test pixel
    domains[2, classes[::2]] = 0  # district 2: every other map class only
    domains[3, :, classes[1::3]] = 0  # district 3: some CDL classes never there
    names = base.domain_names
    return TestSplitCounts(domains.sum(0), 0.01, ("scene",), domains, names)


def tally_one(tally: ClassCoverage, est: ClassEstimate, truth: float, z: float) -> None:
    """One draw counted from its full estimate (the meaning of each of the tallies)."""
    tally.units_reference += est.units_reference
    bounds = est.proportion.bounds
    if bounds is not None and bounds[0] == bounds[1]:
        tally.exact += 1
    elif bounds is not None:
        tally.with_interval += 1
        tally.covered += bounds[0] <= truth <= bounds[1]
        value = est.proportion.value
        tally.half_width += (bounds[1] - bounds[0]) / 2 / value if value > 0 else 0.0
    wald = est.proportion.interval(z) if est.proportion.se else None
    if wald is not None:
        tally.wald_with += 1
        tally.wald_covered += wald[0] <= truth <= wald[1]


def one_by_one(samples: np.ndarray, level: int, design_level: int, strata_px: np.ndarray,
               domain: np.ndarray) -> list[AreaEstimates]:  # fmt: skip
    """Each draw's full estimates at ``level``, of a domain's (N_L3, N_L3) pixels."""
    strata = level_table(design_level, CMAP)[:N_L3].astype(np.int64)
    table = level_table(level, CMAP)[:N_L3].astype(np.int64)
    by = np.zeros((LEVEL_CLASSES[design_level], LEVEL_CLASSES[level]), np.int64)
    np.add.at(by, (strata, table), domain.sum(1))
    mapped_px = np.bincount(table, domain.sum(1), LEVEL_CLASSES[level]).astype(np.int64)
    out = []
    for sample in samples:
        m3, r3 = np.divmod(np.repeat(np.arange(N_L3 * N_L3), sample.ravel()), N_L3)
        out.append(estimate_at(level, design_level, strata_px, strata[m3], table[m3], table[r3],
                               mapped_px, by, 0.95))  # fmt: skip
    return out


CROPS = np.arange(50)  # the L3 ids of L1 class 1: alone, L1 has one class


@pytest.mark.parametrize(("design_level", "population"), [
    (2, scene_population()), (3, scene_population(lost=True)),
    (3, scene_population(among=CROPS)),
])  # fmt: skip
def test_the_checks_coverage_is_each_draw_estimated_in_full(
    design_level: int, population: TestSplitCounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(holdout_check, "SHARES_CHUNK", 5)  # 12 draws in 3 chunks, in order
    design = settings(n=300, min_per_class=10, level=design_level, seed=4, draws=12)
    found = check(population, CMAP, design)
    strata = level_table(design_level, CMAP)[:N_L3].astype(np.int64)
    sampler = StratifiedSampler(population.joint, np.broadcast_to(strata[:, None], (N_L3, N_L3)),
                                LEVEL_CLASSES[design_level], 300, 10)  # fmt: skip
    samples = [sampler.draw(np.random.default_rng([4, d])) for d in range(12)]
    for level_check in found:
        level = level_check.level
        draws = one_by_one(np.array(samples), level, design_level, sampler.sizes, population.joint)
        want: dict[int, ClassCoverage] = {}
        cdl_px = population.cdl_px(level, CMAP)
        for est in draws:
            listed = {c.cls: c for c in est.classes}
            for cls in np.flatnonzero(cdl_px):
                tally = want.setdefault(int(cls), ClassCoverage())
                if cls in listed:
                    tally_one(tally, listed[cls], cdl_px[cls] / population.pixels, design.z)
        assert level_check.coverage == want, level
        assert level_check.estimates == draws[0]
        assert sum(t.with_interval for t in want.values()) > 0


def assert_tallies_match(got: dict[int, ClassCoverage], want: dict[int, ClassCoverage]) -> None:
    """The same classes and counts; the half-widths' sums within 1e-12 relative (the check by
    district sums its figures in another order)."""
    assert list(got) == list(want)
    for cls, tally in got.items():
        assert replace(tally, half_width=0.0) == replace(want[cls], half_width=0.0), cls
        assert tally.half_width == pytest.approx(want[cls].half_width, rel=1e-12, abs=0), cls


@pytest.mark.parametrize(("draws_at_once", "uneven"), [(3, False), (40, False), (3, True)])
def test_the_district_totals_coverage_is_the_sum_of_each_draws_districts(
    draws_at_once: int, uneven: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    population = uneven_population() if uneven else scene_population(seed=12)
    held = int((population.domains.reshape(len(population.domains), -1).sum(1) > 0).sum())
    monkeypatch.setattr(district_check, "DOMAIN_SHARES", draws_at_once * held * N_L3)
    design = settings(n=300, min_per_class=5, level=3, seed=2, draws=8)  # 8 in 3 chunks or 1
    found = check_districts(population, CMAP, design, 300)
    sampler_check = found.allocation  # the units per domain and stratum the draws took
    k = LEVEL_CLASSES[3]
    domains = population.domains.reshape(len(population.domains), -1)
    strata = np.arange(len(domains))[:, None] * k + np.repeat(np.arange(N_L3), N_L3)[None, :]
    sampler = StratifiedSampler(domains, strata, len(domains) * k, 300, 5, sampler_check.ravel())
    samples = [sampler.draw(np.random.default_rng([2, STREAM, d])) for d in range(8)]
    sizes = sampler.sizes.reshape(len(domains), k)
    for total in found.total:
        level = total.level
        held = [d for d in range(len(domains)) if domains[d].sum()]
        per_domain = {d: one_by_one(np.array([s[d] for s in samples]), level, 3, sizes[d],
                                    population.domains[d]) for d in held}  # fmt: skip
        want: dict[int, ClassCoverage] = {}
        cdl_px = population.cdl_px(level, CMAP)
        for b in range(8):
            est = with_interval(sum_estimates([per_domain[d][b] for d in held]), design.z)
            listed = {c.cls: c for c in est.classes}
            for cls in np.flatnonzero(cdl_px):
                tally = want.setdefault(int(cls), ClassCoverage())
                if cls in listed:
                    tally_one(tally, listed[cls], cdl_px[cls] / population.pixels, design.z)
        assert_tallies_match(total.coverage, want)
        for d, domain in enumerate(found.domains):
            if d not in held:  # no test pixel: no check
                assert domain.levels == () and domain.pixels == 0
                continue
            assert domain.levels[level - 1].estimates == per_domain[d][0]
            mine: dict[int, ClassCoverage] = {}
            px = population.domains[d]
            cdl = np.bincount(level_table(level, CMAP)[:N_L3], px.sum(0), LEVEL_CLASSES[level])
            for est in per_domain[d]:
                listed = {c.cls: c for c in est.classes}
                for cls in np.flatnonzero(cdl):
                    tally = mine.setdefault(int(cls), ClassCoverage())
                    if cls in listed:
                        tally_one(tally, listed[cls], cdl[cls] / px.sum(), design.z)
            assert_tallies_match(domain.levels[level - 1].coverage, mine)


def test_total_shares_are_the_summed_estimates_with_their_interval() -> None:
    """Thousands of random domain estimates: the sum's value, standard error and interval are
    with_interval(sum_estimates(...))'s within 1e-12 relative, what it lists and its units
    the same."""
    rng = np.random.default_rng(8)
    draws, k, z, px = 400, 6, 1.959963984540054, np.array([1000, 37_000, 250])
    shape = (len(px), draws, k)
    value = rng.random(shape) * rng.choice([0.0, 1e-3, 1.0], shape)
    se = np.where(rng.random(shape) < 0.05, np.nan, rng.random(shape) * 0.1)
    se[rng.random(shape) < 0.05] = 0.0
    listed = rng.random(shape) < 0.9
    units = rng.integers(0, 50, shape)
    nowhere = np.full(shape, np.nan)  # the domains' own intervals: not summed
    got = total_shares(AreaShares(value, se, nowhere, nowhere, listed, units), px, 38_250, z)
    for b in range(draws):
        parts = [
            AreaEstimates(int(n), tuple(
                ClassEstimate(int(c), 1, 1, int(units[d, b, c]),
                              Estimate(float(value[d, b, c]),
                                       None if np.isnan(se[d, b, c]) else float(se[d, b, c]),
                                       "no se" if np.isnan(se[d, b, c]) else ""), None, None)
                for c in np.flatnonzero(listed[d, b])), Estimate(0.5, 0.1))
            for d, n in enumerate(px)
        ]  # fmt: skip
        want = shares_of(with_interval(sum_estimates(parts), z), k)
        mine = batch_of(got, (0, b))
        assert np.array_equal(np.isnan(mine), np.isnan(want)), b
        assert np.allclose(mine, want, rtol=1e-12, atol=0, equal_nan=True), b
