"""Each bad input is refused before any job with one line naming the file, the area and what
was found: areas files that cannot be read, years out of range, gaps, an index that disagrees
with its files, the antimeridian, areas overlapping in one year."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pyogrio
import pytest
import rasterio
import shapely
import yaml
from areas_collection import (
    YEAR,
    Collection,
    make_collection,
    run_snakemake,
    write_geojson,
    write_gpkg,
)
from conftest import REPO
from pyproj import CRS

from emb.areas import AreasError
from emb.geo import WGS84, reproject
from emb.workflow.area_plan import plan_from_config


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    return make_collection(tmp_path_factory.mktemp("pristine"))


def copy_of(c: Collection, root: Path) -> Collection:
    """Hard links of the collection: a case replaces files, never edits one in place."""
    shutil.copytree(c.root, root, copy_function=os.link)
    moved = {
        k: Path(str(v).replace(str(c.root), str(root)))
        for k, v in vars(c).items()
        if isinstance(v, Path)
    }
    truth = {z: root / p.relative_to(c.root) for z, p in c.truth.items()}
    return Collection(**{**moved, "truth": truth})


def config_of(c: Collection) -> dict:
    return {
        "areas": str(c.areas),
        "collections": {
            "aef": {"folder": str(c.aef), "index": str(c.aef_index)},
            "tessera": {"folder": str(c.tessera), "registry": str(c.tessera_registry)},
            "cdl": {"path": str(c.cdl_tiles.parent / "{year}")},
        },
    }


def aef_tile(c: Collection, zone: str = "14N", name: str = "x1y1") -> Path:
    return c.aef / str(YEAR) / zone / f"{name}-0000000000-0000000000.tiff"


def rewrite(path: Path, width: int = 96, epsg: int | None = None) -> None:
    with rasterio.open(path) as src:
        profile, data = src.profile, src.read()
    path.unlink()  # a hard link: the pristine copy stays as it was
    crs = f"EPSG:{epsg}" if epsg else profile["crs"]
    with rasterio.open(path, "w", **{**profile, "width": width, "crs": crs}) as out:
        out.write(data[:, :, :width])


def area_file(c: Collection, **changes) -> None:
    area = {
        "area": "field_trial",
        "year": YEAR,
        "split": "auto",
        "geometry": shapely.box(-96.012, 42.002, -95.988, 42.020),
        **changes,
    }
    write_geojson(c.areas, [area])


def unreadable(c: Collection, cfg: dict) -> tuple[str, ...]:
    path = c.root / "areas.gpkg"
    path.write_bytes(b"not a GeoPackage at all")
    cfg["areas"] = str(path)
    return (str(path), "cannot read")


def gpkg_cfg(c: Collection, cfg: dict, geometry=None, epsg: int | None = 4326, **kw) -> Path:
    """The field trial as ``areas.gpkg`` (GDAL-written), named in the config."""
    box = shapely.box(-96.012, 42.002, -95.988, 42.020)
    area = {"area": "field_trial", "year": YEAR, "geometry": box if geometry is None else geometry}
    path = c.root / "areas.gpkg"
    write_gpkg(path, [area], epsg, **kw)
    cfg["areas"] = str(path)
    return path


def gpkg_of_another_format(c: Collection, cfg: dict) -> tuple[str, ...]:
    """A GeoJSON named .gpkg: GDAL would read it, the suffix says GeoPackage."""
    area_file(c)
    path = c.root / "areas.gpkg"
    shutil.copy(c.areas, path)
    cfg["areas"] = str(path)
    return (str(path), "expected a GeoPackage", "found a GeoJSON file")


def gpkg_without_features(c: Collection, cfg: dict) -> tuple[str, ...]:
    path = c.root / "areas.gpkg"
    names = np.array(["field_trial"], dtype=object)
    pyogrio.raw.write(str(path), None, [names], ["area"], layer="notes", driver="GPKG")
    cfg["areas"] = str(path)
    return (str(path), "without a features table", "found only the attribute tables ['notes']")


def gpkg_without_crs(c: Collection, cfg: dict) -> tuple[str, ...]:
    path = gpkg_cfg(c, cfg, epsg=None, layer="fields")
    return (str(path), "layer 'fields'", "declares no CRS", "expected one")


def gpkg_empty_geometry(c: Collection, cfg: dict) -> tuple[str, ...]:
    path = gpkg_cfg(c, cfg, geometry=shapely.Polygon())
    return (str(path), "'field_trial'", "expected a polygon", "empty")


def gpkg_null_geometry(c: Collection, cfg: dict) -> tuple[str, ...]:
    path = c.root / "areas.gpkg"
    write_gpkg(path, [{"area": "field_trial", "year": YEAR, "geometry": None}], 4326)
    cfg["areas"] = str(path)
    return (str(path), "'field_trial'", "expected a polygon", "empty")


def gpkg_of_points(c: Collection, cfg: dict) -> tuple[str, ...]:
    path = gpkg_cfg(c, cfg, geometry=shapely.Point(-96.0, 42.01), kind="Point")
    return (str(path), "'field_trial'", "expected a polygon", "zero-area")


def index_gpkg_unreadable(c: Collection, cfg: dict) -> tuple[str, ...]:
    index = c.aef_index.with_suffix(".gpkg")
    index.write_bytes(b"not a GeoPackage at all")
    cfg["collections"]["aef"]["index"] = str(index)
    return (str(index), "cannot read the AEF index", "GDAL cannot read it as a GeoPackage")


def unknown_format(c: Collection, cfg: dict) -> tuple[str, ...]:
    cfg["areas"] = str(c.root / "areas.shp")
    return ("areas.shp", "unknown format", ".shp")


def unreadable_crs(c: Collection, cfg: dict) -> tuple[str, ...]:
    write_geojson(
        c.areas,
        [{"area": "field_trial", "year": YEAR, "geometry": shapely.box(0, 0, 1, 1)}],
        "EPSG:999999",
    )
    return (str(c.areas), "999999")


def year_out_of_range(c: Collection, cfg: dict) -> tuple[str, ...]:
    area_file(c, year=2015)
    return (str(c.areas), "'field_trial'", "year 2015", "2017-2025", "2024-2024")


def no_tiles_there(c: Collection, cfg: dict) -> tuple[str, ...]:
    area_file(c, geometry=shapely.box(-90.02, 42.0, -90.0, 42.01))
    return (str(c.aef_index), "'field_trial'", "zone 15N", "no AEF tile", "lon -90.0200")


def gap_in_coverage(c: Collection, cfg: dict) -> tuple[str, ...]:
    area_file(c, geometry=shapely.box(-96.012, 42.002, -95.960, 42.020))
    return (str(c.aef_index), "'field_trial'", "zone 15N", "no AEF tile", "gap", "km2")


def missing_file(c: Collection, cfg: dict) -> tuple[str, ...]:
    aef_tile(c).unlink()
    return (str(c.aef_index), "'field_trial'", "2024/14N/x1y1", "not in the folder")


def other_size(c: Collection, cfg: dict) -> tuple[str, ...]:
    rewrite(aef_tile(c), width=90)
    return (str(aef_tile(c)), "'field_trial'", "90 x 96", "96 x 96", str(c.aef_index))


def other_crs(c: Collection, cfg: dict) -> tuple[str, ...]:
    rewrite(aef_tile(c), epsg=32613)
    return (str(aef_tile(c)), "'field_trial'", "EPSG:32613", "EPSG:32614")


def antimeridian(c: Collection, cfg: dict) -> tuple[str, ...]:
    path = c.root / "areas.tsv"
    path.write_text(
        "area\tyear\tsplit\twest\tsouth\teast\tnorth\n"
        f"pacific\t{YEAR}\tauto\t179.9\t-17.0\t-179.9\t-16.9\n"
    )
    cfg["areas"] = str(path)
    return (str(path), "'pacific'", "antimeridian", "179.9")


def metres_read_as_degrees(c: Collection, cfg: dict) -> tuple[str, ...]:
    """UTM metres in a GeoJSON without a 'crs' member: not an area across the antimeridian."""
    utm = reproject(shapely.box(-96.012, 42.002, -95.988, 42.020), WGS84, CRS.from_epsg(32614))
    area_file(c, geometry=utm)
    return (str(c.areas), "'field_trial'", "not longitude/latitude", "declares no CRS",
            "OGC:CRS84", f"x {utm.bounds[0]:.6g}", "name their CRS")  # fmt: skip


def metres_under_a_degrees_crs(c: Collection, cfg: dict) -> tuple[str, ...]:
    utm = reproject(shapely.box(-96.012, 42.002, -95.988, 42.020), WGS84, CRS.from_epsg(32614))
    write_geojson(c.areas, [{"area": "field_trial", "year": YEAR, "geometry": utm}], "EPSG:4326")
    return (str(c.areas), "'field_trial'", "not longitude/latitude", "declares EPSG:4326")


def crs_member_not_understood(c: Collection, cfg: dict) -> tuple[str, ...]:
    area_file(c)
    doc = json.loads(c.areas.read_text())
    doc["crs"] = {"type": "link", "properties": {"href": "http://example.org/32614.wkt"}}
    c.areas.write_text(json.dumps(doc))
    return (str(c.areas), "'crs' member", "cannot use", '"type": "link"')


def overlapping_areas(c: Collection, cfg: dict) -> tuple[str, ...]:
    a = shapely.box(-96.012, 42.002, -95.988, 42.020)
    write_geojson(
        c.areas,
        [
            {"area": "north", "year": YEAR, "geometry": a},
            {"area": "south", "year": YEAR, "geometry": a.buffer(-0.001)},
        ],
    )
    return (str(c.areas), "'north'", "'south'", "overlap", "km2")


def tessera_missing(c: Collection, cfg: dict) -> tuple[str, ...]:
    (c.tessera / f"{YEAR}/grid_-95.95_42.05/grid_-95.95_42.05_{YEAR}.tiff").unlink()
    return (str(c.tessera_registry), "'field_trial'", "grid_-95.95_42.05", "not in")


def cdl_missing(c: Collection, cfg: dict) -> tuple[str, ...]:
    cfg["collections"]["cdl"] = {"path": str(c.root / "cdl/{year}_30m_cdls_missing.tif")}
    return ("2024_30m_cdls_missing.tif", "'field_trial'", "not found")


def index_without_columns(c: Collection, cfg: dict) -> tuple[str, ...]:
    table = pq.read_table(c.aef_index).drop(["utm_zone"])
    c.aef_index.unlink()
    pq.write_table(table, c.aef_index)
    return (str(c.aef_index), "utm_zone", "published columns")


def tile_elsewhere(c: Collection, cfg: dict) -> tuple[str, ...]:
    """Same name, size and CRS as its index row, but its pixels 10 km east."""
    path = aef_tile(c)
    with rasterio.open(path) as src:
        profile, data = src.profile, src.read()
    path.unlink()
    moved = profile["transform"] * rasterio.Affine.translation(1000, 0)  # 1000 px of 10 m
    with rasterio.open(path, "w", **{**profile, "transform": moved}) as out:
        out.write(data)
    return (str(path), "'field_trial'", "half a pixel", str(c.aef_index), "not the tile")


def tile_moved_north(c: Collection, cfg: dict) -> tuple[str, ...]:
    """Same name, size, CRS, west and east as its index row, but 10 km north: only a check of
    its south and north edges too can tell."""
    path = aef_tile(c)
    with rasterio.open(path) as src:
        profile, data = src.profile, src.read()
    path.unlink()
    moved = rasterio.Affine.translation(0, 10_000) * profile["transform"]  # map metres
    with rasterio.open(path, "w", **{**profile, "transform": moved}) as out:
        out.write(data)
    return (str(path), "'field_trial'", "half a pixel", str(c.aef_index), "not the tile")


def cdl_tiles_of_another_year(c: Collection, cfg: dict) -> tuple[str, ...]:
    for tile in sorted(c.cdl_tiles.iterdir()):
        tile.rename(tile.with_name(tile.name.replace(str(YEAR), str(YEAR - 1))))
    return (f"cdl_{YEAR - 1}_", "'field_trial'", f"a CDL tile of {YEAR - 1}", f"of {YEAR}")


def bow_tie(c: Collection, cfg: dict) -> tuple[str, ...]:
    w, s, e, n = -96.012, 42.002, -95.988, 42.020
    area_file(c, geometry=shapely.Polygon([(w, s), (e, n), (e, s), (w, n)]))
    return (str(c.areas), "'field_trial'", "Self-intersection[-96", "bow-tie")


def unclosed_ring(c: Collection, cfg: dict) -> tuple[str, ...]:
    ring = [[-96.012, 42.002], [-95.988, 42.002], [-95.988, 42.020], [-96.012, 42.020]]
    feature = {
        "type": "Feature",
        "geometry": {"type": "Polygon", "coordinates": [ring]},
        "properties": {"area": "open_ring", "year": YEAR},
    }
    c.areas.unlink()
    c.areas.write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}))
    return (str(c.areas), "feature 1 (area 'open_ring')", "closed")


def geojson_without_area(c: Collection, cfg: dict) -> tuple[str, ...]:
    write_geojson(c.areas, [{"name": "field_trial", "year": YEAR, "geometry": shapely.box(
        -96.012, 42.002, -95.988, 42.020)}])  # fmt: skip
    return (str(c.areas), "feature 1", "no 'area' property", "['name', 'year']")


def tessera_only_year_outside(c: Collection, cfg: dict) -> tuple[str, ...]:
    del cfg["collections"]["aef"]
    area_file(c, year=2016)
    return (str(c.areas), "'field_trial'", "year 2016", "outside the TESSERA", "2017-2025")


def area_too_small_for_a_tile(c: Collection, cfg: dict) -> tuple[str, ...]:
    """About 250 x 330 m: 27 x 35 px, far below 25% of a 256-px tile, named at parse time."""
    area_file(c, geometry=shapely.box(-96.010, 42.005, -96.007, 42.008))
    cfg["tiles"] = {"size": 256, "stride": 256, "min_valid": 0.25}
    return (str(c.areas), "'field_trial'", "zone 14N", "field_trial_14n is 27 x 35 px",
            "256-px tiles", "tiles.min_valid 0.25", "smaller tiles.size (32 gives up to 1 tile)",
            "a bigger area")  # fmt: skip


def block_larger_than_the_regions(c: Collection, cfg: dict) -> tuple[str, ...]:
    """Regions of about 1 x 2 km, blocks of 51.2 km: one block each, two splits at most, refused
    at parse time (its split blocks are the shards' concern, not the plan's)."""
    cfg["splits"] = {"block_m": 51200}
    cfg["tiles"] = {"size": 64, "stride": 64, "min_valid": 0.25}
    return (str(c.areas), "splits.block_m 51200 m", "region field_trial_14n is 1.06 km x 2.03 km",
            "(1 block)", "at most 2 of the 3 splits", "set splits.block_m smaller")  # fmt: skip


CASES: list[Callable] = [
    unreadable,
    gpkg_of_another_format,
    gpkg_without_features,
    gpkg_without_crs,
    gpkg_empty_geometry,
    gpkg_null_geometry,
    gpkg_of_points,
    index_gpkg_unreadable,
    unknown_format,
    unreadable_crs,
    year_out_of_range,
    no_tiles_there,
    gap_in_coverage,
    missing_file,
    other_size,
    other_crs,
    antimeridian,
    metres_read_as_degrees,
    metres_under_a_degrees_crs,
    crs_member_not_understood,
    overlapping_areas,
    tessera_missing,
    cdl_missing,
    index_without_columns,
    tile_elsewhere,
    tile_moved_north,
    cdl_tiles_of_another_year,
    bow_tie,
    unclosed_ring,
    geojson_without_area,
    tessera_only_year_outside,
    area_too_small_for_a_tile,
]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_input_is_one_line_naming_file_area_and_finding(
    pristine: Collection, tmp_path: Path, case: Callable
) -> None:
    c = copy_of(pristine, tmp_path / "c")
    cfg = config_of(c)
    needles = case(c, cfg)
    with pytest.raises(AreasError) as err:
        plan_from_config(cfg)
    text = str(err.value)
    assert "\n" not in text
    missing = [n for n in needles if n not in text]
    assert not missing, f"{missing} not in: {text}"


@pytest.mark.parametrize(
    "case",
    [
        missing_file,
        antimeridian,
        other_crs,
        area_too_small_for_a_tile,
        block_larger_than_the_regions,
    ],
    ids=[
        "missing_file",
        "antimeridian",
        "other_crs",
        "area_too_small_for_a_tile",
        "block_larger_than_the_regions",
    ],  # fmt: skip
)
def test_snakemake_refuses_before_any_job(pristine: Collection, tmp_path: Path, case) -> None:
    c = copy_of(pristine, tmp_path / "c")
    cfg = config_of(c)
    needles = case(c, cfg)
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    (work / "areas.yaml").write_text(yaml.safe_dump({**cfg, "regions": ""}))
    result = run_snakemake(work, ["areas.yaml"], "--cores", "1")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if needles[0] in line]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), result.stderr[-2000:]
    assert not (work / "resources").exists() and not (work / "results").exists()


def test_a_case_never_changes_the_pristine_collection(pristine: Collection, tmp_path: Path) -> None:
    c = copy_of(pristine, tmp_path / "c")
    rewrite(aef_tile(c), width=90)
    area_file(c, year=2015)
    with rasterio.open(aef_tile(pristine)) as src:
        assert src.width == 96
    assert str(YEAR) in pristine.areas.read_text()
