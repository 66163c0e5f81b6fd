"""Share of labelled pixels that lie in a kept tile: the old tiling (tiles wholly inside the
raster from the first block edge) beside the CRS-anchored grid padded past the edge.

Synthetic fully labelled 10 m regions at random offsets from the block grid, the default
config's tiles (256 px, min_valid 0.25) and blocks (5120 m), then the demo's 64-px tiles. Run:
``OMP_NUM_THREADS=1 .venv/bin/python bench/coverage.py``.
"""

from __future__ import annotations

import numpy as np
from affine import Affine

from emb.prep.tiles import (
    SplitSpec,
    Tile,
    TileSpec,
    TilingError,
    block_aligned_offset,
    label_coverage,
    plan_tiles,
)

SIZES = [(175, 251), (200, 250), (300, 300), (512, 512), (1000, 800), (3000, 3000)]


def old_share(labels: np.ndarray, transform: Affine, tile: TileSpec, split: SplitSpec) -> float:
    """The former tiling: windows inside the raster only; refused when smaller than a tile."""
    height, width = labels.shape
    if tile.size > min(height, width):
        return float("nan")  # refused: "tile_size is larger than the raster"
    r0, c0 = block_aligned_offset(transform, tile.size, split.block_m)
    tiles = [
        Tile(r, c, tile.size, "train", tile.size * tile.size)
        for r in range(r0, height - tile.size + 1, tile.size)
        for c in range(c0, width - tile.size + 1, tile.size)
    ]
    return label_coverage(labels, tiles)["all"]["share"]


def main() -> None:
    for size, block_m in ((256, 5120.0), (64, 1280.0)):
        table(TileSpec(size, min_valid=0.25), SplitSpec(block_m))


def table(tile: TileSpec, split: SplitSpec) -> None:
    rng = np.random.default_rng(0)
    print(f"tiles {tile.size} px, blocks {split.block_m:g} m, min_valid {tile.min_valid}")
    print(f"{'region (px)':>14} {'old':>7} {'new':>7}  (mean over 8 offsets; nan: refused)")
    for height, width in SIZES:
        old, new = [], []
        for _ in range(8):
            x0, y0 = rng.integers(0, 512, 2) * 10.0
            transform = Affine(10, 0, 300000 + x0, 0, -10, 4000000 + y0)
            labels = np.zeros((height, width), np.uint8)
            old.append(old_share(labels, transform, tile, split))
            try:
                kept, _ = plan_tiles(labels, transform, "r", tile, split)
            except TilingError:
                kept = []
            new.append(label_coverage(labels, kept)["all"]["share"])
        print(f"{height:>6}x{width:<7} {np.mean(old):7.1%} {np.mean(new):7.1%}")


if __name__ == "__main__":
    main()
