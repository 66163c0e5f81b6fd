"""Tiling and splits: tiles of different splits never share a block, in any raster orientation."""

from __future__ import annotations

import numpy as np
import rasterio
from affine import Affine
from conftest import TinyDemo

from emb.prep.tiles import SplitSpec, TileSpec, blocks_of, plan_tiles


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
