"""Tiles half a tile off the grid: they gather the pieces of a small area the grid cut apart, in
one train block only, and leave regions whose grid tiles hold their labels as they are.

The 40 x 40 px raster below has 16-px tiles on rows 8, 24 (block edges at rows 8 and 40, 32-px
blocks) and columns 0, 16; a 10 x 10 px area cut by row 24 leaves two pieces of 50 px, under
the 64 px (25%) a tile needs."""

from __future__ import annotations

import numpy as np
import shapely
from affine import Affine

from emb.classes import IGNORE
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec, count_tiles, label_coverage, plan_tiles

TRANSFORM = Affine(10, 0, 0, 0, -10, 400)


def area(rows: slice, cols: slice) -> np.ndarray:
    labels = np.full((40, 40), IGNORE, np.uint8)
    labels[rows, cols] = 0
    return labels


def footprint(rows: slice, cols: slice) -> shapely.Polygon:
    return shapely.box(cols.start * 10, 400 - rows.stop * 10, cols.stop * 10, 400 - rows.start * 10)


def plan(labels: np.ndarray, split: str = "train") -> list:
    return plan_tiles(labels, TRANSFORM, "r", TileSpec(16), SplitSpec(320.0, {split: 1.0}))[0]


def test_a_shifted_tile_gathers_the_pieces_of_an_area_the_grid_cut() -> None:
    rows, cols = slice(19, 29), slice(3, 13)
    tiles = plan(area(rows, cols))
    assert [(t.row, t.col, t.split, t.labelled) for t in tiles] == [(16, 0, "train", 100)]
    assert label_coverage(area(rows, cols), tiles)["all"]["share"] == 1.0
    split = SplitSpec(320.0, {"train": 1.0})  # counted from the footprint alone, before any job
    assert count_tiles(TRANSFORM, 40, 40, TileSpec(16), split, footprint(rows, cols)) == 1


def test_no_shifted_tile_across_a_block_edge_or_in_val_and_test() -> None:
    """Pieces on both sides of the block edge at row 8 stay apart; validation and test tiles
    never overlap (a scored pixel counts once), so they get no shifted tile."""
    assert plan(area(slice(3, 13), slice(3, 13))) == []
    for split in ("val", "test"):
        assert plan(area(slice(19, 29), slice(3, 13)), split) == []


def test_regions_whose_grid_tiles_hold_their_labels_keep_the_grid() -> None:
    """A fully labelled raster off the grid (slivers of 1 and 3 columns beside its kept tiles):
    the slivers cannot fill a shifted tile, every tile is on the grid."""
    labels = np.zeros((100, 100), np.uint8)
    transform = Affine(10, 0, 150, 0, -10, 1260)  # tiles from row -2 and column 1
    tiles, _ = plan_tiles(labels, transform, "r", TileSpec(16), SplitSpec(320.0, {"train": 1.0}))
    assert {(t.row % 16, t.col % 16) for t in tiles} == {(14, 1)}
    assert label_coverage(labels, tiles)["all"]["share"] == 0.96


def test_shifted_tiles_keep_the_split_buffer() -> None:
    """With ``splits.buffer_m``, a shifted training tile is no nearer than the buffer to a
    block of another split, as a grid tile is: scattered 9 x 9 px plots, cut by the grid
    into pieces under min_valid, over 16 blocks of three splits. The blocks' splits are read
    from a fully labelled twin of the raster (every block shows its tiles)."""
    size, block, buffer, px = 16, 320.0, 40.0, 10.0
    transform = Affine(px, 0, 3200, 0, -px, 6400)  # block edges on the raster's edges
    spec = SplitSpec(block, {"train": 0.5, "val": 0.25, "test": 0.25}, buffer_m=buffer)
    whole, _ = plan_tiles(np.zeros((128, 128), np.uint8), transform, "r", TileSpec(size),
                          SplitSpec(block, spec.fractions))  # fmt: skip
    split_of = {t.block: t.split for t in whole}
    assert len(split_of) == 16 and set(split_of.values()) == {"train", "val", "test"}

    def square(key: str) -> shapely.Polygon:
        bx, by = map(int, key.split(":")[1].split(","))
        return shapely.box(bx * block, by * block, (bx + 1) * block, (by + 1) * block)

    shifted = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        labels = np.full((128, 128), IGNORE, np.uint8)
        for r, c in rng.integers(0, 119, size=(40, 2)):
            labels[r : r + 9, c : c + 9] = 0
        tiles, _ = plan_tiles(labels, transform, "r", TileSpec(size), spec)
        for t in tiles:
            shifted += (t.row % size, t.col % size) != (0, 0)
            x0, y1 = transform * (t.col, t.row)
            box = shapely.box(x0, y1 - size * px, x0 + size * px, y1)
            near = [k for k, s in split_of.items() if s != t.split and box.distance(square(k))
                    < buffer - px / 2]  # fmt: skip
            assert not near, (seed, t, near)
    assert shifted >= 5  # the fill placed tiles: the buffer was tested on them
