"""The test split's check by district (issue 58): the total over the domains is the sum of
theirs (its variance too), every district's interval covers its truth at the level the
interval method holds, and the stage writes the district rows and the GIS layer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyogrio
import pytest
from area_population import K, scene
from test_estimation_stages import stage_args
from test_holdout_check import CMAP, settings, settings_arg

from emb import forks
from emb.classes import N_L3
from emb.estimation import area_estimates, district_check
from emb.estimation.district_check import allocation, check_districts
from emb.estimation.district_layer import LAYER
from emb.estimation.estimates_table import ALL, CHECK, DISTRICT_CHECK
from emb.estimation.estimators import olofsson
from emb.estimation.holdout_check import StratifiedSampler
from emb.estimation.holdout_counts import TestSplitCounts

NAMES = ("outside", "north", "middle", "south")
DRAWS = 1000
COVERAGE = 0.935  # what the interval method holds at 95% over 1,000 draws (its tests)


def domains_of_scene() -> np.ndarray:
    """(4, K, K) pixels per (domain, map, truth) of the synthetic scene: districts of 9%, 22.5%
    and 58.5% of it (row bands west of column 900), the outside its east tenth."""
    mapped, reference = scene()
    ids = np.zeros(mapped.shape, np.int64)
    ids[:100, :900], ids[100:350, :900], ids[350:, :900] = 1, 2, 3
    keys = (ids * K + mapped) * K + reference
    return np.bincount(keys.ravel(), minlength=4 * K * K).reshape(4, K, K)


def population_of(domains: np.ndarray) -> TestSplitCounts:
    """The domains as the check's count table (the scene's classes as L3 ids 0..5)."""
    full = np.zeros((len(domains), N_L3, N_L3), np.int64)
    full[:, :K, :K] = domains
    return TestSplitCounts(full.sum(0), 0.01, ("scene",), full, NAMES)


def test_the_total_is_the_sum_of_the_districts_its_variance_the_sum_of_theirs() -> None:
    population = population_of(domains_of_scene())
    found = check_districts(population, CMAP, settings(n=400, min_per_class=5, draws=2), 400)
    assert [d.name for d in found.domains] == list(NAMES)
    assert found.domains[0].pixels == 100_000  # the outside: counted, checked, never dropped
    for total in found.total:
        parts = [d.levels[total.level - 1] for d in found.domains]
        assert (total.cdl_px == sum(p.cdl_px for p in parts)).all()
        for c in total.estimates.classes:
            shares = [{e.cls: e for e in p.estimates.classes}.get(c.cls) for p in parts]
            px = [
                (p.estimates.total_px, e.proportion)
                for p, e in zip(parts, shares, strict=True)
                if e
            ]
            assert c.proportion.value * 1e6 == pytest.approx(sum(n * e.value for n, e in px))
            if c.proportion.se is not None:
                var = sum((n * e.se) ** 2 for n, e in px)
                assert (c.proportion.se * 1e6) ** 2 == pytest.approx(var)
    design = found.total[2].estimates.classes  # L3: the design's level, every class known
    assert sum(c.units_reference for c in design) == found.allocation.sum()


def test_n_below_the_minimums_is_raised_to_them_and_said() -> None:
    sizes = np.array([[5, 100, 0], [50, 50, 50]])
    units, n, note = allocation(sizes, 10, 20)
    assert n == 5 + 20 + 20 * 3 and units.sum() == n and (units[0] == [5, 20, 0]).all()
    assert "85 units drawn, not n = 10" in note
    units, n, note = allocation(sizes, 400, 20)
    assert n == 400 and not note and (units >= np.minimum(sizes, 20)).all()


def test_every_districts_interval_covers_its_truth_at_the_level_it_holds() -> None:
    """Districts of different sizes over the synthetic scene (known truth per district), drawn
    as the check draws them (strata district x class, one allocation by area), estimated
    within each district: every class of every domain covered in >= 93.5% of 1,000 draws."""
    domains = domains_of_scene()
    units, _, _ = allocation(domains.sum(2), 1000, 20)
    rng = np.random.default_rng(58)
    for d, joint in enumerate(domains):
        draws = np.zeros((DRAWS, K, K), np.int64)
        for h in range(K):
            draws[:, h] = rng.multivariate_hypergeometric(joint[h], int(units[d, h]), size=DRAWS)
        truth = joint.sum(0) / joint.sum()
        covered = np.zeros(K)
        for matrix in draws:
            for c in olofsson(joint.sum(1), matrix, 0.95).classes:
                covered[c.cls] += c.proportion.lo <= truth[c.cls] <= c.proportion.hi
        share = (covered / DRAWS)[truth > 0]  # an area of 0 has no interval to cover it
        assert (share >= COVERAGE).all(), f"{NAMES[d]}: coverage per class {share.round(3)}"


def write_districts(path: Path) -> Path:
    """Two districts on the stage's test region (EPSG:32614, x 500000.., y ..4000000, 10 m):
    north-west and south-west quarters; the east half lies in none (the outside)."""
    boxes = {"nw": (500_000, 3_999_520, 500_480, 4_000_000),
             "sw": (500_000, 3_999_040, 500_480, 3_999_520)}  # fmt: skip
    features = [{"type": "Feature", "properties": {"county": name},
                 "geometry": {"type": "Polygon", "coordinates": [[
                     [x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}}
                for name, (x0, y0, x1, y1) in boxes.items()]  # fmt: skip
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features,
                                "crs": {"type": "name", "properties": {
                                    "name": "urn:ogc:def:crs:EPSG::32614"}}}))  # fmt: skip
    return path


def test_the_stage_writes_the_district_rows_and_the_layer(tmp_path: Path) -> None:
    districts = write_districts(tmp_path / "counties.geojson")
    gpkg = tmp_path / "run_districts.gpkg"
    arg = settings_arg(n=200, min_per_class=5, draws=3)
    arg = arg[:-1] + f', "districts": {{"file": "{districts}", "name": "county"}}}}'
    area_estimates.main([*stage_args(tmp_path, arg), "--gpkg", str(gpkg)])
    frame = pd.read_csv(tmp_path / "run.csv", keep_default_na=False, na_values=[""])
    assert frame.loc[frame["method"] == CHECK, "district"].isna().all()  # the whole, as before
    by = frame[frame["method"] == DISTRICT_CHECK]
    assert list(dict.fromkeys(by["district"])) == ["nw", "sw", "outside", ALL]
    assert by["coverage"].notna().any() and (by["draws"].dropna() == 3).all()
    none = by[by["district"] == "sw"]  # no test tile reaches the south-west: said, not dropped
    assert len(none) == 1 and none["note"].iloc[0].startswith("no test pixel in this district")
    for level in (1, 2, 3):
        part = by[by["level"] == level]
        total = part[part["district"] == ALL].set_index("class")["estimated_ha"]
        summed = part[part["district"] != ALL].groupby("class")["estimated_ha"].sum()
        assert np.allclose(total.sort_index(), summed.reindex(total.index).sort_index(), atol=0.02)
        cdl = part[part["district"] == ALL].set_index("class")["cdl_ha"]
        whole = frame[(frame["method"] == CHECK) & (frame["level"] == level)]
        assert np.allclose(cdl.sort_index(), whole.set_index("class")["cdl_ha"].sort_index())
    layer = pyogrio.read_arrow(gpkg, layer=LAYER)[1].drop_columns(["geom"]).to_pandas()
    assert list(layer["district"]) == ["nw", "sw"]  # one feature per district
    assert layer.filter(like="_est").iloc[1].isna().all()  # sw: NULL, not 0
    l2 = by[(by["level"] == 2) & (by["district"] == "nw")].nlargest(1, "estimated_ha").iloc[0]
    short = [c for c in layer.columns if c.endswith("_est")][0]  # the largest class first
    assert layer[short].iloc[0] == pytest.approx(l2["estimated_ha"])


def test_the_stage_writes_no_district_rows_without_districts(tmp_path: Path) -> None:
    area_estimates.main(stage_args(tmp_path, settings_arg(n=200, min_per_class=5, draws=2)))
    frame = pd.read_csv(tmp_path / "run.csv")
    assert (frame["method"] != DISTRICT_CHECK).all() and frame["district"].isna().all()


def test_a_layer_without_districts_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        area_estimates.main([*stage_args(tmp_path), "--gpkg", str(tmp_path / "x.gpkg")])
    assert "--gpkg: expected districts in --settings" in capsys.readouterr().err


def test_the_sampler_draws_each_stratum_from_its_own_cells_in_any_order() -> None:
    """District x class strata at L2 are not in the cells' order: each stratum's units come
    from its own cells (grouped by one sort), as many as allocated."""
    joint = np.array([[5, 0, 7], [9, 4, 6]])
    strata = np.array([[2, 0, 1], [0, 2, 1]])
    sampler = StratifiedSampler(joint, strata, 3, 9, 1, np.array([3, 4, 2]))
    for d in range(20):
        drawn = sampler.draw(np.random.default_rng(d))
        per = np.bincount(strata.ravel(), weights=drawn.ravel(), minlength=3)
        assert (per == [3, 4, 2]).all() and (drawn <= joint).all() and drawn[0, 1] == 0


def test_the_stage_gives_its_threads_to_the_check_by_district(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--threads 2 (two cores): the check by district's draws run in forked workers, and the
    stage writes the rows it writes with one."""
    monkeypatch.setattr(forks, "cores", lambda most: min(most, 2))
    pids = tmp_path / "pids.txt"
    runs = district_check.draw_runs

    def noted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - draw_runs, its process noted
        with pids.open("a") as out:
            out.write(f"{os.getpid()}\n")
        return runs(*args, **kwargs)

    monkeypatch.setattr(district_check, "draw_runs", noted)
    districts = write_districts(tmp_path / "counties.geojson")
    arg = settings_arg(n=200, min_per_class=5, draws=4)
    arg = arg[:-1] + f', "districts": {{"file": "{districts}", "name": "county"}}}}'
    written = {}
    for threads in (1, 2):
        area_estimates.main([*stage_args(tmp_path, arg), f"--threads={threads}"])
        written[threads] = (tmp_path / "run.csv").read_text()
        if threads == 1:
            assert set(pids.read_text().split()) == {str(os.getpid())}
            pids.unlink()
    assert written[2] == written[1]
    assert str(os.getpid()) not in set(pids.read_text().split())
