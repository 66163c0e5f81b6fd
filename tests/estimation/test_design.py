"""A class map read as strata and a stratified random sample drawn from it (Olofsson et al.
2014, section 5.1): counts streamed by strips equal a whole-array count; the allocation sums
to n, meets the minimum and stays within each stratum; the same seed draws the same points,
never on nodata, each in the stratum it names, whatever the strips; and the CSV, GeoPackage
and JSON record come out complete and readable."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyogrio
import pyogrio.raw
import pytest
import rasterio
import shapely
from rasterio.transform import from_origin
from rasterio.windows import Window

from emb.classes import ClassMap
from emb.estimation import design as design_module
from emb.estimation import population
from emb.estimation.design import Design, SampleDesignError, allocate, draw_points
from emb.estimation.population import (
    MapCrsError,
    MapFileError,
    count_classes,
    pixel_hectares,
)
from emb.estimation.sample_files import SamplePaths, write_sample
from emb.estimation.sample_record import COLUMNS
from emb.provenance import digest_file

NODATA = 255


def write_map(
    path: Path,
    ids: np.ndarray,
    epsg: int | None = 32615,
    origin: tuple[float, float] = (400_000.0, 4_500_000.0),
    pixel: float = 10.0,
    block: int = 64,
    count: int = 1,
) -> Path:
    """A tiled uint8 class map (L3 ids, 255 = nodata) of ``ids`` (H, W): the last blocks are
    ragged unless H and W are multiples of ``block``."""
    height, width = ids.shape
    profile = {
        "driver": "GTiff", "height": height, "width": width, "count": count, "dtype": "uint8",
        "crs": f"EPSG:{epsg}" if epsg else None, "nodata": NODATA, "tiled": True,
        "blockxsize": block, "blockysize": block, "compress": "deflate",
        "transform": from_origin(*origin, pixel, pixel),
    }  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        for band in range(1, count + 1):
            dst.write(ids, band)
    return path


def random_map(shape: tuple[int, int], seed: int, nodata_share: float = 0.25) -> np.ndarray:
    """L3 ids 0..60 at random, a top-left block of nodata holding ``nodata_share`` of it."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 61, size=shape, dtype=np.uint8)
    rows, cols = int(shape[0] * nodata_share**0.5), int(shape[1] * nodata_share**0.5)
    ids[:rows, :cols] = NODATA
    return ids


@pytest.fixture
def thin_strips(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strips of 50 rows (thinner than a 64 px block row) and bincounts of 1,000 pixels, so a
    small map is streamed in many strips and chunks, as a large one is."""
    monkeypatch.setattr(population, "STRIP_BYTES", 50 * 200)
    monkeypatch.setattr(population, "CHUNK", 1_000)


# --- counting -------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("strip_rows", [50, 128])
def test_counts_by_strips_equal_a_whole_array_bincount(
    tmp_path: Path,
    class_map: ClassMap,
    monkeypatch: pytest.MonkeyPatch,
    level: int,
    strip_rows: int,
) -> None:
    """300 x 200 px with 64 px blocks (ragged last blocks), strips of 50 rows (inside a block
    row) or 128 (two block rows), bincount chunks of 1,000 pixels."""
    ids = random_map((300, 200), seed=1)
    path = write_map(tmp_path / "r.tif", ids)
    monkeypatch.setattr(population, "STRIP_BYTES", strip_rows * 200)
    monkeypatch.setattr(population, "CHUNK", 1_000)
    table = {1: class_map.l3_to_l1, 2: class_map.l3_to_l2, 3: np.arange(256)}[level]
    n_classes = {1: 2, 2: 7, 3: 61}[level]
    valid = ids[ids != NODATA]
    expected = np.bincount(table[valid], minlength=n_classes)
    assert count_classes(path, level, class_map).tolist() == expected.tolist()


def test_counts_inside_a_window_only(
    tmp_path: Path, class_map: ClassMap, thin_strips: None
) -> None:
    ids = random_map((300, 200), seed=2)
    path = write_map(tmp_path / "r.tif", ids)
    part = ids[70:250, 30:190]
    expected = np.bincount(part[part != NODATA], minlength=61)
    found = count_classes(path, 3, class_map, mask_window=Window(30, 70, 160, 180))
    assert found.tolist() == expected.tolist()


def test_a_value_that_is_no_class_is_refused_naming_file_and_value(
    tmp_path: Path, class_map: ClassMap
) -> None:
    ids = random_map((64, 64), seed=3)
    ids[5, 5] = 100
    path = write_map(tmp_path / "odd.tif", ids)
    with pytest.raises(MapFileError, match=r"odd\.tif: values \[100\] are neither"):
        count_classes(path, 2, class_map)


def test_a_probability_file_is_no_class_map(tmp_path: Path, class_map: ClassMap) -> None:
    path = write_map(tmp_path / "r_probabilities.tif", random_map((64, 64), 4), count=3)
    with pytest.raises(MapFileError, match=r"r_probabilities\.tif: not a class map.*found 3 band"):
        count_classes(path, 3, class_map)


def test_pixel_area_from_the_transform(tmp_path: Path) -> None:
    assert pixel_hectares(write_map(tmp_path / "a.tif", random_map((8, 8), 5))) == 0.01
    path = write_map(tmp_path / "b.tif", random_map((8, 8), 5), pixel=30.0)
    assert pixel_hectares(path) == pytest.approx(0.09)


@pytest.mark.parametrize(("epsg", "found"), [(4326, "EPSG:4326"), (None, "no CRS")])
def test_a_map_without_a_projected_crs_has_no_pixel_area(
    tmp_path: Path, epsg: int | None, found: str
) -> None:
    path = write_map(tmp_path / "geo.tif", random_map((8, 8), 6), epsg=epsg, pixel=0.0001,
                     origin=(-93.0, 42.0))  # fmt: skip
    with pytest.raises(MapCrsError, match=rf"geo\.tif: .*{found}") as err:
        pixel_hectares(path)
    assert "\n" not in str(err.value)


# --- allocation -----------------------------------------------------------------------------


def test_allocation_gives_the_minimum_then_the_rest_by_area() -> None:
    """Worked by hand: minimums [5, 5, 5, 0, 5] (a stratum of 5 px is full), the rest 30 by
    area over 1000:300:100 -> 21.43, 6.43, 2.14 -> floors 21, 6, 2, and the one left over to
    the tie of remainders' larger stratum."""
    found = allocate(np.array([1000, 300, 100, 0, 5]), 50, 5)
    assert found.tolist() == [27, 11, 7, 0, 5]


def test_allocation_is_capped_by_a_strata_size() -> None:
    """[100, 8] px, n 100, minimum 2: by area the small stratum would get 2 + 7 > 8, so it
    takes its 8 and the large one the rest."""
    assert allocate(np.array([100, 8]), 100, 2).tolist() == [92, 8]


def test_allocation_of_n_beyond_the_pixels_takes_every_pixel() -> None:
    assert allocate(np.array([4, 0, 7]), 50, 3).tolist() == [4, 0, 7]


def test_allocation_sums_to_n_and_keeps_minimum_and_sizes_on_random_strata() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        sizes = rng.integers(0, 5000, size=rng.integers(1, 20)) * (rng.random() < 0.9)
        sizes[rng.random(sizes.size) < 0.3] = rng.integers(0, 4)
        if sizes.sum() == 0:
            continue
        minimum = int(rng.integers(0, 6))
        need = int(np.minimum(sizes, minimum).sum())
        n = int(rng.integers(max(1, need), max(2, need) + 3000))
        found = allocate(sizes, n, minimum)
        assert found.sum() == min(n, sizes.sum())
        assert (found >= np.minimum(sizes, minimum)).all()
        assert (found <= sizes).all()


@pytest.mark.parametrize(
    ("n", "minimum", "message"),
    [
        (0, 5, r"sample size n must be an integer >= 1, found 0"),
        (10, -1, r"min_per_class must be an integer >= 0, found -1"),
        (14, 5, r"n = 14 is below the 15 units .* n = 15 or more would do"),
    ],
)
def test_allocation_refuses_what_it_cannot_do(n: int, minimum: int, message: str) -> None:
    with pytest.raises(SampleDesignError, match=message):
        allocate(np.array([100, 50, 0, 9]), n, minimum)


# --- drawing --------------------------------------------------------------------------------


def two_maps(folder: Path) -> list[Path]:
    """Region a in UTM 15N, region b in UTM 16N, both with nodata corners and ragged blocks."""
    a = write_map(folder / "a.tif", random_map((150, 130), seed=10))
    b = write_map(folder / "b.tif", random_map((90, 110), seed=11), epsg=32616,
                  origin=(300_000.0, 4_400_000.0))  # fmt: skip
    return [a, b]


def points_of(design: Design) -> list[tuple]:
    p = design.points
    return list(zip(p.region.tolist(), p.x.tolist(), p.y.tolist(), strict=True))


def test_the_same_seed_draws_the_same_points(tmp_path: Path, class_map: ClassMap) -> None:
    maps = two_maps(tmp_path)
    first = draw_points(maps, 2, class_map, n=60, min_per_class=4, seed=7)
    again = draw_points(maps, 2, class_map, n=60, min_per_class=4, seed=7)
    other = draw_points(maps, 2, class_map, n=60, min_per_class=4, seed=8)
    assert points_of(first) == points_of(again)
    assert first.map_class.tolist() == again.map_class.tolist()
    assert len(set(points_of(first)) & set(points_of(other))) < 10


def test_the_points_do_not_depend_on_the_strips(
    tmp_path: Path, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan order is each map's row-major order, whatever strips and chunks read it."""
    maps = two_maps(tmp_path)
    whole = draw_points(maps, 3, class_map, n=80, min_per_class=1, seed=3)
    monkeypatch.setattr(population, "STRIP_BYTES", 50 * 200)
    monkeypatch.setattr(population, "CHUNK", 777)
    assert points_of(draw_points(maps, 3, class_map, n=80, min_per_class=1, seed=3)) == (
        points_of(whole)
    )


def test_points_lie_in_their_stratum_never_on_nodata(
    tmp_path: Path, class_map: ClassMap, thin_strips: None
) -> None:
    """A map 80% nodata; every point, read back at its coordinates, is of its map_class."""
    ids = random_map((200, 200), seed=12, nodata_share=0.8)
    path = write_map(tmp_path / "sparse.tif", ids)
    design = draw_points([path], 2, class_map, n=100, min_per_class=5, seed=1)
    with rasterio.open(path) as src:
        xy = zip(design.points.x, design.points.y, strict=True)
        values = np.array([v[0] for v in src.sample(xy)])
    assert (values != NODATA).all()
    assert class_map.l3_to_l2[values].tolist() == design.map_class.tolist()
    per_stratum = np.bincount(design.map_class, minlength=7)
    assert per_stratum.tolist() == design.record.allocation.tolist()
    assert len(set(points_of(design))) == 100  # without replacement


def test_a_stratum_taken_whole_gives_exactly_its_pixels(
    tmp_path: Path, class_map: ClassMap, thin_strips: None
) -> None:
    """Three pixels of soybeans (L3 1) in a map of corn: the minimum 3 takes exactly them."""
    ids = np.zeros((120, 200), np.uint8)
    spots = [(3, 190), (64, 0), (119, 77)]
    for row, col in spots:
        ids[row, col] = 1
    path = write_map(tmp_path / "r.tif", ids)
    design = draw_points([path], 3, class_map, n=10, min_per_class=3, seed=0)
    soy = design.map_class == 1
    with rasterio.open(path) as src:
        xy = zip(design.points.x[soy], design.points.y[soy], strict=True)
        found = [src.index(x, y) for x, y in xy]
    assert sorted(found) == spots


def test_lon_lat_of_a_known_utm_point(tmp_path: Path, class_map: ClassMap) -> None:
    """UTM 15N's central meridian is 93 W and its false northing 0 the equator: the one
    mapped pixel, centred on (500000, 5), lies at lon -93 and 5 m north of the equator (on
    the central meridian, scaled by k0 = 0.9996; a degree of latitude there is 110,574 m)."""
    ids = np.full((4, 4), NODATA, np.uint8)
    ids[0, 0] = 0
    path = write_map(tmp_path / "eq.tif", ids, origin=(499_995.0, 10.0))
    design = draw_points([path], 1, class_map, n=5, min_per_class=1, seed=0)
    assert (design.points.x[0], design.points.y[0]) == (500_000.0, 5.0)
    assert design.lon[0] == pytest.approx(-93.0, abs=1e-9)
    assert design.lat[0] == pytest.approx(5.0 / (0.9996 * 110_574.3), rel=1e-5)
    assert design.points.crs[0] == "EPSG:32615"


def test_several_maps_in_several_crss(tmp_path: Path, class_map: ClassMap) -> None:
    maps = two_maps(tmp_path)
    design = draw_points(maps, 1, class_map, n=40, min_per_class=2, seed=5)
    p = design.points
    assert p.ids.tolist() == list(range(1, 41))
    assert set(p.crs[p.region == "a"]) == {"EPSG:32615"}
    assert set(p.crs[p.region == "b"]) == {"EPSG:32616"}
    for path, zone_west in zip(maps, (-96.0, -90.0), strict=True):
        mine = p.region == path.stem
        with rasterio.open(path) as src:
            left, bottom, right, top = src.bounds
        assert ((p.x[mine] > left) & (p.x[mine] < right)).all()
        assert ((p.y[mine] > bottom) & (p.y[mine] < top)).all()
        assert ((design.lon[mine] > zone_west - 3) & (design.lon[mine] < zone_west + 9)).all()
    assert design.record.strata_px.sum() == sum(m.pixels for m in design.record.maps)


def test_maps_of_unequal_pixel_sizes_are_refused(tmp_path: Path, class_map: ClassMap) -> None:
    a = write_map(tmp_path / "a.tif", random_map((32, 32), 1))
    b = write_map(tmp_path / "b.tif", random_map((32, 32), 2), pixel=30.0)
    with pytest.raises(SampleDesignError, match=r"unequal pixel areas"):
        draw_points([a, b], 1, class_map, n=10, min_per_class=1, seed=0)


def test_two_maps_of_one_region_are_refused(tmp_path: Path, class_map: ClassMap) -> None:
    (tmp_path / "x").mkdir()
    a = write_map(tmp_path / "a.tif", random_map((32, 32), 1))
    b = write_map(tmp_path / "x" / "a.tif", random_map((32, 32), 2))
    with pytest.raises(SampleDesignError, match=r"regions named twice: \['a'\]"):
        draw_points([a, b], 1, class_map, n=10, min_per_class=1, seed=0)


def test_maps_without_a_mapped_pixel_are_named_with_their_regions(
    tmp_path: Path, class_map: ClassMap, caplog: pytest.LogCaptureFixture
) -> None:
    """All nodata (predict on an embedding without data): the regions and files, not only
    "every stratum is empty"; one such region beside others is warned of."""
    a = write_map(tmp_path / "a.tif", np.full((32, 32), NODATA, np.uint8))
    b = write_map(tmp_path / "b.tif", np.full((32, 32), NODATA, np.uint8))
    with pytest.raises(SampleDesignError) as err:
        draw_points([a, b], 1, class_map, n=10, min_per_class=1, seed=0)
    assert str(err.value).startswith(
        f"no mapped pixels in the maps of regions ['a', 'b'] ({a}, {b}): every pixel is nodata "
        "(predict mapped an all-nodata raster"
    )
    c = write_map(tmp_path / "c.tif", random_map((32, 32), 1))
    with caplog.at_level("WARNING", logger="emb.estimation.design"):
        design = draw_points([a, c], 1, class_map, n=10, min_per_class=1, seed=0)
    assert set(design.points.region) == {"c"}
    assert f"region a: map {a} has no mapped pixel" in caplog.text


# --- the files ------------------------------------------------------------------------------


def test_csv_geopackage_and_record_are_written_and_readable(
    tmp_path: Path, class_map: ClassMap
) -> None:
    maps = two_maps(tmp_path)
    design = draw_points(maps, 2, class_map, n=30, min_per_class=2, seed=9)
    paths = write_sample(design, tmp_path / "design")
    with open(paths.csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == COLUMNS
    assert [int(r["id"]) for r in rows] == design.points.ids.tolist()
    assert [float(r["x"]) for r in rows] == design.points.x.tolist()
    assert [r["map_name"] for r in rows] == [class_map.l2_names[k] for k in design.map_class]
    assert {r["reference"] for r in rows} == {""}

    info = pyogrio.read_info(paths.gpkg, layer="sample")
    assert info["features"] == 30 and info["geometry_type"] == "Point"
    assert info["crs"] == "EPSG:4326"
    meta, _, geometry, fields = pyogrio.raw.read(paths.gpkg, layer="sample")
    assert list(meta["fields"]) == list(COLUMNS)
    xy = shapely.get_coordinates(shapely.from_wkb(geometry))
    assert np.allclose(xy[:, 0], design.lon) and np.allclose(xy[:, 1], design.lat)
    assert fields[list(meta["fields"]).index("map_class")].tolist() == design.map_class.tolist()

    record = json.loads(paths.record.read_text())
    assert [m["sha256"] for m in record["maps"]] == [digest_file(m) for m in maps]
    assert [s["pixels"] for s in record["strata"]] == design.record.strata_px.tolist()
    assert [s["allocated"] for s in record["strata"]] == design.record.allocation.tolist()
    assert (record["level"], record["seed"], record["n"], record["min_per_class"]) == (2, 9, 30, 2)
    assert record["pixel_ha"] == 0.01 and record["total_pixels"] == int(
        design.record.strata_px.sum()
    )
    assert record["class_names"] == list(class_map.l2_names)


def test_a_failed_write_leaves_none_of_the_three_files(tmp_path: Path, class_map: ClassMap) -> None:
    """The record's folder is a file: nothing new is written, an earlier design's file is
    left as it was (a good output is never deleted)."""
    design = draw_points(two_maps(tmp_path), 1, class_map, n=10, min_per_class=1, seed=0)
    (tmp_path / "out").mkdir()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    paths = SamplePaths(tmp_path / "out" / "s.csv", tmp_path / "out" / "s.gpkg",
                        blocker / "s.json")  # fmt: skip
    paths.csv.write_text("an earlier design's\n")
    with pytest.raises(OSError):
        write_sample(design, paths)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s.csv"]
    assert paths.csv.read_text() == "an earlier design's\n"


def test_a_failed_rename_takes_back_the_files_renamed_before_it(
    tmp_path: Path, class_map: ClassMap
) -> None:
    """A folder where the CSV should go: the record and the GeoPackage, renamed into place
    before the CSV's rename fails, are removed again."""
    design = draw_points(two_maps(tmp_path), 1, class_map, n=10, min_per_class=1, seed=0)
    paths = SamplePaths.in_folder(tmp_path / "out")
    paths.csv.mkdir(parents=True)
    with pytest.raises(OSError):
        write_sample(design, paths)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sample.csv"]
    assert paths.csv.is_dir()


def test_the_second_pass_reads_only_strips_that_hold_a_drawn_pixel(
    tmp_path: Path, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a state's scale the second pass must not read every map again: with strips of one
    row, 6 units read at most 6 of the 240 strips, and pick the points a full read picks."""
    maps = two_maps(tmp_path)
    whole = draw_points(maps, 1, class_map, n=6, min_per_class=1, seed=5)
    monkeypatch.setattr(population, "STRIP_BYTES", 100)  # one row per strip
    opened = design_module.streaming
    reads = []

    class Counted:
        def __init__(self, src: rasterio.DatasetReader) -> None:
            self.src = src

        def __getattr__(self, name: str) -> object:
            return getattr(self.src, name)

        def read(self, *args: object, **kwargs: object) -> np.ndarray:
            reads.append(1)
            return self.src.read(*args, **kwargs)

    from contextlib import contextmanager

    @contextmanager
    def counted(path: Path):  # noqa: ANN202 - a stand-in for population.streaming
        with opened(path) as src:
            yield Counted(src)

    monkeypatch.setattr(design_module, "streaming", counted)
    thin = draw_points(maps, 1, class_map, n=6, min_per_class=1, seed=5)
    assert points_of(thin) == points_of(whole)
    assert 0 < len(reads) <= 6


@pytest.mark.parametrize("threads", [1, 2])
def test_a_strip_changed_between_the_passes_is_refused(
    tmp_path: Path, class_map: ClassMap, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Here or in forked workers (2 threads: one a map): the first map that changed named."""
    maps = two_maps(tmp_path)
    counts = design_module.count_l3_strips

    def moved(path: Path) -> np.ndarray:  # one pixel of class 3 counted as class 4
        per_strip = counts(path).copy()
        per_strip[0, 3] -= 1
        per_strip[0, 4] += 1
        return per_strip

    monkeypatch.setattr(design_module, "count_l3_strips", moved)
    with pytest.raises(SampleDesignError, match=r"a.tif changed while the sample was drawn"):
        draw_points(maps, 3, class_map, n=80, min_per_class=1, seed=3, threads=threads)


# --- districts ------------------------------------------------------------------------------


def two_districts(folder: Path) -> Path:
    """West (x < 400,600) and east (400,600..401,000) of map a (UTM 15N); its pixels east of
    401,000 and all of map b (UTM 16N, far from both) lie outside."""
    path = folder / "districts.geojson"
    boxes = [shapely.box(399_000, 4_498_000, 400_600, 4_501_000),
             shapely.box(400_600, 4_498_000, 401_000, 4_501_000)]  # fmt: skip
    pyogrio.raw.write(str(path), shapely.to_wkb(boxes), [np.array(["west", "east"], object)],
                      ["name"], driver="GeoJSON", crs="EPSG:32615",
                      geometry_type="Polygon")  # fmt: skip
    return path


def test_without_districts_the_points_are_those_drawn_before_districts(
    tmp_path: Path, class_map: ClassMap
) -> None:
    """Digests of (region, x, y, class) of every point as the design drew them before it
    took districts (commit 07cde48): the same seed still draws the same sample."""
    import hashlib

    maps = two_maps(tmp_path)
    pinned = {
        (2, 60, 4, 7): "32ac25792dd51531556cfe4773e364b2ee702975d2c5b83b4d6c1765b83957f2",
        (3, 80, 1, 3): "0b513f5686bf398ef27108ba7616124047da09f25715adaa666282da3a252373",
    }
    for (level, n, minimum, seed), digest in pinned.items():
        design = draw_points(maps, level, class_map, n=n, min_per_class=minimum, seed=seed)
        p = design.points
        text = repr(list(zip(p.region.tolist(), p.x.tolist(), p.y.tolist(),
                             design.map_class.tolist(), strict=True)))  # fmt: skip
        assert hashlib.sha256(text.encode()).hexdigest() == digest
        assert design.record.districts is None and not design.district.any()


def test_strata_are_district_and_class_pairs_each_given_the_minimum(
    tmp_path: Path, class_map: ClassMap, thin_strips: None
) -> None:
    """Two districts and the outside over two maps: every (district, class) pair's pixels
    as a whole-array count by pixel centre gives them, each pair with pixels at least
    min(minimum, N_h) units, and each point in the district and class its stratum names."""
    from emb.estimation.districts import read_districts

    maps = two_maps(tmp_path)
    districts = read_districts(two_districts(tmp_path), "name")
    design = draw_points(maps, 1, class_map, n=60, min_per_class=5, seed=2, districts=districts)
    record = design.record
    assert record.districts is not None and record.districts.names == ("west", "east")
    want = np.zeros((3, 2), np.int64)  # outside, west, east x L1 classes
    for path in maps:
        with rasterio.open(path) as src:
            values = src.read(1)
            cols, rows = np.meshgrid(np.arange(src.width) + 0.5, np.arange(src.height) + 0.5)
            x, y = src.transform * (cols, rows)
            utm15 = src.crs.to_epsg() == 32615
        district = np.where(x < 400_600, 1, np.where(x < 401_000, 2, 0)) * utm15
        ok = values != NODATA
        np.add.at(want, (district[ok], class_map.l3_to_l1[values[ok]]), 1)
    assert record.strata_px.tolist() == want.ravel().tolist()
    assert record.allocation.sum() == 60
    assert (record.allocation >= np.minimum(record.strata_px, 5)).all()
    assert (record.allocation[record.strata_px > 0] >= 5).all()
    stratum = design.district * 2 + design.map_class
    assert np.bincount(stratum, minlength=6).tolist() == record.allocation.tolist()
    p = design.points
    west = (p.region == "a") & (p.x < 400_600)
    east = (p.region == "a") & (p.x > 400_600) & (p.x < 401_000)
    assert design.district.tolist() == np.where(west, 1, np.where(east, 2, 0)).tolist()
    for path in maps:
        mine = p.region == path.stem
        with rasterio.open(path) as src:
            values = np.array([v[0] for v in src.sample(zip(p.x[mine], p.y[mine], strict=True))])
        assert class_map.l3_to_l1[values].tolist() == design.map_class[mine].tolist()
    assert len(set(points_of(design))) == 60


def test_the_maps_are_shared_out_by_their_size_on_disk(tmp_path: Path) -> None:
    """The design's shares weigh a map by its bytes (its decoding's work); one it cannot
    stat weighs 1, and the pass that opens it says why."""
    big, small = tmp_path / "big.tif", tmp_path / "small.tif"
    big.write_bytes(b"x" * 5000)
    small.write_bytes(b"x" * 10)
    assert design_module._file_size(big) == 5000
    assert design_module._file_size(small) == 10
    assert design_module._file_size(tmp_path / "missing.tif") == 1
