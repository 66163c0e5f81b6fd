"""The planner and the VRTs on a synthesized collection: an area across the 14N/15N boundary
becomes two regions whose mosaics hold exactly the ground of their part, in any areas format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pyogrio
import pytest
import rasterio
import shapely
from areas_collection import (
    AREA,
    YEAR,
    Collection,
    make_collection,
    write_geojson,
    write_geoparquet,
    write_gpkg,
)
from pyproj import CRS, Transformer
from rasterio.features import geometry_mask
from rasterio.windows import from_bounds

from emb.areas.plan import plan_areas
from emb.areas.vrt import write_mosaic
from emb.geo import WGS84, reproject, zone_box

ZONES = {"14N": 32614, "15N": 32615}


def collections(c: Collection, cdl: str = "tiles") -> dict:
    path = (
        str(c.cdl_tiles.parent / "{year}")
        if cdl == "tiles"
        else str(c.cdl_one).replace(str(YEAR), "{year}")
    )
    return {
        "aef": {"folder": str(c.aef), "index": str(c.aef_index)},
        "tessera": {"folder": str(c.tessera), "registry": str(c.tessera_registry)},
        "cdl": {"path": path},
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Collection, Path]:
    """The collection and a working directory with every VRT of its plan written."""
    c = make_collection(tmp_path_factory.mktemp("collection"))
    work = tmp_path_factory.mktemp("work")
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for region in plan_areas(c.areas, collections(c)).regions:
            for mosaic in region.mosaics.values():
                write_mosaic(mosaic)
    finally:
        os.chdir(cwd)
    return c, work


def test_an_area_across_a_zone_boundary_is_one_region_per_zone(built) -> None:
    c, _ = built
    plan = plan_areas(c.areas, collections(c))
    rows = plan.rows()
    assert list(rows.index) == ["field_trial_14n", "field_trial_15n"]
    assert set(rows["year"]) == {str(YEAR)} and set(rows["split"]) == {"auto"}
    for region in plan.regions:
        aef = region.mosaics["aef"]
        assert {t.crs for t in aef.tiles} == {f"EPSG:{ZONES[region.zone]}"}
        assert all(t.path.parent.name == region.zone for t in aef.tiles)
        assert len(aef.tiles) == 6  # of the zone's 3 x 3: the area's part meets two columns
        (tessera,) = region.mosaics["tessera"].tiles
        assert tessera.path.name == (
            "grid_-96.05_42.05_2024.tiff" if region.zone == "14N" else "grid_-95.95_42.05_2024.tiff"
        )


@pytest.mark.parametrize("zone", ZONES)
def test_each_zone_mosaic_is_its_ground_masked_to_its_part(built, zone: str) -> None:
    """Bottom-up tiles come out north up and equal the zone's ground as one raster; pixels
    whose centre is outside the part (an independent rasterization) are nodata."""
    c, work = built
    with rasterio.open(work / f"resources/areas/field_trial_{zone.lower()}/aef.vrt") as vrt:
        assert vrt.transform.e < 0 and vrt.dtypes[0] == "int8" and vrt.nodata == -128
        got, transform, bounds = vrt.read(), vrt.transform, vrt.bounds
    part = reproject(
        shapely.box(*AREA).intersection(zone_box(zone)),
        WGS84,
        CRS.from_epsg(ZONES[zone]),
        step=0.001,
    )
    inside = ~geometry_mask([part], out_shape=got.shape[1:], transform=transform)
    with rasterio.open(c.truth[zone]) as truth:
        ground = truth.read(window=from_bounds(*bounds, transform=truth.transform))
    assert np.array_equal(got, np.where(inside[None], ground, -128))
    assert inside.sum() > 15000
    planned = plan_areas(c.areas, collections(c)).pixels()  # what sizes jobs at parse time
    vrt = f"resources/areas/field_trial_{zone.lower()}/aef.vrt"
    assert abs(planned[vrt] - got.shape[1] * got.shape[2]) <= got.shape[1] + got.shape[2]


def _valid_centres(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with rasterio.open(path) as src:
        valid = src.read(1) != src.nodata
        epsg = src.crs.to_epsg()
        rows, cols = np.nonzero(valid)
        x, y = rasterio.transform.xy(src.transform, rows, cols)
    t = Transformer.from_crs(CRS.from_epsg(epsg), WGS84, always_xy=True)
    return t.transform(np.asarray(x), np.asarray(y))


def test_no_ground_pixel_is_in_two_regions(built) -> None:
    """Every valid pixel centre of 14n lies west of 96 W and every one of 15n east of it
    (half a pixel at most of ground at the seam belongs to the pixel across it)."""
    _, work = built
    lon14, _ = _valid_centres(work / "resources/areas/field_trial_14n/aef.vrt")
    lon15, _ = _valid_centres(work / "resources/areas/field_trial_15n/aef.vrt")
    assert lon14.max() < -96.0 < lon15.min()
    assert lon14.min() > AREA[0] and lon15.max() < AREA[2]
    assert lon14.max() > -96.0002 and lon15.min() < -95.9998  # the part reaches the seam


def ground_points(zone: str, margin: float = 0.0005) -> tuple[np.ndarray, np.ndarray]:
    """A 30 x 20 grid of (lon, lat) inside the zone's part of the area, ``margin`` degrees
    from its edges (so a pixel under each point has its centre inside the part too)."""
    w, s, e, n = shapely.box(*AREA).intersection(zone_box(zone)).bounds
    lon, lat = np.meshgrid(np.linspace(w + margin, e - margin, 30),
                           np.linspace(s + margin, n - margin, 20))  # fmt: skip
    return lon.ravel(), lat.ravel()


def values_at(path: Path, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """``(points, bands)``: the raster's pixels under each (lon, lat), found through the
    raster's own CRS and transform (points outside it: NaN)."""
    with rasterio.open(path) as src:
        x, y = Transformer.from_crs(WGS84, src.crs, always_xy=True).transform(lon, lat)
        rows, cols = rasterio.transform.rowcol(src.transform, x, y)
        rows, cols = np.asarray(rows), np.asarray(cols)
        inside = (rows >= 0) & (rows < src.height) & (cols >= 0) & (cols < src.width)
        data = src.read()
    out = np.full((len(lon), data.shape[0]), np.nan)
    out[inside] = data[:, rows[inside], cols[inside]].T
    return out


@pytest.mark.parametrize("zone", ZONES)
def test_tessera_and_cdl_mosaics_cover_the_part(built, zone: str) -> None:
    """At known ground points, the mosaic holds the very pixels of the source tile under
    them (each raster reached through its own transform): a misplaced tile fails."""
    c, work = built
    folder = work / f"resources/areas/field_trial_{zone.lower()}"
    with rasterio.open(folder / "tessera.vrt") as t, rasterio.open(folder / "aef.vrt") as a:
        assert t.crs == a.crs and t.count == 128 and t.dtypes[0] == "float32"
        assert np.isnan(t.nodata)
        tess, transform = t.read(1), t.transform
    part = reproject(
        shapely.box(*AREA).intersection(zone_box(zone)),
        WGS84,
        CRS.from_epsg(ZONES[zone]),
        step=0.001,
    )
    tess_valid = ~np.isnan(tess)
    assert np.array_equal(tess_valid, ~geometry_mask([part], tess.shape, transform))
    lon, lat = ground_points(zone)
    cell = "grid_-96.05_42.05" if zone == "14N" else "grid_-95.95_42.05"
    tile = c.tessera / str(YEAR) / cell / f"{cell}_{YEAR}.tiff"
    expected = values_at(tile, lon, lat)
    assert not np.isnan(expected).any() and (expected != 0).all()  # written pixels only
    assert np.array_equal(values_at(folder / "tessera.vrt", lon, lat), expected)
    # the CDL from its 2 x 2 tiles: each point's class is the one of the tile it falls in
    by_tile = [values_at(p, lon, lat) for p in sorted(c.cdl_tiles.glob("*.tif"))]
    expected = np.fmax.reduce(np.nan_to_num(by_tile, nan=-1), axis=0)  # one tile holds a point
    assert (expected > 0).all() and len(np.unique(expected)) > 1
    assert np.array_equal(values_at(folder / "cdl.vrt", lon, lat), expected)
    with rasterio.open(folder / "cdl.vrt") as v, rasterio.open(c.cdl_one) as one:
        got = v.read(1)
        expected = one.read(1, window=from_bounds(*v.bounds, transform=one.transform))
    assert np.array_equal(got, expected)


def test_every_areas_format_and_crs_plans_the_same(built, tmp_path: Path) -> None:
    c, _ = built
    reference = plan_areas(c.areas, collections(c)).rows()
    area = {"area": "field_trial", "year": YEAR, "split": "auto"}
    utm = reproject(shapely.box(*AREA), WGS84, CRS.from_epsg(32615), step=0.0005)
    mercator = reproject(shapely.box(*AREA), WGS84, CRS.from_epsg(3857), step=0.0005)
    write_gpkg(tmp_path / "a.gpkg", [{**area, "geometry": utm}], 32615, layer="fields")
    write_geoparquet(tmp_path / "a.parquet", [{**area, "geometry": utm}], 32615)
    write_geojson(tmp_path / "a.geojson", [{**area, "geometry": mercator}], "EPSG:3857")
    (tmp_path / "a.tsv").write_text(
        "area\tyear\tsplit\twest\tsouth\teast\tnorth\n"
        f"field_trial\t{YEAR}\tauto\t{AREA[0]}\t{AREA[1]}\t{AREA[2]}\t{AREA[3]}\n"
    )
    write_geojson(tmp_path / "b.geojson", [{**area, "geometry": utm}])  # the 2008 EPSG member
    doc = json.loads((tmp_path / "b.geojson").read_text())
    doc["crs"] = {"type": "EPSG", "properties": {"code": 32615}}
    (tmp_path / "b.geojson").write_text(json.dumps(doc))
    for name in ("a.gpkg", "a.parquet", "a.geojson", "a.tsv", "b.geojson"):
        plan = plan_areas(tmp_path / name, collections(c))
        assert plan.rows().equals(reference), name
        assert [len(r.mosaics["aef"].tiles) for r in plan.regions] == [6, 6], name


def test_the_index_as_a_geopackage_plans_the_same(built, tmp_path: Path) -> None:
    """The index as a GDAL-written GeoPackage (WGS84 footprints, the published columns) selects
    the tiles the GeoParquet does, and an attribute table beside it is not taken for it."""
    c, _ = built
    reference = plan_areas(c.areas, collections(c))
    table = pq.read_table(c.aef_index)
    wkb = table.column("geometry").to_numpy(zero_copy_only=False)
    table = table.drop(["geometry"])
    index = tmp_path / "aef_index.gpkg"
    pyogrio.raw.write(
        str(index), wkb, [table.column(n).to_numpy() for n in table.column_names],
        table.column_names, layer="aef_index", driver="GPKG", geometry_type="Polygon",
        crs="EPSG:4326",
    )  # fmt: skip
    notes = np.array(["an attribute table"], dtype=object)
    pyogrio.raw.write(str(index), None, [notes], ["note"], layer="a_notes", driver="GPKG")
    plan = plan_areas(
        c.areas, {**collections(c), "aef": {"folder": str(c.aef), "index": str(index)}}
    )
    assert plan.rows().equals(reference.rows())
    for region, expected in zip(plan.regions, reference.regions, strict=True):
        got = region.mosaics["aef"].tiles
        assert [t.path for t in got] == [t.path for t in expected.mosaics["aef"].tiles]
        assert [t.bounds for t in got] == [t.bounds for t in expected.mosaics["aef"].tiles]


def test_a_national_cdl_is_used_as_it_is(built) -> None:
    c, _ = built
    plan = plan_areas(c.areas, collections(c, cdl="national"))
    assert set(plan.rows()["cdl"]) == {str(c.cdl_one)}
    assert all("cdl" not in r.mosaics for r in plan.regions)
