"""The regions table's answers behind the workflow's input functions and params
(emb.workflow.region_table), asked directly: before, only dry runs of the whole workflow reached
the demo's rasters, the wildcard pattern, the demo tiling, the split draw, the .npy tile's
inputs, the jobs' table and predict's rasters."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO

from emb.prep.regions import read_regions
from emb.workflow import region_table
from emb.workflow.region_checks import RegionChecks
from emb.workflow.region_table import RegionTable

ROWS = """region\tyear\taef\ttessera\tcdl\tsplit
demo_a\t2024\tresources/demo/demo_a/aef.tif\tresources/demo/demo_a/tessera.tif\tc/a.tif\tauto
field.2024\t2024\tmine/aef.tif\t{npy}\tc/m.tif\ttrain
next\t2025\tnext/aef.tif\t\t\tpredict
"""


@pytest.fixture
def npy(tmp_path: Path) -> Path:
    """A geotessera tile's three files, the landmask beside them (only their names matter)."""
    tile = tmp_path / "2024/grid_1.05_2.05/grid_1.05_2.05.npy"
    tile.parent.mkdir(parents=True)
    np.save(tile, np.zeros((2, 2, 128), np.int8))
    np.save(tile.with_name("grid_1.05_2.05_scales.npy"), np.ones((2, 2), np.float32))
    tile.with_name("grid_1.05_2.05.tiff").write_bytes(b"")
    return tile


@pytest.fixture
def table(tmp_path: Path, npy: Path) -> RegionTable:
    path = tmp_path / "regions.tsv"
    path.write_text(ROWS.format(npy=npy), encoding="utf-8")
    return RegionTable(read_regions(path), generated=region_table.demo_rasters())


def test_the_demo_rasters_are_those_rule_demo_region_writes() -> None:
    rasters = region_table.demo_rasters()
    assert rasters[:3] == [f"resources/demo/demo_a/{k}.tif" for k in ("aef", "tessera", "cdl")]
    assert len(rasters) == 3 * len(region_table.DEMO_NAMES) == 6


def test_a_wildcard_pattern_matches_its_names_exactly_dots_included() -> None:
    pattern = re.compile(region_table.one_of(["field.2024", "demo_a"]))
    assert pattern.fullmatch("field.2024") and pattern.fullmatch("demo_a")
    assert not pattern.fullmatch("fieldX2024")  # an unescaped dot would match any character
    assert not pattern.fullmatch("demo_a/x")


def test_demo_data_gets_the_demo_overlay_over_the_schemas_tiling_and_your_data_does_not() -> None:
    config = {
        "tiles": {"size": 256, "stride": 256, "min_valid": 0.5},
        "splits": {"block_m": 5120},
        "demo": {"overlay": {"tiles": {"size": 32, "stride": 32}}},
    }
    demo = region_table.data_settings(config, "tiles", demo=True)
    assert demo == {"size": 32, "stride": 32, "min_valid": 0.5}
    assert region_table.data_settings(config, "tiles", demo=False) == config["tiles"]
    assert region_table.data_settings(config, "splits", demo=True) == {"block_m": 5120}


GIVEN_TILES = [
    ({"size": 128}, 128),
    ({"stride": 64}, 64),
    ({"size": 128, "stride": 96}, 96),
    ({}, 256),
]


@pytest.mark.parametrize(("given", "stride"), GIVEN_TILES)
def test_a_tile_size_given_alone_tiles_without_gaps(given: dict, stride: int) -> None:
    """config.yaml and the schema leave the stride null (the tile size): an overlay that sets
    only ``tiles.size`` (merged as ``--configfile`` merges it) must not keep 256 px between
    tile origins, which would leave gaps between 128 px tiles."""
    from snakemake.utils import update_config, validate

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, {"tiles": given})
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))
    tiles = region_table.data_settings(config, "tiles", demo=False)
    assert (tiles["size"], tiles["stride"]) == (given.get("size", 256), stride)


DEMO_TILES = [  # (the demo overlay's tiles, your --configfile's tiles, the demo's tiling)
    ({"size": 32}, {}, (32, 32)),
    ({"size": 32}, {"size": 128}, (32, 32)),
    ({"size": 32, "stride": 16}, {}, (32, 16)),
    ({}, {"size": 128}, (128, 128)),
]


@pytest.mark.parametrize(("overlay", "base", "tiling"), DEMO_TILES)
def test_a_null_stride_is_the_tile_size_of_the_tiling_in_force_the_demo_overlays_included(
    overlay: dict, base: dict, tiling: tuple[int, int]
) -> None:
    """For demo data the tiling in force is the demo overlay's: an overlay giving only
    ``tiles: {size: 32}`` tiles the demo at 32 px without gaps, never at the base section's
    256 px between origins; your own data keeps the base section's size as its stride."""
    from snakemake.utils import update_config, validate

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, {"tiles": base})
    config["demo"]["overlay"]["tiles"] = overlay  # as config.yaml would write it
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))
    demo = region_table.data_settings(config, "tiles", demo=True)
    assert (demo["size"], demo["stride"]) == tiling
    own = region_table.data_settings(config, "tiles", demo=False)
    assert own["size"] == own["stride"] == base.get("size", 256)


def test_the_years_of_one_ground_share_a_split_draw_over_their_extent() -> None:
    checks = RegionChecks(
        split_keys={"aef": {"field_2025": "field_2024"}},
        split_extents={"aef": {"field_2024": (500000.0, 4000000.0, 500640.0, 4000320.125)}},
    )
    shared = {"key": "field_2024", "extent": "500000.000000,4000000.000000,500640.000000,"
              "4000320.125000"}  # fmt: skip
    assert region_table.split_group(checks, "aef", "field_2025") == shared
    assert region_table.split_group(checks, "aef", "field_2024") == shared
    assert region_table.split_group(checks, "tessera", "field_2025") == {
        "key": "field_2025",
        "extent": "",
    }


def test_a_geotessera_tiles_three_files_are_the_conversions_inputs(
    table: RegionTable, npy: Path
) -> None:
    inputs = table.tessera_npy_inputs("field.2024")
    assert inputs["npy"] == str(npy)
    assert inputs["scales"] == str(npy.with_name("grid_1.05_2.05_scales.npy"))
    assert inputs["landmask"] == str(npy.with_name("grid_1.05_2.05.tiff"))


def test_predict_reads_every_mapped_regions_job_raster(table: RegionTable) -> None:
    assert table.mapped_rasters("aef") == ["resources/demo/demo_a/aef.tif", "mine/aef.tif",
                                           "next/aef.tif"]  # fmt: skip
    assert table.mapped_rasters("tessera") == [
        "resources/demo/demo_a/tessera.tif",
        "results/converted/tessera/field.2024.tif",  # the .npy tile, converted
    ]


def test_the_jobs_table_is_written_with_its_count(table: RegionTable, tmp_path: Path) -> None:
    rows = table.jobs_table().to_csv(sep="\t", index=False)
    out, log = tmp_path / "regions.tsv", tmp_path / "regions_table.log"
    region_table.write_jobs_table(str(out), str(log), rows)
    assert out.read_text(encoding="utf-8") == rows
    assert log.read_text() == f"wrote {out}: 3 regions\n"
