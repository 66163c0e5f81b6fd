"""Ground metres, overlaps across CRSs and the years of one ground, on real GeoTIFFs checked by
``check_regions`` (the check Snakemake runs before any job)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.transform import from_origin
from rasterio.warp import transform as warp_points

from emb.geo import utm_epsg
from emb.prep.footprints import Footprint, ground_groups, ground_metre_problem
from emb.prep.regions import RegionsError, read_regions
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec, plan_tiles
from emb.workflow.region_checks import check_regions

LON, LAT = -93.5, 42.0  # Iowa, UTM zone 15


def write(path: Path, crs: str, x0: float, y0: float, size: float, n: int = 64,
          count: int = 64, dtype: str = "int8", tags: dict | None = None) -> Path:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    profile = {"driver": "GTiff", "width": n, "height": n, "count": count, "dtype": dtype,
               "crs": crs, "transform": from_origin(x0, y0, size, size)}  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(np.ones((count, n, n), dtype) * (10 if dtype != "uint8" else 1))
        if tags:
            dst.update_tags(**tags)
    return path


def utm_origin(lon: float, lat: float, epsg: int) -> tuple[float, float]:
    xs, ys = warp_points("EPSG:4326", f"EPSG:{epsg}", [lon], [lat])
    return round(xs[0], -1), round(ys[0], -1)


def table(root: Path, rows: list[tuple]) -> Path:
    path = root / "regions.tsv"
    lines = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    lines += ["\t".join([r, y, str(a), "", str(c), "auto"]) for r, y, a, c in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_cdl(path: Path) -> Path:
    """A coarse CDL in EPSG:5070 (Albers) over the whole test area, both zones."""
    x, y = warp_points("EPSG:4326", "EPSG:5070", [-96.8], [LAT + 0.5])
    return write(path, "EPSG:5070", x[0], y[0], 300.0, n=1200, count=1, dtype="uint8")


@pytest.fixture
def cdl(tmp_path: Path) -> Path:
    return write_cdl(tmp_path / "cdl.tif")


def check(path: Path):
    return check_regions(read_regions(path), path)


def test_web_mercator_and_degrees_are_refused_naming_the_utm_zone_to_warp_to(
    tmp_path: Path, cdl: Path
) -> None:
    x, y = warp_points("EPSG:4326", "EPSG:3857", [LON], [LAT])
    merc = write(tmp_path / "merc.tif", "EPSG:3857", x[0], y[0], 10.0)
    with pytest.raises(RegionsError) as err:
        check(table(tmp_path, [("a", "2024", merc, cdl)]))
    message = str(err.value)
    assert "merc.tif" in message and "EPSG:3857" in message and "EPSG:32615" in message
    assert "0.74" in message  # ground metres per Mercator metre at 42 N
    geo = write(tmp_path / "geo.tif", "EPSG:4326", LON, LAT, 1e-4)
    with pytest.raises(RegionsError, match=r"geo\.tif is in the geographic CRS.*EPSG:32615"):
        check(table(tmp_path, [("a", "2024", geo, cdl)]))


def test_utm_and_a_local_metre_grid_pass_the_ground_metre_check() -> None:
    assert utm_epsg(LON, LAT) == 32615 and utm_epsg(-96.5, -10) == 32714
    x, y = utm_origin(LON, LAT, 32615)
    assert ground_metre_problem(CRS.from_epsg(32615), from_origin(x, y, 10, 10), (64, 64)) is None
    # the neighbouring zone, 3 degrees beyond its edge: still ground metres within 2 %
    x, y = utm_origin(-96.2, LAT, 32614)
    assert ground_metre_problem(CRS.from_epsg(32614), from_origin(x, y, 10, 10), (64, 64)) is None


def test_one_area_in_two_utm_zones_as_two_regions_is_refused_with_the_overlap(
    tmp_path: Path, cdl: Path
) -> None:
    """The same ground near the 96 W zone edge, delivered in zone 14 and in zone 15."""
    x14, y14 = utm_origin(-96.05, LAT, 32614)
    x15, y15 = utm_origin(-96.05, LAT, 32615)
    a = write(tmp_path / "z14.tif", "EPSG:32614", x14, y14, 10.0)
    b = write(tmp_path / "z15.tif", "EPSG:32615", x15 - 200, y15 + 200, 10.0)
    with pytest.raises(RegionsError) as err:
        check(table(tmp_path, [("a14", "2024", a, cdl), ("a15", "2024", b, cdl)]))
    message = str(err.value)
    assert "z14.tif" in message and "z15.tif" in message and "year 2024" in message
    assert "km2" in message and "pixels of 10 m" in message


def test_rasters_sharing_only_an_edge_are_fine(tmp_path: Path, cdl: Path) -> None:
    x, y = utm_origin(LON, LAT, 32615)
    a = write(tmp_path / "a.tif", "EPSG:32615", x, y, 10.0)
    b = write(tmp_path / "b.tif", "EPSG:32615", x + 640, y, 10.0)
    checks = check(table(tmp_path, [("a", "2024", a, cdl), ("b", "2024", b, cdl)]))
    assert checks.split_key("aef", "b") == "b" and checks.split_extent("aef", "b") is None


def test_the_same_ground_in_two_years_is_one_split_group(tmp_path: Path, cdl: Path) -> None:
    x, y = utm_origin(LON, LAT, 32615)
    a = write(tmp_path / "2023.tif", "EPSG:32615", x, y, 10.0, tags={"AEF_YEAR": "2023"})
    b = write(tmp_path / "2024.tif", "EPSG:32615", x, y, 10.0)  # the same grid, another year
    c = write(tmp_path / "2024b.tif", "EPSG:32615", x + 320, y - 320, 10.0)  # half of it
    rows = [("y23", "2023", a, cdl), ("y24", "2024", b, cdl), ("y25", "2025", c, cdl)]
    checks = check(table(tmp_path, rows))
    assert {checks.split_key("aef", r) for r in ("y23", "y24", "y25")} == {"y23"}
    assert checks.split_extent("aef", "y25") == pytest.approx((x, y - 960, x + 960, y))


def test_the_same_ground_in_two_years_in_two_crss_is_refused(tmp_path: Path, cdl: Path) -> None:
    x14, y14 = utm_origin(-96.05, LAT, 32614)
    x15, y15 = utm_origin(-96.05, LAT, 32615)
    a = write(tmp_path / "z14.tif", "EPSG:32614", x14, y14, 10.0)
    b = write(tmp_path / "z15.tif", "EPSG:32615", x15, y15, 10.0)
    with pytest.raises(RegionsError, match=r"z15\.tif \(EPSG:32615, 2024\) covers ground of"):
        check(table(tmp_path, [("a", "2023", a, cdl), ("b", "2024", b, cdl)]))


def test_a_year_tag_that_contradicts_the_row_is_refused(tmp_path: Path, cdl: Path) -> None:
    x, y = utm_origin(LON, LAT, 32615)
    tessera_like = write(tmp_path / "t.tif", "EPSG:32615", x, y, 10.0,
                         tags={"TESSERA_YEAR": "2021"})  # fmt: skip
    with pytest.raises(RegionsError, match=r"t\.tif says year 2021 \(TESSERA_YEAR\).*is 2024"):
        check(table(tmp_path, [("a", "2024", tessera_like, cdl)]))
    nass = write_cdl(tmp_path / "2023_30m_cdls.tif")
    ok = write(tmp_path / "ok.tif", "EPSG:32615", x, y, 10.0)
    with pytest.raises(RegionsError, match=r"2023_30m_cdls\.tif says year 2023 \(the NASS"):
        check(table(tmp_path, [("a", "2024", ok, nass)]))


def test_a_block_has_one_split_in_every_year_of_its_ground() -> None:
    """Two years on grids offset by half the extent: every block both cover gets one split."""
    labels = np.ones((96, 96), np.uint8)
    spec = dict(block_m=160.0, group="y23", extent=(0.0, -1440.0, 1440.0, 0.0))
    tiles = {}
    for name, x0, y0 in (("y23", 0.0, 0.0), ("y24", 480.0, -480.0)):
        transform = from_origin(x0, y0, 10.0, 10.0)
        kept, _ = plan_tiles(labels, transform, name, TileSpec(16), SplitSpec(**spec))
        tiles[name] = {(x0 + t.col * 10, y0 - t.row * 10): t.split for t in kept}
    shared = tiles["y23"].keys() & tiles["y24"].keys()
    assert len(shared) >= 9
    assert all(tiles["y23"][k] == tiles["y24"][k] for k in shared)
    assert {tiles["y24"][k] for k in shared} >= {"train"}
    # without the group, each year draws its own: some shared blocks disagree (the leak)
    alone = {}
    for name, x0, y0 in (("y23", 0.0, 0.0), ("y24", 480.0, -480.0)):
        kept, _ = plan_tiles(labels, from_origin(x0, y0, 10.0, 10.0), name, TileSpec(16),
                             SplitSpec(block_m=160.0))  # fmt: skip
        alone[name] = {(x0 + t.col * 10, y0 - t.row * 10): t.split for t in kept}
    both = alone["y23"].keys() & alone["y24"].keys()
    assert any(alone["y23"][k] != alone["y24"][k] for k in both)


def test_ground_groups_join_a_chain_of_years_under_the_first_region() -> None:
    crs = CRS.from_epsg(32615)
    places = [("a", "2021", 0), ("b", "2022", 1000), ("c", "2023", 50), ("d", "2024", 1050),
              ("e", "2025", 80)]  # fmt: skip
    prints = [Footprint(n, n, f"{n}.tif", y, crs, from_origin(x, 0, 10, 10), (10, 10))
              for n, y, x in places]  # fmt: skip
    groups = ground_groups(prints)
    assert groups == {"a": "a", "c": "a", "e": "a", "b": "b", "d": "b"}
