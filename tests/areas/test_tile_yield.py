"""The parse-time tile count of planned regions: on the grid the VRT will have, as many tiles as
the shards stage keeps from the area's footprint, and no refusal of a region that yields one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import shapely
from areas_collection import YEAR, Collection, make_collection, write_geojson
from rasterio.features import geometry_mask
from test_bad_inputs import config_of

from emb.areas.plan import plan_areas
from emb.areas.tile_yield import region_grid
from emb.areas.vrt import mosaic_grid, part_grid
from emb.areas.workflow import plan_from_config
from emb.classes import IGNORE
from emb.prep.tiles import SplitSpec, TileSpec, count_tiles, plan_tiles


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
