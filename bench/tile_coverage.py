"""Share of labelled pixels that lie in a kept tile, and what keeping them costs.

Columns: ``old`` (the former tiling: tiles wholly inside the raster from the first block edge,
refused when the raster is smaller than a tile), then the CRS-anchored grid padded past the
edge at several ``tiles.min_valid``, per value: ``bound``, the most any tiling can cover
while each tile lies in one split block (the labelled pixels of every block that holds
``min_valid`` of a tile of them, as if tiles could cover them whole); ``grid``, the share the
grid's tiles cover; ``+half``, with the training tiles half a tile off the grid
(emb.prep.shifted_tiles); the kept tiles and their ``fill`` (labelled pixels over all pixels of
the kept tiles: what the shards and the training steps spend on nodata).

Synthetic 10 m regions at 64 random offsets from the block grid, labelled everywhere
(``rect``) or inside the ellipse their box holds (``ellipse``: an area drawn as a polygon),
with the default config's tiles (256 px) and blocks (5120 m), then the demo's 64-px tiles
and 1280-m blocks. Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/tile_coverage.py [--quick]``
(about two minutes on 2 cores; ``--quick``: two small regions at 2 offsets, seconds).
"""

from __future__ import annotations

import argparse

import numpy as np
from affine import Affine

from emb.classes import IGNORE
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import Tile, TileSpec, block_aligned_offset, label_coverage, plan_tiles

SIZES = [(175, 251), (200, 250), (300, 300), (512, 512), (1000, 800), (3000, 3000)]
MIN_VALID = (0.25, 0.1, 0.05)
OFFSETS = 64


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


def region_labels(height: int, width: int, shape: str) -> np.ndarray:
    """(H, W) uint8: 0 where labelled, IGNORE elsewhere (outside the ellipse)."""
    if shape == "rect":
        return np.zeros((height, width), np.uint8)
    y, x = np.ogrid[:height, :width]
    inside = ((y + 0.5) / height - 0.5) ** 2 + ((x + 0.5) / width - 0.5) ** 2 <= 0.25
    return np.where(inside, 0, IGNORE).astype(np.uint8)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small regions, 2 offsets")
    args = parser.parse_args(argv)
    sizes, offsets = (SIZES[:2], 2) if args.quick else (SIZES, OFFSETS)
    for size, block_m in ((256, 5120.0), (64, 1280.0)):
        for shape in ("rect", "ellipse"):
            table(size, SplitSpec(block_m), shape, sizes, offsets)


def table(
    size: int, split: SplitSpec, shape: str, sizes: list[tuple[int, int]], offsets: int
) -> None:
    rng = np.random.default_rng(0)
    print(f"\n{shape}: tiles {size} px, blocks {split.block_m:g} m; mean of {offsets} offsets")
    head = "".join(f" | mv {mv:<4g} bound   grid  +half tiles  fill" for mv in MIN_VALID)
    print(f"{'region (px)':>13} {'old':>6}{head}")
    for height, width in sizes:
        labels = region_labels(height, width, shape)
        old, rows = [], {mv: [] for mv in MIN_VALID}
        for _ in range(offsets):
            x0, y0 = rng.integers(0, 512, 2) * 10.0
            transform = Affine(10, 0, 300000 + x0, 0, -10, 4000000 + y0)
            old.append(old_share(labels, transform, TileSpec(size), split))
            r0, c0 = block_aligned_offset(transform, size, split.block_m)
            per_block = block_share(labels, transform, split.block_m)
            for mv in MIN_VALID:
                kept, _ = plan_tiles(labels, transform, "r", TileSpec(size, min_valid=mv), split)
                grid = [t for t in kept if (t.row - r0) % size == 0 and (t.col - c0) % size == 0]
                fill = sum(t.labelled for t in kept) / max(len(kept) * size * size, 1)
                best = float(np.mean(per_block >= mv * size * size))
                rows[mv].append((best, share(labels, grid), share(labels, kept), len(kept), fill))
        cells = "".join(
            " | {:>7} {:5.1%} {:6.1%} {:6.1%} {:5.1f} {:5.1%}".format(
                "", *np.mean(rows[mv], axis=0)
            )
            for mv in MIN_VALID
        )
        print(f"{height:>5}x{width:<7} {np.mean(old):6.1%}{cells}")


def block_share(labels: np.ndarray, transform: Affine, block_m: float) -> np.ndarray:
    """Per labelled pixel: how many labelled pixels its split block holds (north-up rasters)."""
    rows, cols = np.nonzero(labels != IGNORE)
    x, y = transform * (cols + 0.5, rows + 0.5)
    blocks = np.floor(x / block_m) * 1e6 + np.floor(y / block_m)
    _, inverse, counts = np.unique(blocks, return_inverse=True, return_counts=True)
    return counts[inverse]


def share(labels: np.ndarray, tiles: list[Tile]) -> float:
    return label_coverage(labels, tiles)["all"]["share"]


if __name__ == "__main__":
    main()
