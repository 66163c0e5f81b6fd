"""One sample, every district (issue 58): a design stratified by (district, class) writes each
point's district in its CSV and GeoPackage, read back and checked; each district is estimated
within its own strata and the total is their sum (variance too: strata independent); a sample
stratified without districts gives districts as domains (Stehman 2014), checked against the
textbook domain estimator written out here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyogrio.raw
import pytest
import rasterio
import shapely
from test_labelled_estimates import CLASSES, CMAP, scene, write_map

from emb.estimation import sample_design
from emb.estimation.districts import read_districts
from emb.estimation.estimators import olofsson
from emb.estimation.labelled_estimates import estimate_by_district
from emb.estimation.sample_files import ReferenceSampleError, SamplePaths, read_labelled

EDGE_X, EAST_END = 400_500.0, 401_000.0  # west | east | outside (the map's last 20 columns)


def districts_file(folder: Path) -> Path:
    path = folder / "districts.geojson"
    boxes = [shapely.box(399_000, 4_598_000, EDGE_X, 4_601_000),
             shapely.box(EDGE_X, 4_598_000, EAST_END, 4_601_000)]  # fmt: skip
    pyogrio.raw.write(str(path), shapely.to_wkb(boxes), [np.array(["west", "east"], object)],
                      ["county"], driver="GeoJSON", crs="EPSG:32615",
                      geometry_type="Polygon")  # fmt: skip
    return path


def district_of(x: np.ndarray) -> np.ndarray:
    return np.where(x < EDGE_X, 1, np.where(x < EAST_END, 2, 0))


def designed(
    tmp_path: Path, truth: np.ndarray, mapped: np.ndarray, by_district: bool
) -> SamplePaths:
    """A level-2 design of 150 units over ``mapped`` drawn by the stage (with the districts or
    without), every row labelled from ``truth``."""
    maps = tmp_path / "maps"
    maps.mkdir(exist_ok=True)
    write_map(maps / "r1.tif", mapped)
    settings = {"sample": {"level": 2, "n": 150, "min_per_class": 4, "seed": 3}}
    if by_district:  # the districts travel in the settings, as the rule passes them
        settings["districts"] = {"file": str(districts_file(tmp_path)), "name": "county"}
    sample_design.main(["--maps", str(maps / "r1.tif"), "--classes", str(CLASSES),
                        "--settings", json.dumps(settings),
                        "--out-dir", str(tmp_path / "sample")])  # fmt: skip
    paths = SamplePaths.in_folder(tmp_path / "sample")
    with rasterio.open(maps / "r1.tif") as src:
        inverse = ~src.transform
    rows = list(csv.DictReader(paths.csv.open()))
    for row in rows:
        col, r = inverse * (float(row["x"]), float(row["y"]))
        row["reference"] = CMAP.l2_names[CMAP.l3_to_l2[truth[int(r), int(col)]]]
    write_rows(paths.csv, rows)
    return paths


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_each_points_district_is_written_and_checked_on_reading(tmp_path: Path) -> None:
    truth, mapped = scene(0)
    paths = designed(tmp_path, truth, mapped, by_district=True)
    rows = list(csv.DictReader(paths.csv.open()))
    assert list(rows[0])[:3] == ["id", "region", "district"]
    x = np.array([float(r["x"]) for r in rows])
    names = np.array(["outside", "west", "east"])
    assert [r["district"] for r in rows] == names[district_of(x)].tolist()
    meta, _, _, fields = pyogrio.raw.read(paths.gpkg, layer="sample")
    assert list(meta["fields"])[:3] == ["id", "region", "district"]
    assert fields[2].tolist() == [r["district"] for r in rows]
    sample = read_labelled(paths.csv, paths.record, CMAP)
    assert sample.district.tolist() == district_of(x).tolist()
    assert sample.map_class.tolist() == [int(r["map_class"]) for r in rows]
    bad = [dict(r) for r in rows]
    bad[4]["district"] = "north"
    with pytest.raises(ReferenceSampleError, match=r"line 6: id 5: district 'north' is none"):
        read_labelled(write_rows(tmp_path / "bad.csv", bad), paths.record, CMAP)
    moved = [dict(r) for r in rows]  # a west point said to be east: its stratum overflows
    west = next(i for i, r in enumerate(moved) if r["district"] == "west")
    moved[west]["district"] = "east"
    with pytest.raises(ReferenceSampleError, match=r"of district 'east' has .* rows, the design"):
        read_labelled(write_rows(tmp_path / "moved.csv", moved), paths.record, CMAP)
    no_column = [{k: v for k, v in r.items() if k != "district"} for r in rows]
    with pytest.raises(ReferenceSampleError, match=r"missing columns \['district'\]"):
        read_labelled(write_rows(tmp_path / "old.csv", no_column), paths.record, CMAP)


def area_and_var(estimates: object, cls: int) -> tuple[float, float]:
    """(area in px, its variance) of class ``cls`` in one AreaEstimates."""
    for c in estimates.classes:
        if c.cls == cls:
            return c.proportion.value * estimates.total_px, (
                c.proportion.se * estimates.total_px
            ) ** 2
    return 0.0, 0.0


def test_a_district_design_estimates_each_district_in_its_strata_and_they_add_up(
    tmp_path: Path,
) -> None:
    truth, mapped = scene(0)
    paths = designed(tmp_path, truth, mapped, by_district=True)
    sample = read_labelled(paths.csv, paths.record, CMAP)
    found = estimate_by_district(sample, {"r1": tmp_path / "maps" / "r1.tif"}, CMAP, 0.95)
    assert found.stratified and found.names == ("outside", "west", "east")
    assert sorted(found.districts) == [0, 1, 2] and not found.skipped
    k = len(CMAP.l2_names)
    for d, levels in found.districts.items():  # Olofsson on the district's error matrix
        units = sample.district == d
        matrix = np.zeros((k, k), np.int64)
        np.add.at(matrix, (sample.map_class[units], sample.reference[units]), 1)
        want = olofsson(sample.record.strata_px[d * k : (d + 1) * k], matrix, 0.95)
        assert levels[0].level == 2 and levels[0].estimates == want
    for level in (0, 1):  # L2, then L1: the total is the sum, variances too
        total = found.total[level].estimates
        for c in total.classes:
            parts = [area_and_var(levels[level].estimates, c.cls)
                     for levels in found.districts.values()]  # fmt: skip
            area, var = area_and_var(total, c.cls)
            assert area == pytest.approx(sum(a for a, _ in parts), rel=1e-12)
            assert var == pytest.approx(sum(v for _, v in parts), rel=1e-9)


def test_domain_estimation_from_a_sample_stratified_without_districts(tmp_path: Path) -> None:
    """Against an independent computation: Y_dk = sum_h N_h / n_h sum_(i in s_h) y_i with
    y_i = [reference_i = k and i in d], V = sum_h N_h^2 s2_h / n_h (s2 over all n_h units of
    the stratum, those outside d with y = 0; no finite-population correction but in a census
    stratum); the overall accuracy the ratio of [map = reference, in d] to [in d]."""
    truth, mapped = scene(0)
    paths = designed(tmp_path, truth, mapped, by_district=False)
    sample = read_labelled(paths.csv, paths.record, CMAP)
    assert sample.record.districts is None
    districts = read_districts(districts_file(tmp_path), "county")
    found = estimate_by_district(sample, {"r1": tmp_path / "maps" / "r1.tif"}, CMAP, 0.95,
                                 districts)  # fmt: skip
    assert not found.stratified and "Stehman 2014" in found.note and "wider" in found.note
    big_n = sample.record.strata_px.astype(float)
    n_h = np.bincount(sample.stratum, minlength=len(big_n))
    inside_of = district_of(sample.points.x)
    with rasterio.open(tmp_path / "maps" / "r1.tif") as src:
        x = src.transform * (np.arange(src.width) + 0.5, np.zeros(src.width))
        per_column = district_of(np.asarray(x[0]))
    valid = mapped != 255

    def textbook(y: np.ndarray) -> tuple[float, float]:
        total, var = 0.0, 0.0
        for h in np.flatnonzero(n_h):
            yh = y[sample.stratum == h]
            total += big_n[h] * yh.mean()
            if n_h[h] > 1 and n_h[h] < big_n[h]:
                var += big_n[h] ** 2 * yh.var(ddof=1) / n_h[h]
        return total, var

    checked = 0
    for d in (0, 1, 2):
        inside = inside_of == d
        est = found.districts[d][0].estimates
        assert est.total_px == int((valid & (per_column[None, :] == d)).sum())
        for c in est.classes:
            want, var = textbook(((sample.reference == c.cls) & inside).astype(float))
            assert c.proportion.value * est.total_px == pytest.approx(want, rel=1e-12)
            assert c.proportion.se * est.total_px == pytest.approx(var**0.5, rel=1e-9)
            checked += 1
        agree = ((sample.map_class == sample.reference) & inside).astype(float)
        y_total, _ = textbook(agree)
        x_total, _ = textbook(inside.astype(float))
        ratio = y_total / x_total
        _, var_d = textbook(agree - ratio * inside)
        assert est.overall.value == pytest.approx(ratio, rel=1e-12)
        assert est.overall.se == pytest.approx((var_d / x_total**2) ** 0.5, rel=1e-9)
    assert checked > 6
    # the districts' areas add up to the design's own total
    total = found.total[0].estimates
    for c in total.classes:
        parts = [area_and_var(found.districts[d][0].estimates, c.cls)[0] for d in (0, 1, 2)]
        assert area_and_var(total, c.cls)[0] == pytest.approx(sum(parts), rel=1e-12)
