"""H6's proposed tests for emb.report.estimates_section: the area tables read back (refused in one
line when cut or not one), and the page's rows at its level."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from emb import plots
from emb.estimation.district_layer import write_district_layer
from emb.estimation.districts import read_districts
from emb.estimation.estimates_table import ALL, CHECK, COLUMNS, DISTRICT_CHECK, USER_SAMPLE
from emb.estimation.settings import from_json
from emb.report.estimates_section import (
    AreaTableError,
    area_section,
    district_rows,
    page_rows,
    read_area_table,
)


def frame() -> pd.DataFrame:
    base = dict.fromkeys(COLUMNS)
    rows = [
        {**base, "run": "a", "method": CHECK, "level": 2, "class_id": 0, "class": "row_crops",
         "mapped_ha": 120.0, "estimated_ha": 100.0, "lo_ha": 90.0, "hi_ha": 110.0,
         "cdl_ha": 104.0, "coverage": 0.955, "wald_coverage": 0.9, "draws": 200,
         "units_reference": 300, "note": ""},
        {**base, "run": "a", "method": CHECK, "level": 2, "class_id": 5, "class": "natural",
         "mapped_ha": 10.0, "estimated_ha": 12.0, "lo_ha": None, "hi_ha": None,
         "cdl_ha": 11.0, "coverage": 0.5, "draws": 200, "units_reference": 1, "note": "why"},
        {**base, "run": "a", "method": CHECK, "level": 3, "class_id": 1, "class": "soybeans",
         "mapped_ha": 50.0, "estimated_ha": 60.0, "lo_ha": 50.0, "hi_ha": 70.0,
         "cdl_ha": 55.0, "coverage": 0.9, "draws": 200, "units_reference": 50, "note": ""},
        {**base, "run": "a", "method": USER_SAMPLE, "level": 2, "class_id": 0,
         "class": "row_crops", "mapped_ha": 120.0, "estimated_ha": 99.0, "lo_ha": 80.0,
         "hi_ha": 118.0, "units_reference": 40, "note": "user"},
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def test_an_area_table_cut_or_without_its_columns_is_refused_naming_it(tmp_path: Path) -> None:
    good = tmp_path / "a.csv"
    frame().to_csv(good, index=False)
    assert len(read_area_table(good)) == 4
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(AreaTableError, match=r"empty.csv: not an area table"):
        read_area_table(empty)
    short = tmp_path / "short.csv"
    frame().drop(columns=["coverage"]).to_csv(short, index=False)
    with pytest.raises(AreaTableError, match=r"short.csv: expected the columns .* \['coverage'\]"):
        read_area_table(short)


def test_the_page_shows_its_level_with_intervals_coverage_and_what_is_missing() -> None:
    check = page_rows({"a": frame()})
    assert len(check) == 2 and "method" not in check  # level 2 of the check; its method once
    check = check.set_index("class")
    assert check.loc["row_crops", "estimated (ha)"] == "100.0 [90.0, 110.0]"
    assert check.loc["natural", "estimated (ha)"] == "12.0 (no interval)"
    assert check.loc["row_crops", "coverage"] == "96% of 200"
    assert check.loc["row_crops", "Wald coverage"] == "90% of 200"
    assert check.loc["row_crops", "CDL (ha)"] == "104.0"
    user = page_rows({"a": frame()}, method=USER_SAMPLE)
    assert list(user["class"]) == ["row_crops"] and user["coverage"].iloc[0] == ""


def test_the_page_lists_a_runs_classes_largest_first() -> None:
    rows = frame()
    rows.loc[1, "estimated_ha"] = 500.0  # natural now above row_crops
    assert list(page_rows({"a": rows})["class"]) == ["natural", "row_crops"]
    assert list(page_rows({"a": frame()})["class"]) == ["row_crops", "natural"]


def test_the_section_holds_the_figure_and_says_when_a_user_sample_is_there(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.csv"
    frame().to_csv(path, index=False)
    title, html = area_section({"a": path}, from_json("{}"))
    assert title == "Crop areas (hectares, 95% intervals)"
    assert "data:image/png;base64," in html and "<table" in html
    assert "your labelled sample" in html
    assert area_section({}, from_json("{}"))[1] == "<p>No area tables.</p>"


def test_the_section_and_its_figure_are_labelled_at_the_configured_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.csv"
    frame().to_csv(path, index=False)
    labels: list[str] = []
    figure = plots.area_figure
    monkeypatch.setattr(plots, "area_figure", lambda *a: labels.append(a[2]) or figure(*a))
    title, _ = area_section({"a": path}, from_json('{"confidence": 0.9}'))
    assert title == "Crop areas (hectares, 90% intervals)" and labels == ["90%"]


def district_frame() -> pd.DataFrame:
    """The check by district at L2 over the demo's districts: cedar has no test pixel."""
    base = dict.fromkeys(COLUMNS)
    rows = [
        {
            **base,
            "run": "a",
            "method": DISTRICT_CHECK,
            "district": name,
            "level": 2,
            "class_id": cid,
            "class": cls,
            "mapped_ha": ha,
            "estimated_ha": ha,
            "lo_ha": ha - 5,
            "hi_ha": ha + 5,
            "cdl_ha": ha + 1,
            "coverage": 0.95,
            "draws": 200,
            "units_reference": 30,
            "note": "",
        }
        for name, scale in (("alder", 1), ("birch", 2), ("outside", 1), (ALL, 4))
        for cid, cls, ha in ((0, "row_crops", 50.0 * scale), (5, "natural", 20.0 * scale))
    ]
    rows.append({**base, "run": "a", "method": DISTRICT_CHECK, "district": "cedar",
                 "note": "no test pixel in this district: no estimate"})  # fmt: skip
    return pd.concat([frame(), pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)


def test_the_page_shows_the_headline_class_per_district_in_a_table_and_a_map(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.csv"
    district_frame().to_csv(path, index=False)
    demo_file = REPO / "config" / "demo_districts.geojson"
    demo = json.dumps({"districts": {"file": str(demo_file)}})
    rows = district_frame()
    rows = rows[(rows["method"] == DISTRICT_CHECK) & rows["district"].isin(["alder", "birch"])]
    layer = write_district_layer(tmp_path / "a_districts.gpkg",  # the run's layer: its map
                                 read_districts(demo_file, "name"), rows)  # fmt: skip
    _, html = area_section({"a": path}, from_json(demo), layers={"a": layer})
    assert "id='areas-districts'" in html and html.count("<img class='districts'") == 1
    _, unmapped = area_section({"a": path}, from_json(demo))  # no layer: the table alone
    assert "id='areas-districts'" in unmapped and "<img class='districts'" not in unmapped
    table = district_rows({"a": read_area_table(path)}).set_index("district")
    assert list(table.index) == ["alder", "birch", "outside", ALL, "cedar"]
    assert (table["class"] == "row_crops").all()  # the largest at L2 over all districts
    assert table.loc["birch", "estimated (ha)"] == "100.0 [95.0, 105.0]"
    assert table.loc["cedar", "estimated (ha)"] == "no test pixel"
    assert table.loc[ALL, "coverage"] == "95% of 200"
    _, plain = area_section({"a": path}, from_json("{}"))  # no districts set: no such part
    assert "areas-districts" not in plain


def test_the_page_says_how_many_to_label(tmp_path: Path) -> None:
    rows = frame()
    design_level = (rows["method"] == CHECK) & (rows["level"] == 3)
    rows.loc[design_level, "recommended_units"] = 480
    rows.loc[design_level, "delivered_half_width"] = 0.0812
    path = tmp_path / "a.csv"
    rows.to_csv(path, index=False)
    _, html = area_section({"a": path}, from_json('{"sample": {"target": 0.2}}'))
    assert "relative half-width 20%" in html and "a: 480 units; at most 8.1% delivered" in html
    frame().to_csv(path, index=False)  # a table without the recommendation: nothing said
    assert "How many to label" not in area_section({"a": path}, from_json("{}"))[1]
