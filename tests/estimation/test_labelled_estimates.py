"""A user's labelled sample estimated on a run's maps (emb.estimation.labelled_estimates) and
through the stage: designed on this map, or on another (Stehman), at the design's level and
coarser, unlabelled rows counted."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rasterio
from conftest import REPO
from rasterio.transform import from_origin
from test_holdout_check import settings_arg

from emb.classes import IGNORE, load_class_map
from emb.estimation import area_estimates
from emb.estimation.design import draw_points
from emb.estimation.estimators import olofsson
from emb.estimation.labelled_estimates import coarser, designed_on, estimate_sample
from emb.estimation.sample_files import read_labelled, write_sample

CLASSES = REPO / "config" / "classes.csv"
CMAP = load_class_map(CLASSES)
TRUTH_CLASSES = np.array([1, 2, 5, 23])  # L3 ids of several L2 groups


def write_map(path: Path, data: np.ndarray) -> Path:
    profile = {"driver": "GTiff", "height": data.shape[0], "width": data.shape[1], "count": 1,
               "dtype": "uint8", "crs": "EPSG:32615", "nodata": IGNORE,
               "transform": from_origin(400_000, 4_600_000, 10, 10)}  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data, 1)
    return path


def scene(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(truth, map): fields of 10 x 10 px, a fifth of them mapped as another class."""
    rng = np.random.default_rng(seed)
    truth = TRUTH_CLASSES[np.kron(rng.integers(0, 4, (12, 12)), np.ones((10, 10), int))]
    wrong = np.kron(rng.random((12, 12)) < 0.2, np.ones((10, 10), bool))
    mapped = np.where(wrong, TRUTH_CLASSES[rng.integers(0, 4, truth.shape)], truth)
    mapped[:3, :] = IGNORE  # nodata
    return truth.astype(np.uint8), mapped.astype(np.uint8)


def labelled_sample(tmp_path: Path, truth: np.ndarray, mapped: np.ndarray, level: int,
                    unlabel: int = 0) -> tuple[Path, Path]:  # fmt: skip
    """A design over ``mapped`` (region r1), its reference column filled from ``truth`` as
    CDL-free L3 class names, the first ``unlabel`` rows left empty."""
    maps = tmp_path / "maps"
    maps.mkdir(exist_ok=True)
    write_map(maps / "r1.tif", mapped)
    design = draw_points([maps / "r1.tif"], level, CMAP, n=120, min_per_class=10, seed=1)
    paths = write_sample(design, tmp_path / "sample")
    with rasterio.open(maps / "r1.tif") as src:
        inverse = ~src.transform
    rows = list(csv.DictReader(paths.csv.open()))
    names = {1: CMAP.l1_names, 2: CMAP.l2_names, 3: CMAP.l3_names}[level]
    table = {1: CMAP.l3_to_l1, 2: CMAP.l3_to_l2, 3: np.arange(256)}[level]
    for i, row in enumerate(rows):
        col, r = inverse * (float(row["x"]), float(row["y"]))
        row["reference"] = "" if i < unlabel else names[table[truth[int(r), int(col)]]]
    with paths.csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return paths.csv, paths.record


def test_on_its_own_map_the_design_level_is_olofssons_and_coarser_levels_follow(
    tmp_path: Path,
) -> None:
    truth, mapped = scene(0)
    sample_csv, record = labelled_sample(tmp_path, truth, mapped, level=3)
    sample = read_labelled(sample_csv, record, CMAP)
    found = estimate_sample(sample, {"r1": tmp_path / "maps" / "r1.tif"}, CMAP)
    assert [f.level for f in found] == [3, 2, 1] and all(f.same_maps for f in found)
    matrix = np.zeros((61, 61), np.int64)
    np.add.at(matrix, (sample.stratum, sample.reference), 1)
    want = olofsson(sample.record.strata_px, matrix)
    assert [c.proportion for c in found[0].estimates.classes] == [
        c.proportion for c in want.classes
    ]
    # L2 from the same units: proportions of an L2 group are the sums of its L3 classes'
    l3 = {c.cls: c.proportion.value for c in found[0].estimates.classes}
    l2 = {c.cls: c.proportion.value for c in found[1].estimates.classes}
    for group, value in l2.items():
        members = [v for cls, v in l3.items() if CMAP.l3_to_l2[cls] == group]
        assert value == pytest.approx(sum(members))


def test_on_another_map_the_strata_stay_the_designs_and_the_estimate_is_stehmans(
    tmp_path: Path,
) -> None:
    truth, mapped = scene(0)
    _, other = scene(5)
    other[:3, :] = IGNORE
    other_map = write_map(tmp_path / "other.tif", np.where(mapped == IGNORE, IGNORE, other))
    sample_csv, record = labelled_sample(tmp_path, truth, mapped, level=2)
    sample = read_labelled(sample_csv, record, CMAP)
    found = estimate_sample(sample, {"r1": other_map}, CMAP)
    assert [f.level for f in found] == [2, 1] and not any(f.same_maps for f in found)
    # area proportions do not depend on the assessed map: equal to those on the design's map
    own = estimate_sample(sample, {"r1": tmp_path / "maps" / "r1.tif"}, CMAP)
    for theirs, ours in zip(found, own, strict=True):
        a = {c.cls: c.proportion.value for c in theirs.estimates.classes}
        b = {c.cls: c.proportion.value for c in ours.estimates.classes}
        assert {k: v for k, v in a.items() if v} == pytest.approx({k: v for k, v in b.items() if v})
    # the mapped areas are the other map's
    mapped_px = {c.cls: c.mapped_px for c in found[0].estimates.classes}
    counts = np.bincount(CMAP.l3_to_l2[other[other != IGNORE]], minlength=7)
    assert all(mapped_px.get(k, 0) == v for k, v in enumerate(counts) if v)


def test_the_design_map_only_when_every_regions_map_is_the_designs(tmp_path: Path) -> None:
    """A design over r1 and r2 assessed on the design's r1 and another r2 (one pixel changed):
    not its maps, so Stehman's estimator, not Olofsson's on a map it was not drawn on."""
    maps = tmp_path / "maps"
    maps.mkdir()
    r1, r2 = write_map(maps / "r1.tif", scene(0)[1]), write_map(maps / "r2.tif", scene(1)[1])
    design = draw_points([r1, r2], 2, CMAP, n=80, min_per_class=5, seed=2)
    paths = write_sample(design, tmp_path / "sample")
    rows = list(csv.DictReader(paths.csv.open()))
    with paths.csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows([{**r, "reference": r["map_name"]} for r in rows])
    sample = read_labelled(paths.csv, paths.record, CMAP)
    changed = scene(1)[1]
    changed[50, 50] = 1 if changed[50, 50] != 1 else 2
    other_r2 = write_map(tmp_path / "r2_other.tif", changed)
    assert designed_on(sample, {"r1": r1, "r2": r2})
    assert not designed_on(sample, {"r1": r1, "r2": other_r2})
    assert not designed_on(sample, {"r1": r1})
    found = estimate_sample(sample, {"r1": r1, "r2": other_r2}, CMAP)
    assert not any(f.same_maps for f in found)


def test_coarser_ids_follow_the_class_table() -> None:
    l3 = np.arange(61)
    assert np.array_equal(coarser(l3, 3, 2, CMAP), CMAP.l3_to_l2[:61])
    assert np.array_equal(coarser(CMAP.l3_to_l2[:61], 2, 1, CMAP), CMAP.l3_to_l1[:61])
    with pytest.raises(ValueError, match="finer"):
        coarser(l3, 2, 3, CMAP)


def stage_on_sample(
    tmp_path: Path, truth: np.ndarray, sample_csv: Path, draws: int, *extra: str
) -> Path:
    """Run the area_estimates stage on run "a"'s maps (``tmp_path/maps``) with a test split of
    one tile labelled by ``truth`` and the labelled sample; its CSV."""
    labels = write_map(tmp_path / "labels.tif", truth)
    index = tmp_path / "r1" / "index.json"
    index.parent.mkdir()
    index.write_text('{"tile_size": 40, "splits": {"test": {"blocks": {"r1_40_40": "b"}}}}')
    out = tmp_path / "run.csv"
    area_estimates.main(["--run", "a", "--maps", str(tmp_path / "maps"), "--indexes", str(index),
                         "--labels", str(labels), "--classes", str(CLASSES),
                         settings_arg(n=50, min_per_class=5, draws=draws),
                         "--labelled", str(sample_csv), "--csv", str(out),
                         "--png", str(tmp_path / "run.png"), *extra])  # fmt: skip
    return out


def test_the_stage_adds_the_user_sample_rows_and_counts_the_unlabelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth, mapped = scene(0)
    sample_csv, record = labelled_sample(tmp_path, truth, mapped, level=2, unlabel=3)
    frame = pd.read_csv(stage_on_sample(tmp_path, truth, sample_csv, 5))
    users = frame[frame["method"] == "user sample"]
    assert set(users["level"]) == {1, 2}
    assert users["note"].str.contains("3 of 120 units unlabelled").all()
    assert users["note"].str.contains("designed on this run's map").all()
    assert users["cdl_ha"].isna().all() and users["estimated_ha"].notna().all()
