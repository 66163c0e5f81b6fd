"""A user's labelled sample read back with its design record: references given as CDL codes
or class names of the design's level (any case) come out as class ids at that level, rows
left unlabelled are counted per stratum, every bad input is refused in one line naming the
file and the row (or stratum), and any map's classes are looked up at the sample's points."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from pyproj import Transformer
from rasterio.transform import from_origin

from emb.classes import ClassMap
from emb.estimation.design import draw_points
from emb.estimation.population import PointError, map_classes_at
from emb.estimation.sample_files import (
    LabelledSample,
    ReferenceSampleError,
    SamplePaths,
    check_labelled,
    read_labelled,
    write_sample,
)
from emb.estimation.sample_record import SampleRecordError

NODATA = 255
LEVEL = 2
CORN_CDL = 1  # CDL code of corn: L3 corn, L2 row_crops (0)


def write_map(
    path: Path,
    ids: np.ndarray,
    epsg: int = 32615,
    origin: tuple[float, float] = (400_000.0, 4_500_000.0),
) -> Path:
    """A tiled uint8 class map (L3 ids, 255 = nodata) of ``ids`` (H, W), 10 m pixels."""
    height, width = ids.shape
    profile = {
        "driver": "GTiff", "height": height, "width": width, "count": 1, "dtype": "uint8",
        "crs": f"EPSG:{epsg}", "nodata": NODATA, "tiled": True, "blockxsize": 32,
        "blockysize": 32, "transform": from_origin(*origin, 10.0, 10.0),
    }  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(ids, 1)
    return path


def random_map(shape: tuple[int, int], seed: int) -> np.ndarray:
    """L3 ids at random, the top-left quarter nodata."""
    ids = np.random.default_rng(seed).integers(0, 61, size=shape, dtype=np.uint8)
    ids[: shape[0] // 2, : shape[1] // 2] = NODATA
    return ids


@pytest.fixture
def design(tmp_path: Path, class_map: ClassMap) -> SamplePaths:
    """An L2 design of 40 units over region a (UTM 15N) and region b (UTM 16N)."""
    a = write_map(tmp_path / "a.tif", random_map((80, 70), 1))
    b = write_map(tmp_path / "b.tif", random_map((60, 90), 2), 32616, (300_000.0, 4_400_000.0))
    drawn = draw_points([a, b], LEVEL, class_map, n=40, min_per_class=3, seed=4)
    return write_sample(drawn, tmp_path / "design")


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def label_all(rows: list[dict[str, str]], class_map: ClassMap) -> list[dict[str, str]]:
    """Every row labelled with its own map class's name (the map is right everywhere)."""
    for r in rows:
        r["reference"] = class_map.l2_names[int(r["map_class"])]
    return rows


def labelled(design: SamplePaths, class_map: ClassMap, **changes: str) -> Path:
    """The design's CSV, every row labelled, then ``changes`` (id -> reference) applied."""
    rows = label_all(read_rows(design.csv), class_map)
    for r in rows:
        r["reference"] = changes.get(f"id{r['id']}", r["reference"])
    return write_rows(design.csv.with_name("labelled.csv"), rows)


def test_codes_and_names_of_any_case_become_classes_of_the_design_level(
    design: SamplePaths, class_map: ClassMap
) -> None:
    path = labelled(design, class_map, id1=str(CORN_CDL), id2="SMALL_grains", id3="5.0")
    sample = read_labelled(path, design.record, class_map)
    assert isinstance(sample, LabelledSample)
    by_id = dict(zip(sample.points.ids.tolist(), sample.reference.tolist(), strict=True))
    soybeans_l2 = int(class_map.l3_to_l2[class_map.cdl_to_l3[5]])  # CDL 5: soybeans
    assert (by_id[1], by_id[2], by_id[3]) == (0, 1, soybeans_l2)
    rows = read_rows(design.csv)
    assert sample.stratum.tolist() == [int(r["map_class"]) for r in rows]
    assert sample.points.x.tolist() == [float(r["x"]) for r in rows]
    assert sample.maps_checked == ("a", "b") and sample.unlabelled == 0
    assert sample.record.strata_px.sum() == json.loads(design.record.read_text())["total_pixels"]


def test_unlabelled_and_removed_rows_are_counted_per_stratum(
    design: SamplePaths, class_map: ClassMap
) -> None:
    rows = label_all(read_rows(design.csv), class_map)
    rows[4]["reference"] = rows[9]["reference"] = ""
    removed = rows.pop(20)
    path = write_rows(design.csv.with_name("partly.csv"), rows)
    sample = read_labelled(path, design.record, class_map)
    assert sample.unlabelled_ids.tolist() == [5, 10]
    assert sample.missing_ids.tolist() == [int(removed["id"])]
    assert sample.unlabelled == 3 and len(sample.reference) == 37
    expected = np.zeros(7, np.int64)
    for r in (rows[4], rows[9], removed):
        expected[int(r["map_class"])] += 1
    assert sample.unlabelled_per_stratum.tolist() == expected.tolist()
    assert not {5, 10, int(removed["id"])} & set(sample.points.ids.tolist())


def broken(design: SamplePaths, class_map: ClassMap, change: str) -> tuple[Path, str]:
    """The labelled CSV with one thing wrong, and what the refusal must say."""
    rows = label_all(read_rows(design.csv), class_map)
    third = rows[2]
    if change == "outside":
        third["x"] = str(float(third["x"]) + 1e6)
        said = r"line 4: id 3: point .* lies outside map .*\.tif"
    elif change == "nodata":
        third["region"], third["x"], third["y"] = "a", "400005.0", "4499995.0"
        said = r"line 4: id 3: point on nodata of map .*a\.tif"
    elif change == "cdl code":
        third["reference"] = "0"
        said = r"line 4: id 3: reference '0' is no CDL code"
    elif change == "name":
        third["reference"] = "banana"
        said = r"line 4: id 3: reference 'banana' is neither a CDL code nor a class name of level 2"
    elif change == "empty id":
        third["id"] = " "
        said = r"line 4: empty id"
    elif change == "duplicate id":
        third["id"] = rows[0]["id"]
        said = r"line 4: id 1 is also on line 2"
    elif change == "stratum":
        h = third["map_class"]
        for r in rows:
            if r["map_class"] == h:
                r["reference"] = ""
        said = rf"stratum {h} '{class_map.l2_names[int(h)]}' .* has no labelled unit"
    return write_rows(design.csv.with_name("bad.csv"), rows), said


@pytest.mark.parametrize(
    "change", ["outside", "nodata", "cdl code", "name", "empty id", "duplicate id", "stratum"]
)
def test_a_bad_row_is_refused_in_one_line_naming_file_and_row(
    design: SamplePaths, class_map: ClassMap, change: str
) -> None:
    path, said = broken(design, class_map, change)
    with pytest.raises(ReferenceSampleError, match=rf"^{path}: {said}") as err:
        read_labelled(path, design.record, class_map)
    assert "\n" not in str(err.value)


def test_a_sample_without_its_design_record_is_refused(
    design: SamplePaths, class_map: ClassMap
) -> None:
    path = labelled(design, class_map)
    design.record.unlink()
    with pytest.raises(SampleRecordError, match=rf"^{path}: no design record at .*sample\.json"):
        read_labelled(path, design.record, class_map)


def test_a_record_missing_keys_is_refused(design: SamplePaths, class_map: ClassMap) -> None:
    path = labelled(design, class_map)
    record = json.loads(design.record.read_text())
    del record["strata"], record["seed"]
    design.record.write_text(json.dumps(record))
    with pytest.raises(SampleRecordError, match=r"sample\.json: .* lacks keys \['strata', 'seed'"):
        read_labelled(path, design.record, class_map)


def test_a_point_moved_into_another_stratum_is_refused(
    design: SamplePaths, class_map: ClassMap
) -> None:
    """A map_class edited by hand: the map, still the design's, says otherwise."""
    rows = label_all(read_rows(design.csv), class_map)
    rows[0]["map_class"] = str((int(rows[0]["map_class"]) + 1) % 7)
    path = write_rows(design.csv.with_name("edited.csv"), rows)
    with pytest.raises(ReferenceSampleError, match=r"line 2: id 1: map_class \d but map .* has"):
        read_labelled(path, design.record, class_map)


def test_maps_that_changed_or_went_are_reported_not_checked(
    design: SamplePaths, class_map: ClassMap, tmp_path: Path
) -> None:
    path = labelled(design, class_map)
    (tmp_path / "b.tif").unlink()
    write_map(tmp_path / "a.tif", np.zeros((80, 70), np.uint8))
    sample = read_labelled(path, design.record, class_map)
    assert sample.maps_checked == ()
    assert set(sample.maps_unchecked) == {"a", "b"}
    assert "changed" in sample.maps_unchecked["a"] and "not found" in sample.maps_unchecked["b"]


def test_another_maps_classes_at_the_sample_points(
    design: SamplePaths, class_map: ClassMap, tmp_path: Path
) -> None:
    """Another run's map of region a, all corn (L2 row_crops 0), and of region b, in UTM 15N
    (not the points' 16N), all winter wheat (L2 small_grains 1)."""
    sample = read_labelled(labelled(design, class_map), design.record, class_map)
    b = sample.points.region == "b"
    lon, lat = Transformer.from_crs(32616, 4326, always_xy=True).transform(
        sample.points.x[b], sample.points.y[b]
    )
    x, y = Transformer.from_crs(4326, 32615, always_xy=True).transform(lon, lat)
    origin = (np.floor(x.min()) - 500.0, np.ceil(y.max()) + 500.0)
    side = int((max(x.max() - x.min(), y.max() - y.min()) + 1000) / 10) + 1
    other = {
        "a": write_map(tmp_path / "a2.tif", np.zeros((80, 70), np.uint8)),
        "b": write_map(tmp_path / "b2.tif", np.full((side, side), 2, np.uint8), 32615, origin),
    }
    found = map_classes_at(sample.points, other, LEVEL, class_map)
    assert found.tolist() == np.where(b, 1, 0).tolist()


def test_a_point_on_another_maps_nodata_is_refused_naming_id_and_map(
    design: SamplePaths, class_map: ClassMap, tmp_path: Path
) -> None:
    sample = read_labelled(labelled(design, class_map), design.record, class_map)
    ids = np.zeros((80, 70), np.uint8)
    first_a = int(np.flatnonzero(sample.points.region == "a")[0])
    with rasterio.open(tmp_path / "a.tif") as src:
        row, col = src.index(sample.points.x[first_a], sample.points.y[first_a])
    ids[row, col] = NODATA
    other = {"a": write_map(tmp_path / "a2.tif", ids), "b": tmp_path / "b.tif"}
    point = sample.points.ids[first_a]
    with pytest.raises(PointError, match=rf"a2\.tif: point id {point} lies on nodata"):
        map_classes_at(sample.points, other, LEVEL, class_map)
    small = {"a": write_map(tmp_path / "a3.tif", np.zeros((2, 2), np.uint8)), "b": other["b"]}
    with pytest.raises(PointError, match=r"a3\.tif: point id \d+ .* outside the map"):
        map_classes_at(sample.points, small, LEVEL, class_map)
    corn = write_map(tmp_path / "a4.tif", np.zeros((80, 70), np.uint8))
    with pytest.raises(PointError, match=r"no map of region 'b' \(point id \d+\)"):
        map_classes_at(sample.points, {"a": corn}, LEVEL, class_map)


WORKBOOKS = {
    "xlsx": b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\x8d",  # a zip's first header
    "xls": bytes.fromhex("d0cf11e0a1b11ae1") + bytes(24),  # an OLE2 compound file
}


@pytest.mark.parametrize("kind", ["xlsx", "xls"])
def test_a_workbook_renamed_csv_is_refused_as_one(
    design: SamplePaths, class_map: ClassMap, kind: str
) -> None:
    path = design.csv.with_name("labelled.csv")
    path.write_bytes(WORKBOOKS[kind])
    with pytest.raises(ReferenceSampleError, match=rf"^{path}: a spreadsheet workbook, not a CSV"):
        read_labelled(path, design.record, class_map)


def with_notes(rows: list[dict[str, str]], notes: dict[int, str]) -> list[dict[str, str]]:
    """A free-text column ``notes`` added, filled for the rows of ``notes`` (index -> text)."""
    return [{**r, "notes": notes.get(i, "")} for i, r in enumerate(rows)]


def test_a_csv_in_a_legacy_code_page_is_refused_naming_its_line_and_byte(
    design: SamplePaths, class_map: ClassMap
) -> None:
    """Excel's plain "CSV" outside the US: latin-1, here in a free-text column of row id 4."""
    rows = with_notes(label_all(read_rows(design.csv), class_map), {3: "naïve"})
    path = design.csv.with_name("latin1.csv")
    with open(path, "w", newline="", encoding="latin-1") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ReferenceSampleError) as err:
        read_labelled(path, design.record, class_map)
    assert str(err.value) == (
        f'{path}: line 5: not UTF-8 text (byte 0xef); save it from the spreadsheet as "CSV '
        f'UTF-8 (Comma delimited)"'
    )


def test_a_semicolon_separated_csv_is_refused_naming_both_delimiters(
    design: SamplePaths, class_map: ClassMap
) -> None:
    """Excel's export where "," is the decimal separator: refused, not read, as its x, y
    would then hold decimal commas; before, "missing columns" for a header holding them all."""
    rows = label_all(read_rows(design.csv), class_map)
    path = design.csv.with_name("semicolons.csv")
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter=";")
        writer.writeheader()
        writer.writerows([{**r, "x": r["x"].replace(".", ",")} for r in rows])
    with pytest.raises(
        ReferenceSampleError, match=rf"^{path}: line 1: columns separated by ';', expected ','; "
    ):  # fmt: skip
        read_labelled(path, design.record, class_map)


def test_a_quoted_line_break_does_not_shift_the_lines_named_after_it(
    design: SamplePaths, class_map: ClassMap
) -> None:
    """id 2's note holds a line break (lines 3-4): id 5 is on line 7, not 6."""
    rows = with_notes(label_all(read_rows(design.csv), class_map), {1: "two\nlines"})
    rows[4]["reference"] = "banana"
    path = write_rows(design.csv.with_name("notes.csv"), rows)
    assert path.read_text().splitlines()[6].startswith("5,")
    with pytest.raises(ReferenceSampleError, match=rf"^{path}: line 7: id 5: reference 'banana'"):
        read_labelled(path, design.record, class_map)


@pytest.mark.parametrize("change", ["cdl code", "name", "empty id", "duplicate id", "stratum"])
def test_the_checks_that_need_no_map_run_without_the_maps(
    design: SamplePaths, class_map: ClassMap, tmp_path: Path, change: str
) -> None:
    """What the workflow checks at parse time, when the design's maps may not exist."""
    (tmp_path / "a.tif").unlink()
    (tmp_path / "b.tif").unlink()
    assert check_labelled(labelled(design, class_map), design.record, class_map).n_drawn == 40
    path, said = broken(design, class_map, change)
    with pytest.raises(ReferenceSampleError, match=rf"^{path}: {said}"):
        check_labelled(path, design.record, class_map)
