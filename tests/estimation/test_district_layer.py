"""The districts' GIS layer: one feature per district in the districts file's CRS, the wide
columns as documented (short names unique and within a shapefile's 10 characters), NULL where
a district lacks a figure, the outside left to the CSV; read back with pyogrio, SQLite (the
GeoPackage's own tables) and GDAL's ogrinfo where it is installed."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyogrio
import pytest
import shapely
from conftest import REPO
from pyproj import CRS

from emb.classes import load_class_map
from emb.estimation.district_layer import (
    CLASSES_TABLE,
    LAYER,
    DistrictLayerError,
    layer_fields,
    short_names,
    write_district_layer,
)
from emb.estimation.districts import Districts
from emb.estimation.estimates_table import NO_DATA

DISTRICTS = Districts(
    Path("districts.geojson"), "name", ("north", "south", "far"),
    (shapely.box(-93.66, 42.0, -93.6, 42.03),
     shapely.Polygon([(-93.66, 41.95), (-93.6, 41.95), (-93.6, 42.0), (-93.66, 42.0)],
                     [[(-93.64, 41.96), (-93.62, 41.96), (-93.62, 41.97), (-93.64, 41.97)]]),
     shapely.MultiPolygon([shapely.box(-97.85, 41.15, -97.8, 41.2),
                           shapely.box(-97.79, 41.15, -97.78, 41.16)])),
    CRS.from_epsg(4326),
)  # fmt: skip


def row(district: str, cls: str, est: float, lo: float | None, n: int) -> dict:
    hi = None if lo is None else est + (est - lo)
    return {"district": district, "class": cls, "mapped_ha": est * 1.1, "estimated_ha": est,
            "lo_ha": lo, "hi_ha": hi, "units_reference": n}  # fmt: skip


ROWS = pd.DataFrame([
    row("north", "corn", 120.0, 100.0, 30), row("north", "winter_wheat", 10.0, 4.0, 5),
    row("south", "corn", 80.0, None, 12), row("outside", "corn", 999.0, 900.0, 7),
    row("north", "winter_other", 1.0, 0.5, 2),
])  # fmt: skip


@pytest.fixture
def layer(tmp_path: Path) -> Path:
    return write_district_layer(tmp_path / "run_districts.gpkg", DISTRICTS, ROWS)


def test_one_feature_per_district_with_the_documented_fields(layer: Path) -> None:
    info = pyogrio.read_info(layer, layer=LAYER)
    assert info["features"] == 3  # the outside has no polygon
    assert info["geometry_type"] == "MultiPolygon"
    assert CRS.from_user_input(info["crs"]) == DISTRICTS.crs
    shorts = short_names(["corn", "winter_wheat", "winter_other"])
    assert shorts == {"corn": "corn", "winter_wheat": "winwhe", "winter_other": "winoth"}
    expected = ["district", "dist_id"] + [
        f"{s}_{stat}"
        for s in ("corn", "winwhe", "winoth")
        for stat in ("map", "est", "lo", "hi", "n")
    ]  # the largest class first
    assert (
        list(info["fields"]) == expected == layer_fields(["corn", "winter_wheat", "winter_other"])
    )
    assert dict(zip(info["fields"], info["ogr_types"], strict=True))["corn_n"] == "OFTInteger64"
    _, table = pyogrio.read_arrow(layer, layer=LAYER)
    frame = table.to_pandas().set_index("district")
    assert list(frame.index) == ["north", "south", "far"]
    assert frame["dist_id"].tolist() == [1, 2, 3]
    assert frame.loc["north", "corn_est"] == 120.0 and frame.loc["north", "corn_lo"] == 100.0
    assert frame.loc["north", "corn_hi"] == 140.0 and frame.loc["north", "corn_n"] == 30
    assert frame.loc["south", "corn_map"] == pytest.approx(88.0)
    assert pd.isna(frame.loc["south", "corn_lo"])  # no interval: NULL, not 0
    assert pd.isna(frame.loc["south", "winwhe_est"]) and pd.isna(frame.loc["south", "winwhe_n"])
    assert frame.loc[["far"]].drop(columns=["dist_id", "geom"]).isna().all(axis=None)
    geoms = shapely.from_wkb(table.column("geom").to_numpy(zero_copy_only=False))
    for got, want in zip(geoms, DISTRICTS.geometries, strict=True):
        assert got.normalize().equals(shapely.MultiPolygon(
            list(getattr(want, "geoms", [want]))).normalize())  # fmt: skip
    _, classes = pyogrio.read_arrow(layer, layer=CLASSES_TABLE)
    assert classes.to_pydict() == {"short": ["corn", "winwhe", "winoth"],
                                   "class": ["corn", "winter_wheat", "winter_other"]}  # fmt: skip


def test_the_geopackage_tables_as_sqlite_reads_them(layer: Path) -> None:
    with sqlite3.connect(layer) as db:
        contents = dict(db.execute("select table_name, data_type from gpkg_contents"))
        description = db.execute(
            "select description from gpkg_contents where table_name = ?", (LAYER,)
        ).fetchone()[0]
        columns = [r[1] for r in db.execute(f"pragma table_info({LAYER})")]
    assert contents == {LAYER: "features", CLASSES_TABLE: "attributes"}
    assert "_est the estimate" in description and "outside" in description
    assert columns[:3] == ["fid", "geom", "district"]


@pytest.mark.skipif(shutil.which("ogrinfo") is None, reason="GDAL's command line tools absent")
def test_ogrinfo_reads_it(layer: Path) -> None:
    out = subprocess.run(["ogrinfo", "-so", "-al", str(layer)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert "Feature Count: 3" in out and "corn_est: Real" in out


def test_short_names_of_every_class_table_level_are_unique_and_short() -> None:
    cmap = load_class_map(REPO / "config" / "classes.csv")
    for names in (cmap.l1_names, cmap.l2_names, (*cmap.l3_names, NO_DATA)):
        shorts = short_names(names)
        assert len(set(shorts.values())) == len(names)
        for field in layer_fields(names):
            assert len(field) <= 10 and field.isascii(), field
            assert field[0].isalpha() and field == field.lower(), field
    assert short_names(["other_crops", "other_crop", "Other-Crops", "2023 maize"]) == {
        "other_crops": "othcro", "other_crop": "othcr2", "Other-Crops": "othcr3",
        "2023 maize": "c20mai",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (ROWS.drop(columns=["lo_ha"]), "expected columns"),
        (pd.concat([ROWS, pd.DataFrame([row("west", "corn", 1.0, None, 1)])]),
         "districts.geojson: field 'name': rows name districts ['west'] the file does not hold"),
        (pd.concat([ROWS, ROWS.iloc[:1]]), "district 'north' class 'corn': expected one row"),
    ],
)  # fmt: skip
def test_rows_that_do_not_fit_are_refused(tmp_path: Path, rows: pd.DataFrame,
                                          expected: str) -> None:  # fmt: skip
    path = tmp_path / "d.gpkg"
    with pytest.raises(DistrictLayerError, match=re.escape(expected)):
        write_district_layer(path, DISTRICTS, rows)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_a_district_file_in_metres_keeps_its_crs_and_the_outside_stays_out(tmp_path: Path) -> None:
    utm = Districts(Path("d.gpkg"), "name", ("a",), (shapely.box(4e5, 4.6e6, 4.1e5, 4.61e6),),
                    CRS.from_epsg(32615))  # fmt: skip
    path = write_district_layer(tmp_path / "d.gpkg", utm, ROWS[ROWS["district"] == "outside"])
    info = pyogrio.read_info(path, layer=LAYER)
    assert info["crs"] == "EPSG:32615" and info["features"] == 1
    assert list(info["fields"]) == ["district", "dist_id"]  # no district rows: no class
    assert np.isfinite(info["total_bounds"]).all()
