"""The test split's area check (emb.estimation.holdout_check) and the stage around it
(emb.estimation.area_estimates): which pixels it samples, how often its intervals cover the
CDL's area on clustered errors, and the table and figure it writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rasterio
from conftest import REPO
from rasterio.transform import from_origin
from rasterio.windows import Window

from emb.classes import IGNORE, load_class_map
from emb.estimation import area_estimates
from emb.estimation.estimates_table import COLUMNS
from emb.estimation.holdout_check import StratifiedSampler, check
from emb.estimation.holdout_counts import AreaCheckError, TestSplitCounts, read_population
from emb.estimation.settings import AreaSettings, from_json
from emb.io import JSONFileError
from emb.prep.region_index import RegionIndexError, windows_of_test_tiles

CLASSES = REPO / "config" / "classes.csv"
CMAP = load_class_map(CLASSES)
SIZE = 96
TRANSFORM = from_origin(500_000, 4_000_000, 10, 10)


def settings(confidence: float = 0.95, **sample_and_draws: int) -> AreaSettings:
    """Area settings as the stages get them: the schema's defaults, these keys changed."""
    draws = sample_and_draws.pop("draws", None)
    section = {"confidence": confidence, "sample": sample_and_draws}
    return from_json(json.dumps({**section, **({"draws": draws} if draws else {})}))


def settings_arg(**keys: float) -> str:
    """A stage's --settings with these keys (n, min_per_class, level, seed in ``sample``)."""
    sample = {k: keys.pop(k) for k in ("n", "min_per_class", "level", "seed") if k in keys}
    return "--settings=" + json.dumps({**keys, **({"sample": sample} if sample else {})})


def write_raster(path: Path, data: np.ndarray, crs: str = "EPSG:32614") -> Path:
    profile = {"driver": "GTiff", "height": data.shape[0], "width": data.shape[1], "count": 1,
               "dtype": "uint8", "crs": crs, "transform": TRANSFORM, "nodata": IGNORE}  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data, 1)
    return path


def write_index(path: Path, region: str, tiles: list[tuple[int, int]], size: int = 32) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = {f"{region}_{r}_{c}": f"{region}:0,0" for r, c in tiles}
    index = {
        "region": region,
        "tile_size": size,
        "splits": {"train": {"blocks": {f"{region}_0_64": "x"}}, "test": {"blocks": blocks}},
    }
    path.write_text(json.dumps(index))  # fmt: skip
    return path


def test_the_windows_come_from_the_test_tiles_keys(tmp_path: Path) -> None:
    index = json.loads(write_index(tmp_path / "a" / "index.json", "demo_a_2", [(0, 32), (-16, 80)])
                       .read_text())  # fmt: skip
    assert windows_of_test_tiles(index, "x") == [Window(32, 0, 32, 32), Window(80, -16, 32, 32)]
    index["splits"]["test"]["blocks"] = {"demo_a_zz": "b"}
    with pytest.raises(RegionIndexError, match=r"x: splits.test.blocks: .* found 'demo_a_zz'"):
        windows_of_test_tiles(index, "x")
    with pytest.raises(RegionIndexError, match=r"y: expected a shard index with tile_size"):
        windows_of_test_tiles({"splits": {}}, "y")


def region_files(tmp_path: Path, region: str = "r1") -> tuple[np.ndarray, np.ndarray, dict]:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, (SIZE, SIZE)).astype(np.uint8)
    labels[:5] = IGNORE  # unlabelled rows: no reference there
    mapped = labels.copy()
    mapped[40:60, 40:60] = 2  # a patch mapped wrong
    mapped[90:, :] = IGNORE  # nodata at the bottom
    paths = {
        "map": write_raster(tmp_path / f"{region}.tif", mapped),
        "labels": write_raster(tmp_path / f"{region}_labels.tif", labels),
        # overlapping tiles (each pixel once), one past the raster's edge (clipped)
        "index": write_index(tmp_path / region / "index.json", region,
                             [(0, 0), (16, 16), (80, 80)]),
    }  # fmt: skip
    return mapped, labels, paths


def test_the_population_is_each_test_pixel_once_where_map_and_cdl_both_have_a_class(
    tmp_path: Path,
) -> None:
    mapped, labels, paths = region_files(tmp_path)
    pop = read_population({"r1": paths["map"]}, {"r1": paths["labels"]}, {"r1": paths["index"]})
    inside = np.zeros((SIZE, SIZE), bool)
    inside[0:32, 0:32] = inside[16:48, 16:48] = inside[80:, 80:] = True
    keep = inside & (mapped != IGNORE) & (labels != IGNORE)
    assert pop.pixels == keep.sum()
    want = np.zeros((61, 61), np.int64)
    np.add.at(want, (mapped[keep], labels[keep]), 1)
    assert np.array_equal(pop.joint, want)
    assert pop.pixel_ha == pytest.approx(0.01)


def test_a_map_off_its_labels_grid_or_in_degrees_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    mapped, labels, paths = region_files(tmp_path)
    short = write_raster(tmp_path / "short.tif", mapped[:50])
    with pytest.raises(AreaCheckError, match=r"short.tif: expected the grid of its labels"):
        read_population({"r1": short}, {"r1": paths["labels"]}, {"r1": paths["index"]})
    geo = write_raster(tmp_path / "geo.tif", mapped, crs="EPSG:4326")
    geo_labels = write_raster(tmp_path / "geo_labels.tif", labels, crs="EPSG:4326")
    with pytest.raises(ValueError, match=r"geo.tif.*(geographic|degree)"):
        read_population({"r1": geo}, {"r1": geo_labels}, {"r1": paths["index"]})
    cut = tmp_path / "cut" / "index.json"
    cut.parent.mkdir()
    cut.write_text(paths["index"].read_text()[:40])
    with pytest.raises(JSONFileError, match=r"cut/index.json: not a JSON region index"):
        read_population({"r1": paths["map"]}, {"r1": paths["labels"]}, {"r1": cut})


def clustered_population(seed: int = 0) -> TestSplitCounts:
    """A 400 x 400 scene of L3 classes in fields, mapped with whole fields wrong (errors
    clustered in space, as real maps err): the truth of every class is known."""
    rng = np.random.default_rng(seed)
    classes = np.array([1, 2, 5, 23, 40])  # L3 ids of several L2 groups
    fields = rng.choice(len(classes), size=(20, 20), p=[0.35, 0.3, 0.2, 0.1, 0.05])
    reference = classes[np.kron(fields, np.ones((20, 20), int))]
    wrong = np.kron(rng.random((20, 20)) < 0.2, np.ones((20, 20), bool))  # 20% of fields
    mapped = np.where(wrong, classes[np.kron(rng.integers(0, 5, (20, 20)), np.ones((20, 20), int))],
                      reference)  # fmt: skip
    return TestSplitCounts.from_pixels(mapped.astype(np.uint8), reference.astype(np.uint8), 0.01,
                                       ("synthetic",))  # fmt: skip


def test_the_intervals_cover_the_cdl_area_about_95_percent_of_the_draws() -> None:
    pop = clustered_population()
    checks = check(pop, CMAP, settings(n=400, min_per_class=20, level=3, seed=0, draws=200))
    by_level = {c.level: c for c in checks}
    assert sorted(by_level) == [1, 2, 3]
    l3 = by_level[3]
    assert np.array_equal(l3.cdl_px, pop.joint.sum(0))
    assert np.array_equal(l3.mapped_px, pop.joint.sum(1))
    rates = {cls: t.covered / l3.draws for cls, t in l3.coverage.items()
             if t.with_interval == l3.draws}  # fmt: skip
    assert set(rates) == {1, 2, 5, 23, 40}
    assert all(0.9 <= r <= 1.0 for r in rates.values()), rates
    assert 0.93 <= np.mean(list(rates.values())) <= 0.99, rates
    wald = {cls: t.wald_covered / l3.draws for cls, t in l3.coverage.items()}
    assert all(wald[cls] <= rates[cls] + 0.03 for cls in rates), (wald, rates)
    # the pixel count is biased where the map errs; the estimate is not (over the draws)
    l2 = by_level[2]
    assert any(c.users is not None for c in l2.estimates.classes)


def test_a_draw_samples_each_stratum_as_allocated_without_replacement() -> None:
    # cells of 4 strata (rows); stratum 3 has 3 pixels in 3 cells: taken whole, each once
    joint = np.array([[300, 150, 50], [100, 100, 100], [10, 0, 20], [1, 1, 1]])
    strata = np.repeat(np.arange(4), 3).reshape(4, 3)
    sampler = StratifiedSampler(joint, strata, 61, 100, 10)
    units = sampler.draw(np.random.default_rng(0))
    assert units.shape == joint.shape and units.sum() == sampler.allocation.sum() == 100
    assert np.array_equal(units.sum(1), sampler.allocation[:4])
    assert (units <= joint).all() and units[2, 1] == 0
    for seed in range(20):  # a stratum smaller than the minimum, whole: each pixel once
        assert np.array_equal(sampler.draw(np.random.default_rng(seed))[3], [1, 1, 1])
    again = sampler.draw(np.random.default_rng(0))
    assert np.array_equal(units, again)


def test_a_draw_falls_in_each_cell_as_often_as_a_random_pixel_would() -> None:
    """Over many draws, a cell's mean units are allocation x its share of its stratum (the
    ranks' boundaries put each rank in its own cell, none in a neighbour's)."""
    joint = np.array([[2, 3, 5], [40, 0, 60]])
    strata = np.array([[0, 0, 0], [1, 1, 1]])
    sampler = StratifiedSampler(joint, strata, 2, 10, 5)
    assert sampler.allocation.tolist() == [5, 5]
    mean = np.mean([sampler.draw(np.random.default_rng([9, d])) for d in range(4000)], axis=0)
    assert np.allclose(mean, [[1.0, 1.5, 2.5], [2.0, 0.0, 3.0]], atol=0.06), mean


def test_the_stage_writes_every_level_beside_the_cdl_and_the_map(tmp_path: Path) -> None:
    _, _, paths = region_files(tmp_path)
    maps = tmp_path / "maps"
    maps.mkdir()
    (maps / "r1.tif").write_bytes(paths["map"].read_bytes())
    csv, png = tmp_path / "out" / "run.csv", tmp_path / "out" / "run.png"
    csv.parent.mkdir()
    area_estimates.main(["--run", "run", "--maps", str(maps), "--indexes", str(paths["index"]),
                         "--labels", str(paths["labels"]), "--classes", str(CLASSES),
                         settings_arg(n=200, min_per_class=5, draws=20),
                         "--csv", str(csv), "--png", str(png)])  # fmt: skip
    frame = pd.read_csv(csv)
    assert list(frame.columns) == COLUMNS
    assert set(frame["level"]) == {1, 2, 3}
    assert png.stat().st_size > 1000
    for level, part in frame.groupby("level"):
        # the CDL's and the map's areas of one population: equal totals, in hectares
        assert part["cdl_ha"].sum() == pytest.approx(part["mapped_ha"].sum())
        # each row's hectares are rounded to 0.01: their sum may be off by 0.005 a row
        assert part["estimated_ha"].sum() == pytest.approx(part["cdl_ha"].sum(),
                                                           abs=0.005 * len(part))  # fmt: skip
        assert part["coverage"].between(0, 1).all(), level


def test_the_stage_refuses_bad_input_in_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, paths = region_files(tmp_path)
    csv = tmp_path / "run.csv"
    with pytest.raises(SystemExit) as exit_:
        area_estimates.main(["--run", "run", "--maps", str(tmp_path / "none"),
                             "--indexes", str(paths["index"]), "--labels", str(paths["labels"]),
                             "--classes", str(CLASSES), "--csv", str(csv),
                             "--png", str(tmp_path / "run.png")])  # fmt: skip
    assert exit_.value.code == 66
    err = capsys.readouterr().err.strip().splitlines()
    assert "none/r1.tif" in err[-1] and "Traceback" not in "\n".join(err)
    assert not csv.exists()
    with pytest.raises(SystemExit) as exit_:
        area_estimates.main(["--run", "run", "--maps", str(tmp_path), "--indexes",
                             str(paths["index"]), "--labels", str(paths["labels"]),
                             "--classes", str(CLASSES), settings_arg(min_per_class=1),
                             "--csv", str(csv), "--png", str(tmp_path / "run.png")])  # fmt: skip
    assert exit_.value.code == 2
    assert "area_estimates.sample.min_per_class: 1 is less than" in capsys.readouterr().err
