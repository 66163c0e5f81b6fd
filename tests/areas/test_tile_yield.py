"""The parse-time tile count of planned regions: on the grid the VRT will have, as many tiles as
the shards stage keeps from the area's footprint, and no refusal of a region that yields one."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import rasterio.windows
import shapely
from areas_collection import YEAR, Collection, make_collection, write_geojson
from rasterio.features import geometry_mask
from rasterio.transform import array_bounds
from test_bad_inputs import config_of

from emb.areas import AreasError
from emb.areas.plan import plan_areas
from emb.areas.tile_yield import check_tile_yield, region_grid, specs_of
from emb.areas.vrt import mosaic_grid, part_grid
from emb.classes import IGNORE
from emb.config_schema import config_default
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import Ground, TileSpec, count_tiles, plan_tiles, tile_windows
from emb.workflow.area_plan import plan_from_config


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    return make_collection(tmp_path_factory.mktemp("yield"))


def test_counted_grid_is_the_vrt_grid_and_counts_are_those_of_the_labels(
    collection: Collection,
) -> None:
    """Each masked mosaic: the grid counted at parse time is the one its VRT gets, and the
    geometric count equals plan_tiles on the footprint rasterized at pixel centres."""
    cfg = config_of(collection)
    plan = plan_areas(cfg["areas"], cfg["collections"])
    split = SplitSpec(5120.0)
    for r in plan.regions:
        for m in (m for m in r.mosaics.values() if m.cutline is not None):
            transform, width, height = region_grid(m)
            vrt = part_grid(m, mosaic_grid(m))
            assert (transform, width, height) == (vrt.transform, vrt.width, vrt.height)
            inside = geometry_mask([m.cutline], (height, width), transform, invert=True)
            labels = np.where(inside, 0, IGNORE).astype(np.uint8)
            for size in (256, 128, 64, 32):
                spec = TileSpec(size)
                kept, _ = plan_tiles(labels, transform, r.region, spec, split)
                n = count_tiles(transform, width, height, spec, split, m.cutline, r.region)
                assert n == len(kept), (r.region, size)


def test_areas_with_a_tile_or_only_mapped_are_not_refused(
    collection: Collection, tmp_path: Path
) -> None:
    """The collection's area (one 256-px tile per zone) passes; an area of 27 x 35 px passes
    as ``split: predict`` (mapped, never tiled)."""
    cfg = {**config_of(collection), "tiles": {"size": 256, "stride": 256, "min_valid": 0.25}}
    assert len(plan_from_config(cfg).regions) == 2
    small = tmp_path / "small.geojson"
    box = shapely.box(-96.010, 42.005, -96.007, 42.008)
    write_geojson(small, [{"area": "plot", "year": YEAR, "split": "predict", "geometry": box}])
    assert [r.region for r in plan_from_config({**cfg, "areas": str(small)}).regions] == [
        "plot_14n"
    ]


def test_an_area_of_10000_plots_is_refused_about_as_fast_as_it_is_planned(
    collection: Collection, tmp_path: Path
) -> None:
    """100 x 100 plots of 40% x 40% of their cell: no tile holds 25%, so every smaller tile
    size and min_valid is counted for the message. Each window costs the plots near it (it
    took 16 times the plan's time when each window met every plot); the areas counted are
    the plots' own."""
    west, south, _, north = -95.999, 42.003, -95.989, 42.019
    dx, dy = (-95.989 - west) / 100, (north - south) / 100
    plots = shapely.MultiPolygon(
        [shapely.box(west + i * dx, south + j * dy, west + (i + 0.4) * dx, south + (j + 0.4) * dy)
         for i in range(100) for j in range(100)]
    )  # fmt: skip
    areas = tmp_path / "plots.geojson"
    write_geojson(areas, [{"area": "plots", "year": YEAR, "geometry": plots}])
    cfg = {**config_of(collection), "areas": str(areas)}
    began = time.perf_counter()
    plan = plan_areas(areas, cfg["collections"])
    plan_s = time.perf_counter() - began
    tiles = {"tiles": {"size": 256, "stride": 256, "min_valid": 0.25}}
    began = time.perf_counter()
    with pytest.raises(AreasError, match=r"plots_15n is .* \(0.01 gives up to 1 tile\)"):
        check_tile_yield(plan, str(areas), *specs_of(tiles))
    refuse_s = time.perf_counter() - began
    assert refuse_s < 2.5 * plan_s, f"refused in {refuse_s:.2f} s, planned in {plan_s:.2f} s"
    (region,) = plan.regions
    m = region.mosaics["aef"]
    transform, width, height = region_grid(m)
    ground = Ground(m.cutline, shapely.box(*array_bounds(height, width, transform)))
    for size in (8, 16, 64):
        for win in tile_windows(height, width, TileSpec(size))[::7]:
            box = shapely.box(*rasterio.windows.bounds(win, transform))
            assert ground.area_in(box) == pytest.approx(box.intersection(m.cutline).area, abs=1e-6)


def test_a_partial_tiles_section_takes_the_schemas_other_settings() -> None:
    """The workflow's config has every key; a plan checked alone with ``tiles: {size: 64}``
    gets the rest as a run of the workflow would (the schema's), stride equal to the size."""
    assert specs_of({"splits": {}}) is None
    tile_spec, split_spec = specs_of({"tiles": {"size": 64}})
    schema = config_default("splits.block_m"), config_default("tiles.min_valid")
    assert (split_spec.block_m, tile_spec.min_valid) == schema
    assert (tile_spec.size, tile_spec.stride, split_spec.fractions) == (64, 64, {"train": 1.0})
    given = specs_of({"tiles": {"size": 32, "stride": 16, "min_valid": 0.5},
                      "splits": {"block_m": 640}})  # fmt: skip
    assert given == (TileSpec(32, 16, 0.5), SplitSpec(640.0, {"train": 1.0}))
