"""Tiling and splits: tiles of different splits never share a block, in any raster orientation."""

from __future__ import annotations

import numpy as np
import rasterio
import shapely
from affine import Affine
from conftest import TinyDemo

from emb.classes import IGNORE
from emb.prep.spatial_split import SplitSpec, blocks_of
from emb.prep.tiles import TileSpec, count_tiles, label_coverage, plan_tiles, tile_windows


def test_tiles_of_different_splits_never_share_a_block(tiny_demo: TinyDemo) -> None:
    with rasterio.open(tiny_demo.labels[("tessera", "demo_b")]) as src:
        labels, transform = src.read(1), src.transform
    spec = SplitSpec(block_m=320.0, seed=3)
    tiles, _ = plan_tiles(labels, transform, "demo_b", TileSpec(16), spec)
    owner: dict = {}
    for tile in tiles:
        for block in blocks_of(tile.window, transform, spec.block_m):
            assert owner.setdefault(block, tile.split) == tile.split
    assert {t.split for t in tiles} == {"train", "val", "test"}


def test_bottom_up_raster_tiles_and_splits_like_top_down() -> None:
    labels = np.zeros((64, 64), np.uint8)
    top_down = Affine(10, 0, 0, 0, -10, 640)
    bottom_up = Affine(10, 0, 0, 0, 10, 0)
    spec = SplitSpec(block_m=160.0)
    a, _ = plan_tiles(labels, top_down, "r", TileSpec(16), spec)
    b, _ = plan_tiles(labels[::-1], bottom_up, "r", TileSpec(16), spec)
    # the same ground block holds the same split in both orientations
    split_a = {blocks_of(t.window, top_down, 160.0)[0]: t.split for t in a}
    split_b = {blocks_of(t.window, bottom_up, 160.0)[0]: t.split for t in b}
    assert split_a == split_b and len(split_a) == 16


def test_an_area_smaller_than_a_tile_yields_its_tile_padded_past_the_edge() -> None:
    """25 x 17 px with 32-px tiles: one tile (no refusal), holding every labelled pixel."""
    labels = np.zeros((17, 25), np.uint8)
    transform = Affine(10, 0, 1000, 0, -10, 2240)  # the tile at row 0, column -4
    tiles, _ = plan_tiles(labels, transform, "small", TileSpec(32), SplitSpec(1280.0))
    assert len(tiles) == 1 and tiles[0].labelled == labels.size
    assert label_coverage(labels, tiles)["all"]["share"] == 1.0
    assert count_tiles(transform, 25, 17, TileSpec(32), SplitSpec(1280.0), region="small") == 1


def test_tile_grid_is_anchored_to_the_crs_so_neighbours_line_up() -> None:
    """Two rasters offset by 7 px in one CRS: their tiles' map origins lie on one grid, the
    block edges, and every labelled pixel of each is in a kept tile."""
    spec, tile_spec = SplitSpec(block_m=320.0, seed=1), TileSpec(16, min_valid=0.0)
    origins = set()
    for x0 in (0.0, 70.0):
        transform = Affine(10, 0, x0, 0, -10, 1000)
        labels = np.zeros((50, 45), np.uint8)
        tiles, _ = plan_tiles(labels, transform, "r", tile_spec, spec)
        assert label_coverage(labels, tiles)["all"]["share"] == 1.0
        for t in tiles:
            x, y = transform @ (t.col, t.row)
            origins.add((x % 160.0, y % 160.0))
            bx, by = t.block.rpartition(":")[2].split(",")
            assert t.block.startswith("r:") and (int(bx), int(by)) in blocks_of(
                t.window, transform, 320.0
            )
    assert origins == {(0.0, 0.0)}


def test_count_tiles_names_an_area_with_no_tile_at_min_valid() -> None:
    """A labelled footprint of 3 x 3 px cannot fill 25% of a 16-px tile: 0 tiles; one of
    8 x 8 px within one tile (the grid starts at the block edge 80 m above the raster) fills
    64 of its 256 pixels (25%): 1 tile, as plan_tiles keeps from the same labels."""
    transform = Affine(10, 0, 0, 0, -10, 400)
    small = shapely.box(50, 320, 80, 350)  # pixels 5..7 of the 400-m raster
    assert count_tiles(transform, 40, 40, TileSpec(16), SplitSpec(160.0), small) == 0
    quarter = shapely.box(0, 320, 80, 400)  # rows, columns 0..7: in the tile at row -8, col 0
    assert count_tiles(transform, 40, 40, TileSpec(16), SplitSpec(160.0), quarter) == 1
    labels = np.full((40, 40), IGNORE, np.uint8)
    labels[:8, :8] = 0
    assert len(plan_tiles(labels, transform, "", TileSpec(16), SplitSpec(160.0))[0]) == 1
    assert count_tiles(transform, 40, 40, TileSpec(16), SplitSpec(160.0)) == 9


def test_a_null_stride_tiles_side_by_side() -> None:
    """TileSpec resolves a null stride once (the tile size): the windows abut, no overlap,
    no gaps, as with the stride given."""
    assert TileSpec(16).stride == 16 and TileSpec(16) == TileSpec(16, 16)
    rows = [w.row_off for w in tile_windows(40, 16, TileSpec(16))]
    assert rows == [0, 16, 32]
