"""The regions check reads rows ahead in threads (emb.workflow.region_checks): the error it
raises is still the first of the table, row by row and column by column, and the labels check
reads the CDL once for both sources and still checks both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rasterio
from rasterio.transform import from_origin

from emb.prep.regions import RegionsError, read_regions
from emb.workflow.region_checks import READERS, check_regions, records

HEADER = "region\tyear\taef\ttessera\tcdl\tsplit"
KINDS = (("aef", 64, "int8"), ("tessera", 128, "float32"), ("cdl", 1, "uint8"))


def raster(path: Path, count: int, dtype: str, x: float) -> str:
    transform = from_origin(x, 4000000, 10, 10)
    with rasterio.open(path, "w", driver="GTiff", width=4, height=4, crs="EPSG:32615",
                       count=count, dtype=dtype, transform=transform) as dst:  # fmt: skip
        dst.write(np.ones((count, 4, 4), dtype))
    return str(path)


def table_of(root: Path, rows: int, tessera_elsewhere: int = 0, aef_missing: int = 0) -> Path:
    """``rows`` regions of tiny rasters, each on its own grid; row ``tessera_elsewhere`` (1-based)
    has its TESSERA raster far from its CDL, row ``aef_missing`` an AEF path with no file."""
    lines = [HEADER]
    for row in range(1, rows + 1):
        x = 500000 + row * 100
        cells = {}
        for kind, count, dtype in KINDS:
            at = x + 50000 if kind == "tessera" and row == tessera_elsewhere else x
            cells[kind] = raster(root / f"r{row}_{kind}.tif", count, dtype, at)
        if row == aef_missing:
            cells["aef"] = str(root / f"r{row}_missing.tif")
        lines.append(
            "\t".join([f"r{row}", "2024", cells["aef"], cells["tessera"], cells["cdl"], ""])
        )
    path = root / "regions.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_row_read_ahead_gives_its_sizes(tmp_path: Path) -> None:
    path = table_of(tmp_path, 3 * READERS)
    checks = check_regions(read_regions(path), path)
    assert len(checks.pixels) == 3 * 3 * READERS and set(checks.pixels.values()) == {16}


def test_the_labels_under_the_second_source_are_checked_through_the_shared_cdl(
    tmp_path: Path,
) -> None:
    path = table_of(tmp_path, 2, tessera_elsewhere=2)
    with pytest.raises(RegionsError, match=r"row 2 \(region 'r2'\), column 'cdl': .*r2_cdl\.tif "
                       r"does not overlap the embedding raster .*r2_tessera\.tif"):  # fmt: skip
        check_regions(read_regions(path), path)


def test_the_first_mistake_of_the_table_is_named_though_a_later_row_is_read_first(
    tmp_path: Path,
) -> None:
    """Row 3's labels fail in a reader thread, row 7's missing file too; row 3 is named, as a
    check reading one row after another would name it."""
    path = table_of(tmp_path, 2 * READERS + 2, tessera_elsewhere=3, aef_missing=7)
    with pytest.raises(RegionsError, match=r"row 3 \(region 'r3'\), column 'cdl'"):
        check_regions(read_regions(path), path)
    path = table_of(tmp_path, 2 * READERS + 2, tessera_elsewhere=7, aef_missing=3)
    with pytest.raises(RegionsError, match=r"row 3 \(region 'r3'\), column 'aef': file not found"):
        check_regions(read_regions(path), path)


LAST = 2 * READERS + 2  # rows of the table: the last READERS - 1 are read after it runs out


@pytest.mark.parametrize(
    ("labels_fail", "file_missing", "named", "column"),
    [(LAST, 0, LAST, "cdl"), (0, LAST, LAST, "aef"),
     (LAST - 2, LAST, LAST - 2, "cdl"), (LAST, LAST - 2, LAST - 2, "aef")],
    ids=["last-labels", "last-file", "8-labels-10-file", "8-file-10-labels"],
)  # fmt: skip
def test_the_tables_last_rows_are_checked_in_order(
    tmp_path: Path, labels_fail: int, file_missing: int, named: int, column: str
) -> None:
    """The rows still held when the table runs out are checked too, in table order: a
    mistake in the last row alone is found; of rows 8 and 10 of 10, row 8 is named,
    whichever mistake each has."""
    path = table_of(tmp_path, LAST, tessera_elsewhere=labels_fail, aef_missing=file_missing)
    with pytest.raises(
        RegionsError, match=rf"row {named} \(region 'r{named}'\), column '{column}'"
    ):
        check_regions(read_regions(path), path)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_one_raster_under_two_paths_is_the_same_file(tmp_path: Path, link: str) -> None:
    """A link is the same pixels: listed under two regions it would leak between splits."""
    path = table_of(tmp_path, 2)
    first = tmp_path / "r1_aef.tif"
    other = tmp_path / "elsewhere" / "aef.tif"
    other.parent.mkdir()
    if link == "symlink":
        other.symlink_to(first)
    else:
        other.hardlink_to(first)
    path.write_text(path.read_text().replace(str(tmp_path / "r2_aef.tif"), str(other)))
    named = r"row 2 \(region 'r2'\), column 'aef': .*elsewhere/aef\.tif is the same file as "
    with pytest.raises(RegionsError, match=named + r".*row 1 \(region 'r1'\), column 'aef'"):
        check_regions(read_regions(path), path)


def test_a_duplicate_id_names_its_first_row(tmp_path: Path) -> None:
    path = table_of(tmp_path, 4)
    path.write_text(path.read_text().replace("r3\t", "r2\t", 1))
    with pytest.raises(RegionsError, match=r"row 3 \(region 'r2'\), column 'region': duplicate "
                       r"region id, already used in row 2$"):  # fmt: skip
        check_regions(read_regions(path), path)


def test_the_rows_are_read_as_iterrows_gave_them(tmp_path: Path) -> None:
    """records(): plain dicts, each row's cells as a Series of it held them, in table order,
    a missing cell (a row an area added without that column) included."""
    path = table_of(tmp_path, 3)
    table = read_regions(path)
    table = pd.concat([table, pd.DataFrame({"region": ["a_1"], "aef": ["x.vrt"]}, index=["a_1"])])
    got = list(records(table))
    assert [region for region, _ in got] == ["r1", "r2", "r3", "a_1"]
    expected = [(region, rec.to_dict()) for region, rec in table.iterrows()]
    assert [(r, {k: str(v) for k, v in c.items()}) for r, c in got] == [
        (r, {k: str(v) for k, v in c.items()}) for r, c in expected
    ]
