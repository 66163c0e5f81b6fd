"""Districts read from GeoPackage, GeoJSON and GeoParquet, refused in one line when unusable, and
each map pixel given the district that holds its centre: checked against shapely on the pixel
centres (holes, a multipolygon, a district in another CRS, pixels in no district) on top-down
and bottom-up maps, by windows as by the whole map, with pixels counted per district."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyogrio.raw
import pytest
import rasterio
import shapely
from affine import Affine
from pyproj import CRS, Transformer
from rasterio.windows import Window

from emb.estimation import districts as districts_module
from emb.estimation import population
from emb.estimation.districts import (
    OUTSIDE,
    DistrictsError,
    MapDistricts,
    district_counts,
    district_ids,
    district_strips,
    on_map,
    read_districts,
)

MAP_CRS = CRS.from_epsg(32615)
HEIGHT, WIDTH = 90, 120  # pixels of 10 m
WEST, NORTH = 400_003.0, 4_500_007.0  # edges that no polygon vertex lines up with


def map_transform(bottom_up: bool) -> Affine:
    if bottom_up:  # like the AEF COGs: row 0 is the south edge
        return Affine(10.0, 0.0, WEST, 0.0, 10.0, NORTH - HEIGHT * 10.0)
    return Affine(10.0, 0.0, WEST, 0.0, -10.0, NORTH)


def centres(transform: Affine, height: int = HEIGHT, width: int = WIDTH) -> tuple:
    cols, rows = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    return transform * (cols, rows)


def write_ogr(path: Path, names: list, geometries: list, crs: str | None, field: str = "name",
              driver: str = "GPKG") -> Path:  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "'crs' was not provided")  # no CRS: a case tested
        pyogrio.raw.write(
            str(path), shapely.to_wkb(geometries) if geometries else np.array([], object),
            [np.array(names, object)], [field], driver=driver, crs=crs,
            geometry_type="Unknown", layer="districts",
        )  # fmt: skip
    return path


def write_parquet(path: Path, names: list, geometries: list, crs: object = "absent") -> Path:
    column = {"encoding": "WKB", "geometry_types": []}
    if crs != "absent":
        column["crs"] = crs
    geo = {"version": "1.0.0", "primary_column": "geometry", "columns": {"geometry": column}}
    table = pa.table({"name": names, "geometry": list(shapely.to_wkb(geometries))})
    pq.write_table(table.replace_schema_metadata({"geo": json.dumps(geo)}), path)
    return path


# In map metres: a field with a hole (a farmstead), a district of two parts, a slanted one.
HOLED = shapely.Polygon(
    [(400_020.4, 4_499_130.3), (400_480.7, 4_499_110.9), (400_500.2, 4_499_660.1),
     (400_030.6, 4_499_700.8)],
    [[(400_150.3, 4_499_300.2), (400_300.1, 4_499_290.7), (400_310.9, 4_499_450.4),
      (400_160.8, 4_499_460.6)]],
)  # fmt: skip
TWO_PARTS = shapely.MultiPolygon([
    shapely.Polygon([(400_520.2, 4_499_400.4), (400_900.6, 4_499_380.1), (400_880.3,
                     4_499_690.7), (400_530.8, 4_499_700.3)]),
    shapely.Polygon([(400_950.1, 4_499_150.7), (401_150.4, 4_499_160.2), (401_140.9,
                     4_499_330.6)]),
])  # fmt: skip
SLANTED = shapely.Polygon([(400_600.3, 4_499_350.1), (400_930.7, 4_499_140.2),
                           (400_560.6, 4_499_120.4)])  # fmt: skip
# In degrees: a box over the map's north-east corner (reaching beyond the map).
LON, LAT = Transformer.from_crs(MAP_CRS, 4326, always_xy=True).transform(400_850.0, 4_499_850.0)
IN_DEGREES = shapely.box(LON, LAT, LON + 0.01, LAT + 0.01)


@pytest.fixture
def utm_file(tmp_path: Path) -> Path:
    return write_ogr(tmp_path / "d.gpkg", ["holed", "two_parts", "slanted"],
                     [HOLED, TWO_PARTS, SLANTED], "EPSG:32615")  # fmt: skip


@pytest.fixture
def degrees_file(tmp_path: Path) -> Path:
    return write_ogr(tmp_path / "d.geojson", ["north_east"], [IN_DEGREES], "EPSG:4326",
                     driver="GeoJSON")  # fmt: skip


def expected_ids(transform: Affine, polygons: list, crs: CRS = MAP_CRS) -> np.ndarray:
    """The independent answer: shapely.contains_xy on each centre, the centres moved into the
    polygons' CRS by pyproj; the first polygon holding a centre gives its id."""
    x, y = centres(transform)
    if crs != MAP_CRS:
        x, y = Transformer.from_crs(MAP_CRS, crs, always_xy=True).transform(x, y)
    ids = np.zeros(x.shape, np.uint16)
    for i, polygon in reversed(list(enumerate(polygons, start=1))):
        ids[shapely.contains_xy(polygon, x, y)] = i
    return ids


@pytest.mark.parametrize("bottom_up", [False, True])
def test_ids_by_pixel_centre_match_shapely(utm_file: Path, bottom_up: bool) -> None:
    transform = map_transform(bottom_up)
    districts = read_districts(utm_file, "name")
    assert districts.names == ("holed", "two_parts", "slanted")
    ids = district_ids(on_map(districts, MAP_CRS), transform, Window(0, 0, WIDTH, HEIGHT))
    expected = expected_ids(transform, [HOLED, TWO_PARTS, SLANTED])
    assert ids.dtype == np.uint16
    np.testing.assert_array_equal(ids, expected)
    counts = np.bincount(ids.ravel(), minlength=4)
    assert (counts > 0).all(), f"every district and the outside hold pixels: {counts}"
    x, y = centres(transform)
    in_hole = shapely.contains_xy(shapely.Polygon(HOLED.interiors[0]), x, y)
    assert in_hole.any() and not (ids[in_hole] == 1).any()  # the hole is no part of "holed"
    for part in TWO_PARTS.geoms:  # both parts of the multipolygon are district 2
        inside = shapely.contains_xy(part, x, y)
        assert inside.any() and (ids[inside] == 2).all()


@pytest.mark.parametrize("bottom_up", [False, True])
def test_a_district_in_another_crs_is_reprojected(degrees_file: Path, bottom_up: bool) -> None:
    transform = map_transform(bottom_up)
    districts = read_districts(degrees_file, "name")
    assert districts.crs.is_geographic
    ids = district_ids(on_map(districts, "EPSG:32615"), transform, Window(0, 0, WIDTH, HEIGHT))
    expected = expected_ids(transform, [IN_DEGREES], CRS.from_epsg(4326))
    differ = ids != expected
    # The moved polygon's edges are chords of the true curves at most ~1 km long: they may
    # part from them by millimetres, so only a centre that close to an edge may differ.
    x, y = centres(transform)
    lon, lat = Transformer.from_crs(MAP_CRS, 4326, always_xy=True).transform(x[differ], y[differ])
    near_edge = shapely.distance(IN_DEGREES.boundary, shapely.points(lon, lat)) < 1e-7  # ~1 cm
    assert near_edge.all(), f"{int(differ.sum())} pixels differ away from the edges"
    assert 0 < (ids == 1).sum() < ids.size  # it covers a corner; the rest is outside


@pytest.mark.parametrize("bottom_up", [False, True])
def test_windows_and_strips_agree_with_the_whole_map(
    utm_file: Path, bottom_up: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transform = map_transform(bottom_up)
    shapes = on_map(read_districts(utm_file, "name"), MAP_CRS)
    whole = district_ids(shapes, transform, Window(0, 0, WIDTH, HEIGHT))
    for row in range(0, HEIGHT, 7):  # odd windows, columns offset too
        for col in (0, 37, 101):
            win = Window(col, row, min(41, WIDTH - col), min(7, HEIGHT - row))
            part = district_ids(shapes, transform, win)
            np.testing.assert_array_equal(part, whole[row : row + 7, col : col + 41])
    path = write_map(tmp_path / "m.tif", np.zeros((HEIGHT, WIDTH), np.uint8), transform, 8)
    monkeypatch.setattr(population, "STRIP_BYTES", WIDTH * 8)  # strips of 8 rows, not one
    with rasterio.open(path) as src:
        pieces = list(district_strips(src, shapes))
    assert len(pieces) > 1
    np.testing.assert_array_equal(np.concatenate([ids for _, ids in pieces]), whole)


def write_map(path: Path, values: np.ndarray, transform: Affine, block: int = 16) -> Path:
    profile = {"driver": "GTiff", "height": values.shape[0], "width": values.shape[1],
               "count": 1, "dtype": "uint8", "crs": "EPSG:32615", "nodata": 255,
               "tiled": False, "blockysize": block, "transform": transform}  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(values, 1)
    return path


def test_pixels_counted_per_district_and_class(utm_file: Path, tmp_path: Path) -> None:
    transform = map_transform(True)
    values = np.random.default_rng(3).integers(0, 61, (HEIGHT, WIDTH), dtype=np.uint8)
    values[:5] = 255
    path = write_map(tmp_path / "m.tif", values, transform, 8)
    districts = read_districts(utm_file, "name")
    counts = district_counts(path, districts)
    ids = expected_ids(transform, [HOLED, TWO_PARTS, SLANTED])
    assert counts.shape == (4, 256)
    for i in range(4):
        np.testing.assert_array_equal(counts[i], np.bincount(values[ids == i], minlength=256))
    assert counts.sum() == values.size  # no pixel dropped: the outside is row 0
    assert districts.names_by_id()[0] == OUTSIDE


@pytest.mark.parametrize("bottom_up", [False, True])
def test_a_centre_on_a_shared_edge_goes_to_one_district(tmp_path: Path, bottom_up: bool) -> None:
    """Tiles whose edges run through pixel centres (GDAL's tie rule decides those centres):
    no centre inside their union is left in no district."""
    transform = map_transform(bottom_up)
    x, y = centres(transform)
    x0, y0 = float(x[0, 0]), float(y[:, 0].min())  # a pixel centre
    tiles = [shapely.box(x0 + 100 * i, y0 + 100 * j, x0 + 100 * (i + 1), y0 + 100 * (j + 1))
             for i in range(4) for j in range(3)]  # fmt: skip
    tiles.append(shapely.Polygon([(x0 + 400, y0), (x0 + 900, y0), (x0 + 400, y0 + 300)]))
    path = write_ogr(tmp_path / "t.gpkg", [f"t{i}" for i in range(len(tiles))], tiles,
                     "EPSG:32615")  # fmt: skip
    ids = district_ids(on_map(read_districts(path, "name"), MAP_CRS), transform,
                       Window(0, 0, WIDTH, HEIGHT))  # fmt: skip
    inside = shapely.contains_xy(shapely.union_all(tiles), x, y)
    on_shared_edges = shapely.intersects_xy(shapely.union_all([t.boundary for t in tiles]), x, y)
    assert (inside & on_shared_edges).sum() > 50  # the tie rule is what this test is about
    assert (ids[inside] > 0).all(), "a centre inside the districts' union got no district"
    assert (ids[~shapely.intersects_xy(shapely.union_all(tiles), x, y)] == 0).all()


def test_a_sliver_overlap_goes_to_the_first_district(tmp_path: Path) -> None:
    transform = map_transform(False)
    x, _ = centres(transform)
    edge = float(x[0, 50])  # a column of centres lies in both districts' sliver
    south, north = NORTH - HEIGHT * 10.0, NORTH
    west = shapely.box(WEST, south, edge + 1e-6, north)
    east = shapely.box(edge - 1e-6, south, WEST + WIDTH * 10.0, north)
    for n, order in enumerate(([west, east], [east, west])):
        path = write_ogr(tmp_path / f"s{n}.gpkg", ["a", "b"], order, "EPSG:32615")
        ids = district_ids(on_map(read_districts(path, "name"), MAP_CRS), transform,
                           Window(0, 0, WIDTH, HEIGHT))  # fmt: skip
        assert (ids[:, 50] == 1).all()  # the first in the file, whichever side it lies
        assert (ids > 0).all()


def test_a_window_one_district_covers_is_filled_unless_another_reaches_into_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A district over the whole map and, first in the file (it wins), a small one inside it
    (MapDistricts built by hand: no overlap check): a window far from the small one is filled
    without a cut or a burn; a window the small one reaches into is burned, its centres the
    small one's (shapely on the centres says which)."""
    transform = map_transform(False)
    small = shapely.box(WEST + 300.0, NORTH - 400.0, WEST + 430.0, NORTH - 250.0)
    big = shapely.box(WEST - 100.0, NORTH - HEIGHT * 10.0 - 100.0, WEST + WIDTH * 10.0 + 100.0,
                      NORTH + 100.0)  # fmt: skip
    shapes = MapDistricts(MAP_CRS, (small, big), np.array([small.bounds, big.bounds]))
    want = expected_ids(transform, [small, big])
    burn, cut = districts_module.rasterize, districts_module._cut
    monkeypatch.setattr(districts_module, "rasterize", None)  # a burn or a cut would fail
    monkeypatch.setattr(districts_module, "_cut", None)
    far = Window(60, 50, 40, 30)
    assert (district_ids(shapes, transform, far) == 2).all()
    monkeypatch.setattr(districts_module, "rasterize", burn)
    monkeypatch.setattr(districts_module, "_cut", cut)
    near = Window(20, 10, 40, 40)
    got = district_ids(shapes, transform, near)
    rows, cols = near.toslices()
    assert (got == 1).sum() > 100
    np.testing.assert_array_equal(got, want[rows, cols])


def test_the_formats_read_alike(tmp_path: Path) -> None:
    polygons = [HOLED, TWO_PARTS]
    files = [
        write_ogr(tmp_path / "d.gpkg", ["a", "b"], polygons, "EPSG:32615"),
        write_ogr(tmp_path / "d.geojson", ["a", "b"], polygons, "EPSG:32615", driver="GeoJSON"),
        write_parquet(tmp_path / "d.parquet", ["a", "b"], polygons, CRS(32615).to_json_dict()),
    ]
    for path in files:
        districts = read_districts(path, "name")
        assert districts.names == ("a", "b"), path
        assert districts.crs == CRS.from_epsg(32615), path
        for got, want in zip(districts.geometries, polygons, strict=True):
            assert got.normalize().equals_exact(want.normalize(), 1e-6), path
    parquet_default = write_parquet(tmp_path / "e.parquet", ["a"], [IN_DEGREES])
    assert read_districts(parquet_default, "name").crs.is_geographic  # GeoParquet's CRS84


BOWTIE = shapely.Polygon([(0, 0), (10, 10), (10, 0), (0, 10)])


@pytest.mark.parametrize(
    ("make", "field", "expected"),
    [
        (lambda p: p / "none.gpkg", "name", "districts file not found"),
        (lambda p: (p / "d.csv").write_text("x") and p / "d.csv", "name", "unknown format"),
        (
            lambda p: write_ogr(p / "d.gpkg", ["a"], [HOLED], "EPSG:32615"),
            "district",
            "no field 'district' to name the districts: found fields ['name']",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", ["a", "a"], [HOLED, TWO_PARTS], "EPSG:32615"),
            "name",
            "district 'a' named twice (features 1 and 2)",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", ["a", " "], [HOLED, TWO_PARTS], "EPSG:32615"),
            "name",
            "feature 2: field 'name': expected a district name, found ' '",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", ["a", None], [HOLED, TWO_PARTS], "EPSG:32615"),
            "name",
            "feature 2: field 'name': expected a district name, found None",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", ["Outside"], [HOLED], "EPSG:32615"),
            "name",
            "names the pixels in no district",
        ),
        (
            lambda p: write_ogr(
                p / "d.gpkg", ["a", "b"], [HOLED, shapely.Point(1, 2)], "EPSG:32615"
            ),
            "name",
            "district 'b': expected a Polygon or MultiPolygon, found a Point",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", ["a"], [HOLED.exterior], "EPSG:32615"),
            "name",
            "found a LineString",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", ["a"], [BOWTIE], "EPSG:32615"),
            "name",
            "district 'a': an invalid polygon: Self-intersection",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", ["a"], [HOLED], None),
            "name",
            "no CRS declared: expected one",
        ),
        (
            lambda p: write_parquet(p / "d.parquet", ["a"], [HOLED], None),
            "name",
            "column 'geometry': no CRS declared",
        ),
        (
            lambda p: write_ogr(p / "d.gpkg", [], [], "EPSG:32615"),
            "name",
            "layer 'districts': no feature: expected at least one district",
        ),
        (
            lambda p: write_ogr(
                p / "d.gpkg", ["a", "b"], [HOLED, SLANTED.union(HOLED)], "EPSG:32615"
            ),
            "name",
            "districts 'a' and 'b' overlap",
        ),
    ],
)
def test_unusable_districts_are_refused(tmp_path: Path, make, field: str, expected: str) -> None:
    path = make(tmp_path)
    with pytest.raises(DistrictsError, match="^" + str(path).replace(".", r"\.")) as err:
        read_districts(path, field)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_a_geopackage_of_several_layers_needs_one_named(tmp_path: Path) -> None:
    path = write_ogr(tmp_path / "d.gpkg", ["a"], [HOLED], "EPSG:32615")
    pyogrio.raw.write(str(path), shapely.to_wkb([TWO_PARTS]), [np.array(["b"], object)],
                      ["name"], driver="GPKG", crs="EPSG:32615", layer="counties",
                      geometry_type="MultiPolygon", append=True)  # fmt: skip
    with pytest.raises(DistrictsError, match="expected one feature layer"):
        read_districts(path, "name")
    assert read_districts(path, "name", layer="counties").names == ("b",)
