"""Stage: predict a whole region raster with a run's best checkpoint -> a georeferenced L3 map.

Sliding windows of the training tile size run over the raster on one global grid (origins at
multiples of ``stride = tile - overlap``); where windows overlap, their L3 logits are blended
with a tent weight that falls towards each window's edge, so a pixel is decided mostly by the
windows that see it in their interior and tile edges leave no seams. The raster is processed
block by block: memory holds one block's blended logits ((61 + 1) x block^2 float32) and one
batch of windows, whatever the raster's size; windows that straddle two blocks are computed
for each. Windows are read by pixel offsets, so bottom-up rasters (AEF COGs, ``transform.e >
0``) work like north-up ones, and every window goes through :func:`emb.rasters.shard_arrays`
and the run's own :class:`emb.data.Dequantize`: the model sees exactly what training fed it.

Output: a Cloud-Optimized GeoTIFF with the input's CRS, transform and shape, uint8 L3 ids,
255 = nodata (wherever the input embedding is nodata), a colour table of the official CDL
colours, class names in the metadata; optionally a second COG of per-class probabilities; a
PNG quicklook with a legend.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
import torch
from rasterio.enums import Resampling
from rasterio.shutil import copy as copy_raster
from rasterio.windows import Window
from torch import nn

from emb import plots
from emb.cdl_colours import l3_colours
from emb.classes import IGNORE, ClassMap, load_class_map
from emb.data import Dequantize
from emb.io import atomic_path
from emb.rasters import AEF_NODATA, shard_arrays, valid_pixels
from emb.runs import RunError, TrainedRun, open_run

NODATA = IGNORE  # 255 in the map
PROB_SCALE = 254  # probabilities stored as round(p * 254) in uint8; 255 = nodata
QUICKLOOK_MAX = 1024  # pixels on the quicklook's longer side


@dataclass(frozen=True)
class PredictSpec:
    """Window size, overlap (fraction of the window), block side and batch, in pixels."""

    tile: int
    overlap: float = 0.5
    block: int = 1024
    batch_size: int = 16

    @property
    def stride(self) -> int:
        return self.tile - int(round(self.tile * self.overlap))

    def check(self, multiple: int = 1) -> None:
        if self.tile <= 0 or self.tile % multiple:
            raise ValueError(
                f"predict tile {self.tile}: must be a positive multiple of {multiple} "
                "(the model's total downsampling)"
            )
        if not 0.0 <= self.overlap < 1.0 or self.stride < 1:
            raise ValueError(f"predict overlap {self.overlap}: must lie in [0, 1)")
        if self.block < 1 or self.batch_size < 1:
            raise ValueError(
                f"predict block {self.block} and batch {self.batch_size}: must be >= 1"
            )


def window_count(length: int, tile: int, stride: int) -> int:
    """Windows along an axis of ``length`` pixels: origins 0, stride, ... until covered."""
    return 1 + max(0, math.ceil((length - tile) / stride))


def tile_origins(start: int, stop: int, length: int, tile: int, stride: int) -> list[int]:
    """Origins of the grid's windows that intersect pixels [start, stop) of an axis."""
    last = window_count(length, tile, stride) - 1
    first = max(0, (start - tile) // stride + 1)
    return [k * stride for k in range(first, min(last, (stop - 1) // stride) + 1)]


def blend_weights(tile: int) -> np.ndarray:
    """(tile, tile) float32 tent, highest at the centre and near 0 (never 0) at the edges."""
    i = np.arange(tile, dtype=np.float32) + 0.5
    ramp = np.minimum(i, tile - i) / (tile / 2)
    return np.outer(ramp, ramp)


def fill_value(src: rasterio.DatasetReader) -> float:
    """What pads a window beyond the raster: the raster's nodata, else NaN / AEF's -128."""
    if src.nodata is not None:
        return src.nodata
    return np.nan if np.issubdtype(np.dtype(src.dtypes[0]), np.floating) else AEF_NODATA


def read_window(src: rasterio.DatasetReader, row: int, col: int, tile: int) -> np.ndarray:
    """(D, tile, tile) pixels at (row, col), padded with nodata where the raster ends."""
    h = min(tile, src.height - row)
    w = min(tile, src.width - col)
    data = src.read(window=Window(col, row, w, h))
    if (h, w) == (tile, tile):
        return data
    out = np.full((src.count, tile, tile), fill_value(src), dtype=data.dtype)
    out[:, :h, :w] = data
    return out


def blocks(height: int, width: int, block: int) -> Iterator[Window]:
    for row in range(0, height, block):
        for col in range(0, width, block):
            yield Window(col, row, min(block, width - col), min(block, height - row))


@torch.no_grad()
def _window_logits(
    model: nn.Module, prepare: Dequantize, arrays: list[dict[str, np.ndarray]],
    device: torch.device,
) -> np.ndarray:  # fmt: skip
    """(B, 61, T, T) float32 L3 logits of a batch of windows in compact shard form."""
    batch = {k: torch.from_numpy(np.stack([a[k] for a in arrays])).to(device) for k in arrays[0]}
    batch["label"] = torch.zeros(batch["emb"].shape[0], *batch["emb"].shape[-2:], device=device)
    x, _ = prepare(batch)
    return model(x)["l3"].float().cpu().numpy()


def predict_block(
    model: nn.Module, prepare: Dequantize, src: rasterio.DatasetReader, source: str,
    block: Window, spec: PredictSpec, device: torch.device,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Blended L3 logits (C, h, w) float32, weight sum (h, w) and valid mask (h, w) of one block.

    Pixels of the block covered only by windows without any valid pixel keep weight 0.
    """
    r0, c0, bh, bw = block.row_off, block.col_off, block.height, block.width
    tile, weights = spec.tile, blend_weights(spec.tile)
    nodata = src.nodata
    acc: np.ndarray | None = None
    wsum = np.zeros((bh, bw), np.float32)
    valid = np.zeros((bh, bw), bool)
    rows = tile_origins(r0, r0 + bh, src.height, tile, spec.stride)
    cols = tile_origins(c0, c0 + bw, src.width, tile, spec.stride)
    origins = [(r, c) for r in rows for c in cols]
    for i in range(0, len(origins), spec.batch_size):
        chunk, arrays, masks = [], [], []
        for r, c in origins[i : i + spec.batch_size]:
            compact = shard_arrays(source, read_window(src, r, c, tile), nodata)
            mask = valid_pixels(source, compact)
            if mask.any():  # an all-nodata window costs no model call
                chunk.append((r, c))
                arrays.append(compact)
                masks.append(mask)
        if not chunk:
            continue
        logits = _window_logits(model, prepare, arrays, device)
        if acc is None:
            acc = np.zeros((logits.shape[1], bh, bw), np.float32)
        for (r, c), window_logits, mask in zip(chunk, logits, masks, strict=True):
            # the part of window (r, c) inside the block, in block and in window coordinates
            y0, y1 = max(r, r0), min(r + tile, r0 + bh)
            x0, x1 = max(c, c0), min(c + tile, c0 + bw)
            b = np.s_[y0 - r0 : y1 - r0, x0 - c0 : x1 - c0]
            t = np.s_[y0 - r : y1 - r, x0 - c : x1 - c]
            acc[(slice(None), *b)] += weights[t] * window_logits[(slice(None), *t)]
            wsum[b] += weights[t]
            valid[b] = mask[t]
    if acc is None:
        acc = np.zeros((0, bh, bw), np.float32)
    return acc, wsum, valid


def classify(
    acc: np.ndarray, wsum: np.ndarray, valid: np.ndarray, probabilities: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Blended logits -> (h, w) uint8 L3 ids (255 = nodata) and optionally (C, h, w) uint8
    probabilities (round(p * 254), 255 = nodata). Works in place on ``acc`` (no second copy
    of the block's logits)."""
    if acc.shape[0] == 0:
        return np.full(valid.shape, NODATA, np.uint8), None
    ids = np.where(valid, acc.argmax(0), NODATA).astype(np.uint8)
    if not probabilities:
        return ids, None
    acc /= np.where(wsum > 0, wsum, 1.0)  # weighted mean logits
    acc -= acc.max(0, keepdims=True)
    np.exp(acc, out=acc)
    acc /= acc.sum(0, keepdims=True)
    acc *= PROB_SCALE
    probs = np.rint(acc, out=acc).astype(np.uint8)
    probs[:, ~valid] = NODATA
    return ids, probs


def _tmp_sibling(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}.tif")


def _to_cog(tmp: Path, out: Path, resampling: str) -> None:
    """Copy the tiled GeoTIFF ``tmp`` into a COG at ``out`` (atomically), then drop ``tmp``."""
    try:
        with atomic_path(out) as final:
            copy_raster(
                tmp, final, driver="COG", compress="DEFLATE", overview_resampling=resampling,
                blocksize=512,
            )  # fmt: skip
    finally:
        tmp.unlink(missing_ok=True)


def map_profile(src: rasterio.DatasetReader, count: int) -> dict:
    """The input's georeferencing (copied, never rebuilt) for a uint8 output of ``count`` bands."""
    return {
        "driver": "GTiff",
        "width": src.width,
        "height": src.height,
        "count": count,
        "dtype": "uint8",
        "crs": src.crs,
        "transform": src.transform,
        "nodata": NODATA,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
    }


def predict_raster(
    run: TrainedRun, weights: str, raster: Path, cmap: ClassMap, spec: PredictSpec,
    out: Path, probabilities: Path | None = None, device: torch.device | None = None,
    tags: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """Write the L3 map of ``raster`` (and optionally probabilities) as COGs.

    Blocks go into tiled temporary GeoTIFFs, which GDAL then copies into COGs (the COG driver
    only copies); the final files appear atomically, complete or not at all.
    """
    device = device or torch.device("cpu")
    raster = Path(raster)
    if not raster.is_file():
        raise RunError(f"region raster {raster} not found")
    model = run.model(weights, device)
    prepare = run.input_transform().to(device)
    names = list(cmap.l3_names)
    tags = {"CLASS_NAMES": json.dumps(names), **(tags or {})}
    tmp_map = _tmp_sibling(out, "map")
    tmp_prob = _tmp_sibling(probabilities, "prob") if probabilities else None
    try:
        with ExitStack() as stack:
            src = stack.enter_context(rasterio.open(raster))
            run.check_in_dim(src.count, str(raster))
            out.parent.mkdir(parents=True, exist_ok=True)
            dst = stack.enter_context(rasterio.open(tmp_map, "w", **map_profile(src, 1)))
            prob = None
            if tmp_prob is not None:
                profile = map_profile(src, len(names))
                prob = stack.enter_context(rasterio.open(tmp_prob, "w", **profile))
            for block in blocks(src.height, src.width, spec.block):
                acc, wsum, valid = predict_block(
                    model, prepare, src, run.cfg.data.source, block, spec, device
                )
                ids, probs = classify(acc, wsum, valid, prob is not None)
                dst.write(ids, 1, window=block)
                if prob is not None:
                    if probs is None:  # a block without a single valid pixel
                        probs = np.full((len(names), block.height, block.width), NODATA, np.uint8)
                    prob.write(probs, window=block)
            dst.write_colormap(1, colour_table(l3_colours(cmap)))
            dst.set_band_description(1, "L3 class id (names: CLASS_NAMES)")
            dst.update_tags(**tags)
            dst.update_tags(1, **{f"class_{i}": name for i, name in enumerate(names)})
            if prob is not None:
                for i, name in enumerate(names, start=1):
                    prob.set_band_description(i, name)
                prob.scales = [1.0 / PROB_SCALE] * len(names)
                prob.update_tags(ENCODING=f"uint8 round(p * {PROB_SCALE}); 255 = nodata", **tags)
        _to_cog(tmp_map, out, "MODE")
        if probabilities is not None and tmp_prob is not None:
            _to_cog(tmp_prob, probabilities, "AVERAGE")
    finally:
        tmp_map.unlink(missing_ok=True)
        if tmp_prob is not None:
            tmp_prob.unlink(missing_ok=True)


def colour_table(colours: np.ndarray) -> dict[int, tuple[int, int, int, int]]:
    """GDAL colour table: class colours, transparent nodata, the rest black."""
    table = {i: (0, 0, 0, 255) for i in range(256)}
    table.update({i: (int(r), int(g), int(b), 255) for i, (r, g, b) in enumerate(colours)})
    table[NODATA] = (0, 0, 0, 0)
    return table


def read_north_up(path: Path, max_side: int = QUICKLOOK_MAX) -> np.ndarray:
    """The map's ids, decimated to at most ``max_side`` pixels, row 0 = north (bottom-up
    rasters are flipped)."""
    with rasterio.open(path) as src:
        factor = max(1, math.ceil(max(src.height, src.width) / max_side))
        shape = (max(1, src.height // factor), max(1, src.width // factor))
        ids = src.read(1, out_shape=shape, resampling=Resampling.nearest)
        if src.transform.e > 0:
            ids = ids[::-1]
    return ids


def write_quicklook(map_path: Path, png: Path, cmap: ClassMap, title: str) -> None:
    ids = read_north_up(map_path)
    plots.save(plots.map_figure(ids, l3_colours(cmap), cmap.l3_names, title), png)


def default_tile(run: TrainedRun) -> int:
    """The tile size the run was trained on (its manifest's ``tile_size``)."""
    path = Path(run.cfg.data.manifest)
    if not path.is_file():
        raise RunError(f"{path}: manifest of run {run.name} not found; pass --tile")
    return int(json.loads(path.read_text())["tile_size"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="results/runs/{run}")
    parser.add_argument("--checkpoint", default="best.pt", help="file name inside --run-dir")
    parser.add_argument("--raster", type=Path, required=True, help="the region's embedding raster")
    parser.add_argument("--region", required=True)
    parser.add_argument("--classes", type=Path, required=True, help="classes.csv")
    parser.add_argument("--out", type=Path, required=True, help="results/maps/{run}/{region}.tif")
    parser.add_argument("--png", type=Path, required=True, help="quicklook with legend")
    parser.add_argument("--probabilities", type=Path, help="also write per-class probabilities")
    parser.add_argument("--tile", type=int, help="window side (default: the training tile)")
    parser.add_argument("--overlap", type=float, default=0.5, help="fraction of the window")
    parser.add_argument("--block", type=int, default=1024, help="pixels per block side")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        cmap = load_class_map(args.classes)
        run = open_run(args.run_dir, cmap, args.classes, args.checkpoint)
        spec = PredictSpec(
            args.tile or default_tile(run), args.overlap, args.block, args.batch_size
        )
        spec.check(2 ** (len(run.cfg.model.widths) + 1))
        if not args.raster.is_file():
            raise RunError(f"region {args.region!r}: embedding raster {args.raster} not found")
        tags = {"RUN": args.run_dir.name, "REGION": args.region, "WEIGHTS": run.selected,
                "CHECKPOINT": str(run.path)}  # fmt: skip
        predict_raster(
            run, run.selected, args.raster, cmap, spec, args.out, args.probabilities, device, tags
        )
    except (ValueError, FileNotFoundError) as err:  # RunError, CheckpointError, ConfigError
        raise SystemExit(f"error: {err}") from err
    title = f"{args.run_dir.name} on {args.region} ({run.selected} weights)"
    write_quicklook(args.out, args.png, cmap, title)
    print(f"wrote {args.out} and {args.png}")


if __name__ == "__main__":
    main()
