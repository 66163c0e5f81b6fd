"""The tiling and split in force for a source's data, read from the config in one place: a null
stride is the tile size of the tiling in force (the demo overlay's for demo data), a stride
past the tile is refused naming the keys it came from, and the split blocks are the config's."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO

from emb.prep.data_settings import data_settings, tiling_in_force
from emb.prep.spatial_split import SplitSpec, TilingError
from emb.prep.tiles import TileSpec


def config_with(tiles: dict | None = None, overlay: dict | None = None, **sections) -> dict:
    """config/config.yaml validated against the schema, ``tiles`` merged as ``--configfile``
    merges it, the demo overlay's ``tiles`` replaced by ``overlay``."""
    from snakemake.utils import update_config, validate

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, {"tiles": tiles or {}, **sections})
    if overlay is not None:
        config["demo"]["overlay"]["tiles"] = overlay
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))
    return config


DEMO_TILES = [  # (the demo overlay's tiles, your tiles, the demo's tiling, your tiling)
    ({"size": 32}, {}, (32, 32), (256, 256)),
    ({"size": 32}, {"size": 128}, (32, 32), (128, 128)),
    ({"size": 32, "stride": 16}, {}, (32, 16), (256, 256)),
    ({}, {"size": 128}, (128, 128), (128, 128)),
    ({}, {"stride": 64}, (256, 64), (256, 64)),
]


@pytest.mark.parametrize(("overlay", "base", "demo", "own"), DEMO_TILES)
def test_a_null_stride_is_the_tile_size_of_the_tiling_in_force(
    overlay: dict, base: dict, demo: tuple[int, int], own: tuple[int, int]
) -> None:
    """Demo data gets the overlay's size: an overlay giving only ``tiles: {size: 32}`` tiles
    at 32 px without gaps, never at the base section's 256 px between origins. The rule's
    params and the tiles cut agree."""
    config = config_with(base, overlay)
    for is_demo, (size, stride) in ((True, demo), (False, own)):
        tiling = tiling_in_force(config, is_demo)
        assert (tiling.tiles["size"], tiling.tiles["stride"]) == (size, stride)
        assert tiling.tile_spec() == TileSpec(size, stride, config["tiles"]["min_valid"])
        assert data_settings(config, "tiles", is_demo) == tiling.tiles


def test_a_stride_past_the_tile_is_refused_naming_the_keys_it_came_from() -> None:
    config = config_with({"size": 64}, {"size": 32, "stride": 48})
    with pytest.raises(TilingError, match=r"^config demo.overlay.tiles.stride 48 is larger than "
                       r"demo.overlay.tiles.size 32: .* leave 56% of the pixels"):  # fmt: skip
        tiling_in_force(config, demo=True).tile_spec()
    with pytest.raises(TilingError, match=r"^config tiles.stride 96 is larger than tiles.size 64"):
        tiling_in_force(config_with({"size": 64, "stride": 96}), demo=False).tile_spec()


def test_a_stride_below_one_pixel_is_refused_not_divided_by() -> None:
    """A shards stage run by hand with --stride 0 (the schema's minimum is 1 for the workflow)."""
    with pytest.raises(TilingError, match=r"^tiles.stride 0: expected at least 1 pixel"):
        TileSpec(64, 0)


def test_a_changed_split_field_is_checked_as_changed_not_as_the_config_gave_it() -> None:
    """The areas' yield check draws every block into train: fractions the config gives for
    its own split (all zero, which the schema allows) do not stop it."""
    config = config_with(splits={"fractions": [0, 0, 0]})
    spec = tiling_in_force(config).split_spec(fractions={"train": 1.0})
    assert spec.fractions == {"train": 1.0}


def test_the_split_blocks_are_the_configs_the_overlays_over_them_for_demo_data() -> None:
    splits = {"block_m": 2560, "fractions": [0.6, 0.2, 0.2], "seed": 7, "buffer_m": 20}
    config = config_with(splits=splits)
    config["demo"]["overlay"]["splits"] = {"block_m": 640}
    own = tiling_in_force(config, demo=False)
    assert own.split_spec() == SplitSpec(2560.0, {"train": 0.6, "val": 0.2, "test": 0.2}, 7, 20.0)
    assert own.keys["splits.block_m"] == "splits.block_m"
    demo = tiling_in_force(config, demo=True)
    assert demo.split_spec(group="g").block_m == 640.0 and demo.split_spec(group="g").seed == 7
    assert demo.keys["splits.block_m"] == "demo.overlay.splits.block_m"
    assert data_settings(config, "splits", True) == {**config["splits"], "block_m": 640}


def test_other_sections_get_the_overlay_alike() -> None:
    config = config_with()
    config["demo"]["overlay"]["shards"] = {"max_samples": 8}
    assert data_settings(config, "shards", True) == {**config["shards"], "max_samples": 8}
    assert data_settings(config, "shards", False) == config["shards"]
