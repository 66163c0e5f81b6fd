"""The demo's districts file (config/demo_districts.geojson, longitude/latitude, so the demo
reprojects districts into both regions' UTM zones): three districts, each holding pixels of
the demo maps at the schema's demo size, one (cedar) holding pixels of both regions, and
pixels in no district in each region (alder's lake, demo_b's east)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from conftest import CLASSES_CSV, REPO
from rasterio.windows import Window

from emb.config_schema import config_option
from emb.estimation.districts import district_ids, on_map, read_districts
from emb.prep.demo_region import DEMO_REGIONS, EMB_RES, DemoRegion, write_region

DEMO_DISTRICTS = REPO / "config" / "demo_districts.geojson"
SNAP_M = 1280.0  # demo_region.write_region snaps its origin to this (the demo's split blocks)


def demo_grid(region: DemoRegion, size: int) -> tuple[Affine, int]:
    """The AEF grid write_region gives a region (the grid predict's maps take), worked out as
    it does: checked against the writer at a small size below, used at the full size (writing
    the full demo takes half a minute)."""
    left = np.floor((region.centre[0] - size * EMB_RES / 2) / SNAP_M) * SNAP_M
    bottom = np.floor((region.centre[1] - size * EMB_RES / 2) / SNAP_M) * SNAP_M
    if region.bottom_up:
        return Affine(EMB_RES, 0, left, 0, EMB_RES, bottom), size
    return Affine(EMB_RES, 0, left, 0, -EMB_RES, bottom + size * EMB_RES), size


@pytest.mark.parametrize("region", DEMO_REGIONS, ids=lambda r: r.name)
def test_the_grid_worked_out_is_the_writers(region: DemoRegion, tmp_path: Path) -> None:
    paths = write_region(region, 32, tmp_path, CLASSES_CSV, seed=1)
    with rasterio.open(paths["aef"]) as src:
        assert (src.transform, src.width, src.height) == (*demo_grid(region, 32), 32)
        assert src.crs.to_epsg() == region.epsg


def test_every_demo_district_holds_demo_pixels_and_one_crosses_both_regions() -> None:
    districts = read_districts(DEMO_DISTRICTS, "name")
    assert districts.names == ("alder", "birch", "cedar")
    assert districts.crs.is_geographic  # reprojected into both zones by the demo
    assert [g.geom_type for g in districts.geometries] == ["Polygon", "MultiPolygon", "Polygon"]
    assert len(districts.geometries[0].interiors) == 1  # alder's lake
    size = int(config_option("demo.size")["default"])
    pixels = {}
    for region in DEMO_REGIONS:
        transform, side = demo_grid(region, size)
        ids = district_ids(on_map(districts, f"EPSG:{region.epsg}"), transform,
                           Window(0, 0, side, side))  # fmt: skip
        pixels[region.name] = np.bincount(ids.ravel(), minlength=4)
    total = sum(pixels.values())
    assert (total[1:] > 1000).all(), f"a district without demo pixels: {pixels}"
    in_both = [i for i in (1, 2, 3) if all(p[i] > 1000 for p in pixels.values())]
    assert [districts.names[i - 1] for i in in_both] == ["cedar"], pixels
    assert all(p[0] > 0 for p in pixels.values()), f"no outside pixels: {pixels}"
