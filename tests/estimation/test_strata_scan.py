"""The sample design's compiled loops against numpy computed apart: a strip's counts per (local
district, map value) key equal a bincount of the keys; walking strips in scan order takes, of
each stratum, the pixels at its drawn ranks (the r-th of its pixels in scan order: numpy's
flatnonzero), whatever strips cut the scan, never on nodata, a rank on the last pixel
included; a strip whose pixels differ from the first pass's counts is refused naming its
file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_design import write_map
from test_streams import ORIGIN, wavy_districts

from emb.classes import ClassMap
from emb.estimation import design as design_module
from emb.estimation import population
from emb.estimation.design import SampleDesignError, draw_points
from emb.estimation.districts import read_districts
from emb.estimation.strata_scan import ALL_FOUND, NO_STRATUM, count_keys, pick_ranked

NODATA = 255


def random_strip(
    rng: np.random.Generator, n: int, n_local: int, wide: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(values, local): n map values (0..60 and a fifth nodata) and local districts."""
    values = rng.integers(0, 61, n).astype(np.uint8)
    values[rng.random(n) < 0.2] = NODATA
    local = rng.integers(0, n_local, n).astype(np.uint16 if wide else np.uint8)
    return values, local


def strata_table(rng: np.random.Generator, n_local: int, n_strata: int) -> np.ndarray:
    """((n_local) * 256,) int64: each key's stratum at random, nodata none."""
    table = rng.integers(0, n_strata, n_local * 256).astype(np.int64)
    table[np.arange(n_local) * 256 + NODATA] = NO_STRATUM
    return table


@pytest.mark.parametrize(("n_local", "wide"), [(1, False), (3, False), (300, True)])
def test_key_counts_equal_a_bincount_of_the_keys(n_local: int, wide: bool) -> None:
    rng = np.random.default_rng(n_local)
    values, local = random_strip(rng, 50_000, n_local, wide)
    counts = np.zeros(n_local * 256, np.int64)
    count_keys(values, local, counts)
    count_keys(values, local, counts)  # added on, not overwritten
    keys = local.astype(np.int64) * 256 + values
    assert counts.tolist() == (2 * np.bincount(keys, minlength=n_local * 256)).tolist()


def test_key_counts_without_a_local_plane_count_the_values() -> None:
    values, _ = random_strip(np.random.default_rng(4), 10_000, 1)
    counts = np.zeros(256, np.int64)
    count_keys(values, None, counts)
    assert counts.tolist() == np.bincount(values, minlength=256).tolist()


@pytest.mark.parametrize("n", [0, 1, 5, 4003])
def test_key_counts_of_runs_and_a_tail_past_the_lanes(n: int) -> None:
    """Runs of one key (a map's fields), a strip whose length is no multiple of the
    histograms' LANES (its last pixels counted apart), with and without a local plane."""
    rng = np.random.default_rng(n)
    values = np.repeat(rng.integers(0, 61, n).astype(np.uint8), rng.integers(1, 40, n))[:n]
    local = np.repeat(rng.integers(0, 3, n).astype(np.uint8), rng.integers(1, 90, n))[:n]
    for plane, width in ((None, 256), (local, 3 * 256)):
        counts = np.zeros(width, np.int64)
        count_keys(values, plane, counts)
        keys = values.astype(np.int64) + (0 if plane is None else plane.astype(np.int64) * 256)
        assert counts.tolist() == np.bincount(keys, minlength=width).tolist()


def walk(
    strips: list[tuple[np.ndarray, np.ndarray | None, np.ndarray]], ranks: list[np.ndarray]
) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """(scan position, stratum) of every pixel :func:`pick_ranked` takes over ``strips``
    (values, local, strata_of) walked in turn, with each stratum's pixels seen and drawn
    ranks taken."""
    sizes = np.array([len(r) for r in ranks], np.int64)
    ends = np.cumsum(sizes)
    taken = ends - sizes
    flat = np.concatenate([np.asarray(r, np.int64) for r in ranks] + [[ALL_FOUND]])
    next_rank = np.where(sizes > 0, flat[taken], ALL_FOUND)
    seen = np.zeros(len(ranks), np.int64)
    found_at, found_in = np.zeros(flat.size, np.int64), np.zeros(flat.size, np.int64)
    picked, offset = [], 0
    for values, local, strata_of in strips:
        m = pick_ranked(values, local, strata_of, seen, next_rank, taken, ends, flat, found_at,
                        found_in)  # fmt: skip
        picked += [(offset + int(p), int(h)) for p, h in zip(found_at[:m], found_in[:m],
                                                              strict=True)]  # fmt: skip
        offset += values.size
    return picked, seen, taken - (ends - sizes)


def kth_of_each(strata: np.ndarray, ranks: list[np.ndarray]) -> list[tuple[int, int]]:
    """(position, stratum) of the r-th pixel (scan order) of stratum h for every drawn r."""
    out = [(int(p), h) for h, r in enumerate(ranks) for p in np.flatnonzero(strata == h)[r]]
    return sorted(out)


def random_ranks(rng: np.random.Generator, strata: np.ndarray, n_strata: int) -> list[np.ndarray]:
    """Up to 7 drawn ranks per stratum, sorted (all its pixels where it has fewer)."""
    sizes = np.bincount(strata[strata >= 0], minlength=n_strata)
    return [np.sort(rng.choice(int(s), min(int(s), 7), replace=False)) for s in sizes]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("n_local", "wide"), [(1, False), (4, False), (260, True)])
def test_the_drawn_ranks_are_the_kth_pixels_of_their_strata(
    seed: int, n_local: int, wide: bool
) -> None:
    """Strips of random lengths, each its own strata table (as districts near it give)."""
    rng = np.random.default_rng(seed)
    n_strata = 23
    cuts = np.sort(rng.choice(np.arange(1, 40_000), 5, replace=False))
    strips, keyed = [], []
    for part in np.split(np.arange(40_000), cuts):
        values, local = random_strip(rng, part.size, n_local, wide)
        table = strata_table(rng, n_local, n_strata)
        strips.append((values, local, table))
        keyed.append(table[local.astype(np.int64) * 256 + values])
    strata = np.concatenate(keyed)
    ranks = random_ranks(rng, strata, n_strata)
    picked, seen, taken = walk(strips, ranks)
    assert picked == kth_of_each(strata, ranks)  # in scan order, as the design records them
    assert seen.tolist() == np.bincount(strata[strata >= 0], minlength=n_strata).tolist()
    assert taken.tolist() == [len(r) for r in ranks]


def test_a_strip_without_a_local_plane_keys_its_values_alone() -> None:
    rng = np.random.default_rng(5)
    values, _ = random_strip(rng, 20_000, 1)
    table = strata_table(rng, 1, 9)
    ranks = random_ranks(rng, table[values], 9)
    assert walk([(values, None, table)], ranks)[0] == kth_of_each(table[values], ranks)


def test_every_rank_of_a_stratum_in_one_strip_and_one_on_the_last_pixel() -> None:
    """Stratum 0 only in the middle strip (all its ranks found there), stratum 1 everywhere
    with its last pixel drawn (the last pixel of the last strip), nodata never taken."""
    values = [np.full(100, 1, np.uint8), np.full(100, 1, np.uint8), np.full(100, 1, np.uint8)]
    values[1][10:20] = 0
    values[1][50:60] = NODATA
    table = np.full(256, NO_STRATUM, np.int64)
    table[0], table[1] = 0, 1
    ranks = [np.arange(10), np.array([0, 150, 279])]
    picked, seen, _ = walk([(v, None, table) for v in values], ranks)
    assert picked == [(0, 1)] + [(100 + p, 0) for p in range(10, 20)] + [(170, 1), (299, 1)]
    assert seen.tolist() == [10, 280]


def test_a_rank_past_a_stratum_is_never_found() -> None:
    """A stratum with fewer pixels than its drawn rank (the map changed): nothing taken, so the
    design's check that every rank was taken refuses it."""
    values = np.zeros(50, np.uint8)
    table = np.full(256, NO_STRATUM, np.int64)
    table[0] = 0
    picked, seen, taken = walk([(values, None, table)], [np.array([3, 60])])
    assert picked == [(3, 0)]
    assert (seen.tolist(), taken.tolist()) == ([50], [1])


def test_a_strata_table_past_the_counts_is_refused() -> None:
    """A stratum id beyond ``seen`` would write past it: refused before the walk."""
    table = np.full(256, 5, np.int64)
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="past the end of seen"):
        pick_ranked(np.zeros(4, np.uint8), None, table, np.zeros(5, np.int64),
                    one.copy(), one.copy(), one.copy(), one.copy(), one.copy(),
                    one.copy())  # fmt: skip


def test_a_strip_changed_since_the_first_pass_is_refused_naming_its_file(
    tmp_path: Path, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With districts: the first pass's counts of the map's second strip moved by one pixel
    from one stratum to another, as a map rewritten between the passes would show."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 61, (128, 160)).astype(np.uint8)
    path = write_map(tmp_path / "r.tif", ids, origin=ORIGIN)
    districts = read_districts(wavy_districts(tmp_path / "d.geojson", 3, 2000.0, 1), "name")
    monkeypatch.setattr(population, "STRIP_BYTES", 32 * 160)  # strips of 32 rows
    counted = design_module._FirstPassCounts.result

    def moved(self: design_module._FirstPassCounts, path: Path) -> tuple:
        per_strip, l3 = counted(self, path)
        held = np.flatnonzero(per_strip[1])
        per_strip[1, held[0]] -= 1
        per_strip[1, held[1]] += 1
        return per_strip, l3

    monkeypatch.setattr(design_module._FirstPassCounts, "result", moved)
    with pytest.raises(SampleDesignError, match=r"r.tif changed while the sample was drawn: "
                       r"pixels per stratum of rows 32\.\.63"):  # fmt: skip
        draw_points([path], 3, class_map, n=8000, min_per_class=1, seed=1, districts=districts)


def test_the_second_pass_takes_the_districts_the_first_burned(
    tmp_path: Path, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 strips of 8 rows across 3 districts and the outside: the second pass burns none again
    (the first pass's kept as runs), and draws the same points as when it burns those of
    several districts again (none kept as runs: a run limit no strip meets)."""
    rng = np.random.default_rng(6)
    path = write_map(tmp_path / "r.tif", rng.integers(0, 61, (64, 640)).astype(np.uint8),
                     origin=ORIGIN)  # fmt: skip
    districts = read_districts(wavy_districts(tmp_path / "d.geojson", 3, 2000.0, 1), "name")
    monkeypatch.setattr(population, "STRIP_BYTES", 8 * 640)
    burn, burned = design_module.district_burn, []

    def counted(*args: object) -> tuple[np.ndarray, np.ndarray]:
        burned.append(1)
        return burn(*args)

    def drawn() -> list[tuple]:
        design = draw_points([path], 3, class_map, n=6000, min_per_class=1, seed=2,
                             districts=districts)  # fmt: skip
        return list(zip(design.points.x.tolist(), design.points.y.tolist(),
                        design.district.tolist(), strict=True))  # fmt: skip

    monkeypatch.setattr(design_module, "district_burn", counted)
    kept = drawn()
    assert len(burned) == 8  # the first pass's
    burned.clear()
    monkeypatch.setattr(design_module, "KEPT_RUN_PIXELS", 10**9)
    assert drawn() == kept
    assert len(burned) > 8  # strips of several districts burned again
