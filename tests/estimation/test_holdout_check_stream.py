"""The test split's check at the scale of a state (issue 58, item 5; issue 59, item 7): the
population streamed into its joint histogram (each test pixel once, memory flat), draws of any
stratum's size, and draws that follow the seed."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rasterio.windows import Window
from test_holdout_check import (
    CMAP,
    IGNORE,
    clustered_population,
    region_files,
    settings,
    write_index,
    write_raster,
)  # fmt: skip

from emb.estimation import holdout_counts
from emb.estimation.holdout_check import check
from emb.estimation.holdout_counts import AreaCheckError, TestSplitCounts, bands, read_population


def test_the_bands_cover_the_union_of_the_tiles_each_pixel_once() -> None:
    rng = np.random.default_rng(4)
    height, width = 70, 90
    windows = [Window(int(c), int(r), int(s), int(s)) for r, c, s in
               zip(rng.integers(-20, 70, 40), rng.integers(-20, 90, 40), rng.integers(1, 30, 40),
                   strict=True)]  # fmt: skip
    windows += [Window(c, r, 32, 32) for r in range(0, 64, 24) for c in range(0, 80, 24)]
    union = np.zeros((height, width), bool)
    for w in windows:
        union[max(w.row_off, 0) : w.row_off + w.height, max(w.col_off, 0) : w.col_off + w.width] = 1
    times = np.zeros((height, width), int)
    for row0, row1, spans in bands(windows, height, width):
        for col0, col1 in spans:
            times[row0:row1, col0:col1] += 1
    assert np.array_equal(times, union.astype(int))


def test_a_value_neither_an_l3_id_nor_nodata_is_refused_naming_the_file(tmp_path: Path) -> None:
    mapped, labels, paths = region_files(tmp_path)
    mapped[20, 20] = 70
    odd = write_raster(tmp_path / "odd.tif", mapped)
    with pytest.raises(AreaCheckError, match=r"odd.tif.*: map values \[70\] are neither L3"):
        read_population({"r1": odd}, {"r1": paths["labels"]}, {"r1": paths["index"]})


def test_the_population_is_read_without_arrays_of_its_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 Mpx of test tiles: per-pixel vectors (and a mask of the raster) would take 16 MB or
    more; streamed in strips of 1 MB, numpy's allocations stay near 5 MB (a strip of each
    raster, a chunk's bincount), whatever the pixels."""
    monkeypatch.setattr(holdout_counts, "STRIP_BYTES", 1 << 20)
    side = 2048
    data = np.random.default_rng(0).integers(0, 61, (side, side), dtype=np.uint8)
    maps = write_raster(tmp_path / "big.tif", data)
    labels = write_raster(tmp_path / "big_labels.tif", data[::-1].copy())
    tiles = [(r, c) for r in range(0, side, 256) for c in range(0, side, 256)]
    index = write_index(tmp_path / "big" / "index.json", "big", tiles, size=256)
    tracemalloc.start()
    try:
        pop = read_population({"big": maps}, {"big": labels}, {"big": index})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pop.pixels == side * side
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_a_stratum_of_billions_of_pixels_is_drawn() -> None:
    """A state's stratum may exceed 10**9 pixels, numpy's multivariate hypergeometric's bound."""
    joint = np.zeros((61, 61), np.int64)
    joint[1, 1], joint[1, 2], joint[2, 2], joint[2, 1] = 3_000_000_000, 2_000_000, 10**8, 10**6
    pop = TestSplitCounts(joint, 0.01, ("state",))
    l3 = check(pop, CMAP, settings(n=200, min_per_class=20, level=3, seed=0, draws=3))[-1]
    assert l3.draws == 3 and sum(c.units_mapped for c in l3.estimates.classes) == 200
    assert l3.coverage[1].with_interval + l3.coverage[1].exact == 3


def test_the_draws_follow_the_seed() -> None:
    """The same seed, the same draws; another seed, other draws; and each draw its own
    generator (draw d from [seed, d]), so two draws are not one sample twice."""
    pop = clustered_population()
    design = settings(n=150, min_per_class=10, level=3, seed=5, draws=6)
    one, same = check(pop, CMAP, design), check(pop, CMAP, design)
    assert [c.estimates for c in one] == [c.estimates for c in same]
    assert [c.coverage for c in one] == [c.coverage for c in same]
    other = check(pop, CMAP, replace(design, seed=6))
    assert [c.estimates for c in one] != [c.estimates for c in other]
    single = check(pop, CMAP, replace(design, draws=1))[-1].coverage
    units = {cls: t.units_reference for cls, t in one[-1].coverage.items()}
    assert units != {cls: 6 * t.units_reference for cls, t in single.items()}


def test_from_pixels_leaves_out_nodata_on_either_side() -> None:
    mapped = np.array([0, 1, IGNORE, 2, 2], np.uint8)
    reference = np.array([0, IGNORE, 3, 2, 1], np.uint8)
    pop = TestSplitCounts.from_pixels(mapped, reference, 0.01, ("x",))
    assert pop.pixels == 3 and pop.joint[0, 0] == pop.joint[2, 2] == pop.joint[2, 1] == 1
