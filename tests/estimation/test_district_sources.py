"""Districts from the areas file and from the regions themselves (``districts.source``): the
areas' polygons joined per name over their years, the regions' map footprints that hold every
pixel centre of their own map (in the maps' CRS when they share one, in WGS84 when they do
not), refusals naming the file or regions, and the parse-time settings that carry them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
import shapely
from affine import Affine
from rasterio.windows import Window

from emb.estimation.districts import (
    DistrictsError,
    district_ids,
    districts_of_areas,
    districts_of_maps,
    load_districts,
    on_map,
)
from emb.estimation.settings import from_config
from emb.workflow.samples import (
    ERRORS,
    area_settings,
    district_inputs,
    district_layers,
    district_outputs,
)

REPO = Path(__file__).resolve().parents[2]


def areas_file(path: Path, features: list[tuple[str, int, list]]) -> Path:
    """An areas GeoJSON (longitude/latitude) of (area, year, one ring)."""
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"area": name, "year": year},
         "geometry": {"type": "Polygon", "coordinates": [ring]}}
        for name, year, ring in features]}))  # fmt: skip
    return path


def box_ring(west: float, south: float, east: float, north: float) -> list:
    return [[west, south], [east, south], [east, north], [west, north], [west, south]]


def test_the_areas_become_districts_joined_over_their_years(tmp_path: Path) -> None:
    path = areas_file(tmp_path / "areas.geojson", [
        ("story", 2023, box_ring(-93.7, 41.9, -93.5, 42.1)),
        ("boone", 2023, box_ring(-94.0, 41.9, -93.8, 42.1)),
        ("story", 2024, box_ring(-93.6, 41.9, -93.4, 42.1)),  # the area grew: both years count
    ])  # fmt: skip
    districts = districts_of_areas(path)
    assert districts.names == ("story", "boone") and districts.name_field == "area"
    assert districts.crs.to_epsg() == 4326
    assert districts.geometries[0].equals(shapely.box(-93.7, 41.9, -93.4, 42.1))
    assert districts.geometries[1].equals(shapely.box(-94.0, 41.9, -93.8, 42.1))
    assert load_districts("areas", path, "ignored", {}).names == districts.names


def test_areas_that_overlap_are_refused_naming_both(tmp_path: Path) -> None:
    path = areas_file(tmp_path / "areas.geojson", [
        ("story", 2023, box_ring(-93.7, 41.9, -93.5, 42.1)),
        ("ames", 2023, box_ring(-93.6, 42.0, -93.55, 42.05)),
    ])  # fmt: skip
    with pytest.raises(DistrictsError, match=r"areas.geojson: .*'story' and 'ames' overlap"):
        districts_of_areas(path)
    with pytest.raises(DistrictsError, match=r"districts from the areas file: .*not found"):
        districts_of_areas(tmp_path / "gone.geojson")


def grid(west: float, north: float) -> Affine:
    """A north-up grid of 10 m pixels from (west, north)."""
    return Affine(10, 0, west, 0, -10, north)


def write_map(path: Path, crs: str, transform: Affine, shape: tuple[int, int]) -> Path:
    with rasterio.open(path, "w", driver="GTiff", height=shape[0], width=shape[1], count=1,
                       dtype="uint8", crs=crs, transform=transform, nodata=255) as dst:  # fmt: skip
        dst.write(np.zeros((1, *shape), np.uint8))
    return path


def burned(districts, path: Path) -> np.ndarray:
    """The district id of every pixel centre of the map at ``path``, burned as the check does."""
    with rasterio.open(path) as src:
        shapes = on_map(districts, src.crs.to_wkt())
        return district_ids(shapes, src.transform, Window(0, 0, src.width, src.height))


@pytest.mark.parametrize("second_crs", ["EPSG:32615", "EPSG:32614"])
def test_each_region_is_a_district_holding_every_pixel_of_its_own_map(
    tmp_path: Path, second_crs: str
) -> None:
    """Side by side in one UTM zone (footprints in it, no reprojection), or the second in the
    next zone (footprints in WGS84): either way every pixel centre lies in its own region's
    district and in no other."""
    east_x = 400_503 if second_crs == "EPSG:32615" else 900_000
    maps = {
        "west": write_map(tmp_path / "w.tif", "EPSG:32615", grid(400_003, 4_500_007), (40, 50)),
        "east": write_map(tmp_path / "e.tif", second_crs, grid(east_x, 4_500_007), (40, 60)),
    }
    districts = districts_of_maps(maps)
    assert districts.names == ("west", "east") and districts.name_field == "region"
    assert districts.crs.to_epsg() == (32615 if second_crs == "EPSG:32615" else 4326)
    for d, path in enumerate(maps.values(), start=1):
        ids = burned(districts, path)
        assert (ids == d).all(), f"{path.name}: ids {np.unique(ids).tolist()}, expected {d}"
    assert load_districts("regions", None, "name", maps).names == ("west", "east")


def test_regions_whose_maps_overlap_are_refused_pointing_to_a_districts_file(
    tmp_path: Path,
) -> None:
    maps = {  # b starts 400 m east of a, which is 500 m wide: 10 columns shared
        "a": write_map(tmp_path / "a.tif", "EPSG:32615", grid(400_000, 4_500_000), (40, 50)),
        "b": write_map(tmp_path / "b.tif", "EPSG:32615", grid(400_400, 4_500_000), (40, 50)),
    }
    with pytest.raises(DistrictsError, match=r"'a' and 'b' overlap .*name a districts file"):
        districts_of_maps(maps)
    with rasterio.open(tmp_path / "nocrs.tif", "w", driver="GTiff", height=2, width=2, count=1,
                       dtype="uint8") as dst:  # fmt: skip
        dst.write(np.zeros((1, 2, 2), np.uint8))
    with pytest.raises(DistrictsError, match=r"nocrs.tif: no CRS: region 'c'"):
        districts_of_maps({"c": tmp_path / "nocrs.tif"})


def test_load_districts_without_a_file_is_none_and_an_unknown_source_is_refused() -> None:
    assert load_districts("file", None, "name", {}) is None
    with pytest.raises(DistrictsError, match=r"districts.source: expected one of .* 'county'"):
        load_districts("county", None, "name", {})


def test_the_parse_time_settings_carry_the_areas_file_and_refuse_what_cannot_be(
    tmp_path: Path,
) -> None:
    path = areas_file(tmp_path / "areas.geojson",
                      [("story", 2023, box_ring(-93.7, 41.9, -93.5, 42.1))])  # fmt: skip
    by_areas = area_settings({"districts": {"source": "areas"}}, str(path))
    assert (by_areas.districts, by_areas.district_name) == (str(path), "area")
    assert district_inputs(by_areas) == [str(path)]
    assert district_outputs(by_areas) == {"gpkg": "results/area_estimates/{run}_districts.gpkg"}
    assert from_config({}).has_districts is False
    by_regions = area_settings({"districts": {"source": "regions"}}, None)
    assert district_inputs(by_regions) == []  # the maps are the rule's inputs already
    assert district_layers(by_regions, ["r1"]) == ["results/area_estimates/r1_districts.gpkg"]
    assert district_layers(from_config({}), ["r1"]) == []
    with pytest.raises(ERRORS, match=r"'areas' takes the districts from the areas file"):
        area_settings({"districts": {"source": "areas"}}, None)
    # a file left by a base config (the demo's) belongs to source file: regions leave it aside
    left = area_settings({"districts": {"source": "regions", "file": "d.gpkg"}}, None)
    assert left.districts is None and left.has_districts and district_inputs(left) == []
    with pytest.raises(ERRORS, match=r"districts.source: 'county' is not one of"):
        area_settings({"districts": {"source": "county"}}, None)
    assert area_settings({"districts": {"file": str(REPO / "config/demo_districts.geojson")}},
                         str(path)).district_name == "name"  # fmt: skip
