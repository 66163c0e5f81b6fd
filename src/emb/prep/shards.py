"""Stage: cut one region's tiles and write them as WebDataset shards, per split.

A sample (docs/design.md): ``__key__`` = ``{region}_{row}_{col}``, ``emb.npy`` (D, T, T) int8,
``label.npy`` (T, T) uint8 L3 (255 = ignore), ``meta.json``; TESSERA adds ``scale.npy`` (T, T)
float32, and its training tiles ``moments.npy`` (3, D) float64 (:mod:`emb.prep.moments`), so
that the statistics need not read them again. Each shard has an index sidecar
(:mod:`emb.loading.sidecar`). Shards and sidecars are staged and published together when the
region is complete.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import TypeVar

import numpy as np
import rasterio
from affine import Affine

from emb import stage_runner
from emb.classes import IGNORE, N_L3
from emb.config_schema import config_default, config_option
from emb.io import json_text, reading
from emb.loading.buffer_pool import BufferPool
from emb.prep.moments import moments_array, stores_moments, tile_moments
from emb.prep.region_index import new_index, tile_key
from emb.prep.shard_writer import Payload, TarShard, encode_npy, publish_shards, write_shards
from emb.prep.spatial_split import SPLITS, SplitSpec, TilingError
from emb.prep.tiles import Tile, TileSpec, label_coverage, plan_tiles
from emb.progress import Progress
from emb.rasters import BANDS, embedding_nodata, product_tags, shard_arrays
from emb.threads import read_ahead

__all__ = ["TarShard", "build_region", "encode_npy", "tile_samples", "write_shards"]
T = TypeVar("T")
GDAL_CACHE_MB = 64  # tiles are read once: a large block cache only inflates memory
log = logging.getLogger(__name__)


class BandCountError(ValueError):
    """An embedding raster with another band count than its source has."""


def tile_samples(
    source: str, region: str, emb: rasterio.DatasetReader, labels: np.ndarray, tiles: list[Tile]
) -> Iterator[dict[str, str | Payload]]:
    """Encoded WebDataset samples of ``tiles``, read window by window."""
    crs = emb.crs.to_string()  # once per region: the conversion is not free
    # TESSERA's large float blocks come from mmap when fresh: reading into recycled, already
    # mapped ones saves faulting their pages in for every tile (AEF's int8 blocks do not).
    quantized = source != "aef"
    pool = BufferPool(keep=4)
    dtype = np.dtype(emb.dtypes[0])

    fill = embedding_nodata(dtype, emb.nodata)
    fill = 0 if fill is None else fill  # an all-zero vector is nodata for both sources
    height, width = labels.shape

    def read(tile: Tile) -> tuple[Tile, np.ndarray]:
        out = pool.take((emb.count, tile.size, tile.size), dtype) if quantized else None
        inside = tile.row >= 0 and tile.col >= 0
        inside = inside and tile.row + tile.size <= height and tile.col + tile.size <= width
        if inside:
            return tile, emb.read(window=tile.window, out=out)
        # past the raster's edge: nodata there (a boundless read through a VRT; edge tiles only)
        return tile, emb.read(window=tile.window, out=out, boundless=True, fill_value=fill)

    # Threads start on first use: AEF, which needs no quantization, never starts them.
    # closing(): the read-ahead thread has finished before the caller closes ``emb``, also
    # when writing failed (a read into a closed GDAL dataset crashes the process).
    with (
        ThreadPoolExecutor(2, thread_name_prefix="quantize") as quantizers,
        closing(read_ahead(read(t) for t in tiles)) as blocks,
    ):
        for tile, block in blocks:
            win = tile.window
            q = pool.take(block.shape, np.dtype(np.int8)) if quantized else None
            where = f"{emb.name}: tile at row {tile.row}, column {tile.col}"
            arrays = shard_arrays(source, block, emb.nodata, q, quantizers.map, where)
            arrays["label"] = tile_labels(labels, tile)
            if tile.split == "train" and stores_moments(source):  # what the statistics read
                arrays["moments"] = moments_array(*tile_moments(source, arrays))
            meta = {
                "region": region,
                "source": source,
                "window": [tile.col, tile.row, tile.size, tile.size],
                "block": tile.block,
                "crs": crs,
                "transform": list(emb.window_transform(win))[:6],
            }
            sample: dict[str, str | Payload] = {"__key__": tile_key(region, tile.row, tile.col)}
            sample.update({f"{name}.npy": encode_npy(a) for name, a in arrays.items()})
            sample["meta.json"] = (json_text(meta).encode(),)
            yield sample


def tile_labels(labels: np.ndarray, tile: Tile) -> np.ndarray:
    """The tile's (T, T) labels; pixels past the raster's edge are ``IGNORE``."""
    out = np.full((tile.size, tile.size), IGNORE, labels.dtype)
    r0, c0 = max(tile.row, 0), max(tile.col, 0)
    r1, c1 = min(tile.row + tile.size, labels.shape[0]), min(tile.col + tile.size, labels.shape[1])
    if r1 > r0 and c1 > c0:
        out[r0 - tile.row : r1 - tile.row, c0 - tile.col : c1 - tile.col] = labels[r0:r1, c0:c1]
    return out


def build_region(
    source: str,
    region: str,
    emb_path: Path,
    label_path: Path,
    out_dir: Path,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    fixed_split: str | None = None,
    max_samples: int | None = None,
    max_bytes: int | None = None,
    index_path: Path | None = None,
) -> dict:
    """Shards of one region for every split; returns the region's index (see manifest), also
    written to ``index_path`` (a file in ``out_dir``) when given. ``max_samples`` and
    ``max_bytes`` left None are the config schema's ``shards`` defaults.

    Shards are written into a staging folder and moved into ``out_dir`` only when every
    split is complete: a failed build (bad input, disk full, SIGTERM) removes the staging
    folder and leaves the shards and index of the previous build untouched.
    """
    if max_samples is None:
        max_samples = int(config_default("shards.max_samples"))
    if max_bytes is None:
        max_bytes = int(config_default("shards.max_bytes"))
    labels, transform = read_labels(label_path)
    tiles, dropped = planned_tiles(label_path, labels, transform, region, tile_spec, split_spec,
                                   fixed_split)  # fmt: skip
    group = split_spec.group or region
    index = new_index(source, region, BANDS[source], tile_spec.size, group, dropped,
                      label_coverage(labels, tiles))  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))
    progress = Progress(len(tiles), unit="tiles", what=f"{source}/{region} shards", logger=log)
    try:
        with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_MB << 20), rasterio.open(emb_path) as emb:
            check_band_count(emb, source, emb_path)
            index["product_tags"] = product_tags(emb.tags())
            for split in SPLITS:
                chosen = [t for t in tiles if t.split == split]
                samples = tile_samples(source, region, emb, labels, chosen)
                with reading(emb_path), closing(samples):
                    shards = write_shards(_counted(samples, progress),
                                          str(staging / f"{split}-%04d.tar"), max_samples,
                                          max_bytes)  # fmt: skip
                index["splits"][split] = split_entry(region, labels, chosen, shards)
        publish_shards(staging, out_dir, index, index_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress.done()
    return index


def read_labels(label_path: Path) -> tuple[np.ndarray, Affine]:
    """The region's (H, W) uint8 labels and their transform, read whole (tiles plan on them)."""
    with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_MB << 20), rasterio.open(label_path) as src:
        with reading(label_path):
            labels = src.read(1)
        return labels, src.transform


def planned_tiles(
    label_path: Path,
    labels: np.ndarray,
    transform: Affine,
    region: str,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    fixed_split: str | None,
) -> tuple[list[Tile], dict[str, Counter[str]]]:
    """:func:`emb.prep.tiles.plan_tiles`, refused (naming ``label_path``) when it keeps no
    tile: a region without tiles is a mistake in its tiling or its labels, never an empty
    shard set."""
    try:
        tiles, dropped = plan_tiles(labels, transform, region, tile_spec, split_spec, fixed_split)
    except TilingError as err:
        raise TilingError(f"{label_path}: {err}") from err
    if not tiles:
        raise TilingError(
            f"{label_path}: no tile of {tile_spec.size} px has >= {tile_spec.min_valid:.0%} "
            f"labelled pixels (dropped: { ({k: dict(v) for k, v in dropped.items() if v}) })"
        )
    return tiles, dropped


def check_band_count(emb: rasterio.DatasetReader, source: str, emb_path: Path) -> None:
    """Refuse an embedding raster with another band count than ``source`` has."""
    if emb.count != BANDS[source]:
        raise BandCountError(
            f"{emb_path}: expected {BANDS[source]} bands for {source}, found {emb.count}"
        )


def split_entry(region: str, labels: np.ndarray, chosen: list[Tile], shards: list[dict]) -> dict:
    """A split's entry in the region's index: its shards, samples, labelled pixels and class
    histogram, and each sample's split block (evaluate's spatial-block bootstrap)."""
    hist = np.zeros(N_L3, np.int64)
    for t in chosen:
        patch = tile_labels(labels, t)
        hist += np.bincount(patch[patch != IGNORE], minlength=N_L3)[:N_L3]
    n = sum(s["samples"] for s in shards)
    return {
        "shards": shards,
        "samples": n,
        "labelled_pixels": int(hist.sum()),
        "class_hist": hist.tolist(),
        "blocks": {tile_key(region, t.row, t.col): t.block for t in chosen},
        "bytes_per_sample": sum(s["bytes"] for s in shards) / n if n else 0,
    }


def _counted(samples: Iterator[T], progress: Progress) -> Iterator[T]:
    for sample in samples:
        yield sample
        progress.advance()


def _extent(text: str) -> tuple[float, float, float, float] | None:
    """``x0,y0,x1,y1`` (map units), or None for an empty value."""
    if not text.strip():
        return None
    try:
        x0, y0, x1, y1 = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected x0,y0,x1,y1, found {text!r}") from None
    return (x0, y0, x1, y1)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, choices=sorted(BANDS))
    parser.add_argument("--region", required=True)
    parser.add_argument("--emb", type=Path, required=True)
    parser.add_argument("--labels", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True, help="output: region index JSON")
    # The tiling's scale has no default (the rule passes the config's or the demo's); the
    # rest default to the config schema's, as a run of the workflow gets them.
    parser.add_argument("--tile-size", type=int, required=True, help="config tiles.size")
    parser.add_argument(
        "--stride", type=int, default=None, help="config tiles.stride (default: the tile size)"
    )
    parser.add_argument("--block-m", type=float, required=True, help="config splits.block_m")
    parser.add_argument("--min-valid", type=float, **config_option("tiles.min_valid"))
    parser.add_argument(
        "--fractions",
        type=float,
        nargs=3,
        metavar=("TRAIN", "VAL", "TEST"),
        **config_option("splits.fractions"),
    )
    parser.add_argument("--seed", type=int, **config_option("splits.seed"))
    parser.add_argument("--buffer-m", type=float, **config_option("splits.buffer_m"))
    parser.add_argument("--split", default="", help="whole region in one split (regions.tsv)")
    parser.add_argument(
        "--split-key", default="", help="id the blocks are drawn with (the years of one ground)"
    )
    parser.add_argument(
        "--split-extent", type=_extent, default=None, help="x0,y0,x1,y1 of that ground's blocks"
    )
    parser.add_argument("--max-samples", type=int, **config_option("shards.max_samples"))
    parser.add_argument("--max-bytes", type=int, **config_option("shards.max_bytes"))
    args = parser.parse_args(argv)
    fixed = args.split if args.split in SPLITS else None
    index = build_region(
        args.source,
        args.region,
        args.emb,
        args.labels,
        args.index.parent,
        TileSpec(args.tile_size, args.stride, args.min_valid),
        SplitSpec(
            args.block_m,
            dict(zip(SPLITS, args.fractions, strict=True)),
            args.seed,
            args.buffer_m,
            args.split_key,
            args.split_extent,
        ),
        fixed,
        args.max_samples,
        args.max_bytes,
        args.index,
    )
    counts = {s: v["samples"] for s, v in index["splits"].items()}
    log.info("%s/%s: samples %s, dropped %s", args.source, args.region, counts, index["dropped"])


if __name__ == "__main__":
    main()
