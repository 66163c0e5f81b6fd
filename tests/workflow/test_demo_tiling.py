"""The demo's own tiling gives every run enough test blocks for intervals (issue 49, item 6):
a new user's summary shows intervals and verdicts, not "no interval" in every cell."""

from __future__ import annotations

import yaml
from conftest import REPO
from snakemake.utils import validate

from emb.evaluation.bootstrap import BootstrapSettings
from emb.prep.demo_region import DEMO_REGIONS, EMB_RES
from emb.prep.spatial_split import SplitSpec, assign_blocks, blocks_in


def test_the_demo_split_draws_at_least_the_interval_floor_of_test_blocks_per_run() -> None:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))  # the defaults filled
    block_m = config["demo"]["overlay"]["splits"]["block_m"]
    side = config["demo"]["size"] * EMB_RES
    test_blocks = 0  # a run trains on every demo region of its source
    for region in DEMO_REGIONS:
        x0 = region.centre[0] - side / 2
        y0 = region.centre[1] - side / 2
        drawn = assign_blocks(region.name, blocks_in((x0, y0, x0 + side, y0 + side), block_m),
                              SplitSpec(block_m))  # fmt: skip
        test_blocks += sum(split == "test" for split in drawn.values())
    assert test_blocks >= BootstrapSettings().min_blocks + 4, test_blocks  # margin: dropped tiles
