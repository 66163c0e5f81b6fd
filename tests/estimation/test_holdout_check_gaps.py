"""H6's proposed tests for emb.estimation.holdout_check: behaviours no test caught when broken."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin
from test_holdout_check import (
    CMAP,
    IGNORE,
    SIZE,
    region_files,
    settings,
    write_index,
    write_raster,
)  # fmt: skip

from emb.estimation.design import allocate
from emb.estimation.holdout_check import check
from emb.estimation.holdout_counts import AreaCheckError, TestSplitCounts, read_population


def test_a_pixel_the_cdl_leaves_unlabelled_is_left_out_where_the_map_has_a_class(
    tmp_path: Path,
) -> None:
    mapped, labels, paths = region_files(tmp_path)
    mapped[:5] = 1  # the map has a class where the CDL is 255: no reference there
    full = write_raster(tmp_path / "full.tif", mapped)
    pop = read_population({"r1": full}, {"r1": paths["labels"]}, {"r1": paths["index"]})
    inside = np.zeros((SIZE, SIZE), bool)
    inside[0:48, 0:48] = inside[80:, 80:] = True
    inside[0:16, 32:48] = inside[32:48, 0:16] = False  # the two tiles' L-shaped union
    assert pop.pixels == (inside & (mapped != IGNORE) & (labels != IGNORE)).sum()
    assert pop.joint[1].sum() < (inside & (mapped == 1)).sum()  # 1 over 255: left out


def test_a_tile_before_the_first_row_and_column_is_clipped_to_the_raster(tmp_path: Path) -> None:
    mapped, labels, paths = region_files(tmp_path)
    index = write_index(tmp_path / "neg" / "index.json", "r1", [(-16, -16)])
    pop = read_population({"r1": paths["map"]}, {"r1": paths["labels"]}, {"r1": index})
    m, r = mapped[:16, :16], labels[:16, :16]
    keep = (m != IGNORE) & (r != IGNORE)
    assert pop.pixels == keep.sum()
    assert np.array_equal(pop.joint.sum(0), np.bincount(r[keep], minlength=61))


def test_a_map_shifted_off_its_labels_grid_is_refused(tmp_path: Path) -> None:
    mapped, _, paths = region_files(tmp_path)
    shifted = tmp_path / "shifted.tif"
    profile = {"driver": "GTiff", "height": SIZE, "width": SIZE, "count": 1, "dtype": "uint8",
               "crs": "EPSG:32614", "nodata": IGNORE,
               "transform": from_origin(500_010, 4_000_000, 10, 10)}  # fmt: skip
    with rasterio.open(shifted, "w", **profile) as dst:
        dst.write(mapped, 1)
    with pytest.raises(AreaCheckError, match=r"shifted.tif: expected the grid of its labels"):
        read_population({"r1": shifted}, {"r1": paths["labels"]}, {"r1": paths["index"]})


def test_regions_of_unequal_pixel_areas_no_region_or_no_pixel_are_refused(tmp_path: Path) -> None:
    mapped, labels, paths = region_files(tmp_path)
    coarse = tmp_path / "coarse"
    coarse.mkdir()
    tr = from_origin(500_000, 4_000_000, 20, 20)
    for name, data in (("r2.tif", mapped), ("r2_labels.tif", labels)):
        with rasterio.open(
            coarse / name,
            "w",
            driver="GTiff",
            height=SIZE,
            width=SIZE,
            count=1,
            dtype="uint8",
            crs="EPSG:32614",
            transform=tr,
            nodata=IGNORE,
        ) as dst:
            dst.write(data, 1)  # fmt: skip
    index2 = write_index(tmp_path / "r2" / "index.json", "r2", [(32, 32)])
    with pytest.raises(AreaCheckError, match=r"expected one pixel area over the run's maps"):
        read_population({"r1": paths["map"], "r2": coarse / "r2.tif"},
                        {"r1": paths["labels"], "r2": coarse / "r2_labels.tif"},
                        {"r1": paths["index"], "r2": index2})  # fmt: skip
    with pytest.raises(AreaCheckError, match=r"no region to check"):
        read_population({}, {}, {})
    blank = write_raster(tmp_path / "blank.tif", np.full((SIZE, SIZE), IGNORE, np.uint8))
    with pytest.raises(AreaCheckError, match=r"hold no pixel that both the map and the"):
        read_population({"r1": blank}, {"r1": paths["labels"]}, {"r1": paths["index"]})


def rare_error_population() -> TestSplitCounts:
    """Class 1 mapped over 200 px, all right; class 0 over 2000 px, one of them truly class 1:
    a sample of 20 units of class 0 almost never meets it, so class 1's estimate is W_1 with a
    Wald standard error of 0 (no Wald interval) while the interval that holds reaches above."""
    mapped = np.r_[np.zeros(2000, np.uint8), np.ones(200, np.uint8)]
    reference = mapped.copy()
    reference[7] = 1
    return TestSplitCounts.from_pixels(mapped, reference, 0.01, ("rare",))


def test_an_interval_covers_only_when_the_truth_lies_between_both_ends() -> None:
    pop = rare_error_population()
    l3 = check(pop, CMAP, settings(n=40, min_per_class=20, level=3, seed=0, draws=50))[-1]
    assert l3.level == 3
    for cls in (0, 1):  # Wald: no interval (SE 0) in every draw that misses the one pixel
        tally = l3.coverage[cls]
        assert tally.wald_with <= 5 and tally.wald_covered <= tally.wald_with
        assert tally.with_interval == 50 and tally.covered >= 45, tally  # pseudo-counts hold


def test_the_table_shows_the_first_draw_whatever_the_number_of_draws() -> None:
    from test_holdout_check import clustered_population

    pop = clustered_population()
    design = settings(n=150, min_per_class=10, level=3, seed=3, draws=1)
    one = check(pop, CMAP, design)
    many = check(pop, CMAP, replace(design, draws=4))
    assert [c.estimates for c in one] == [c.estimates for c in many]


def test_a_class_the_map_omits_entirely_is_tallied_from_the_cdl() -> None:
    mapped = np.r_[np.zeros(1000, np.uint8), np.ones(500, np.uint8)]
    reference = mapped.copy()
    reference[:300] = 5  # class 5: in the CDL, never in the map
    pop = TestSplitCounts.from_pixels(mapped, reference, 0.01, ("omit",))
    l3 = check(pop, CMAP, settings(n=200, min_per_class=20, level=3, seed=0, draws=20))[-1]
    assert 5 in l3.coverage and l3.coverage[5].units_reference > 0


def test_the_strata_are_the_maps_classes_at_the_design_level() -> None:
    from test_holdout_check import clustered_population

    pop = clustered_population()
    design = settings(n=300, min_per_class=20, level=2, seed=0, draws=2)
    l2 = next(c for c in check(pop, CMAP, design) if c.level == 2)
    sizes = np.bincount(CMAP.l3_to_l2[:61], weights=pop.joint.sum(1), minlength=7).astype(int)
    want = allocate(sizes, 300, 20)
    got = np.zeros(7, np.int64)
    for c in l2.estimates.classes:
        got[c.cls] = c.units_mapped
    assert np.array_equal(got, want)
