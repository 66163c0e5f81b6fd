"""Sliding-window inference over a raster, one block at a time, with blended window edges.

Sliding windows of the training tile size run over the raster on one global grid (origins at
multiples of ``stride = tile - overlap``); where windows overlap, their L3 logits are blended
with a tent weight that falls towards each window's edge, so a pixel is decided mostly by the
windows that see it in their interior and tile edges leave no seams. The raster is processed
block by block: memory holds one block's blended logits ((61 + 1) x block^2 float32) and one
batch of windows, whatever the raster's size; windows that straddle two blocks are computed
for each. Windows are read by pixel offsets, so bottom-up rasters (AEF COGs, ``transform.e >
0``) work like north-up ones, and every window goes through :func:`emb.rasters.shard_arrays`
and the run's own :class:`~emb.loading.dequantize.Dequantize`: the model sees exactly what
training fed it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import rasterio
import torch
from rasterio.windows import Window
from torch import nn

from emb.evaluation.inference import Inference
from emb.evaluation.map_files import NODATA, PROB_SCALE
from emb.loading.dequantize import Dequantize
from emb.rasters import embedding_nodata, shard_arrays, valid_pixels


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
    """What pads a window beyond the raster: its nodata (AEF: -128 when untagged), else NaN."""
    nodata = embedding_nodata(src.dtypes[0], src.nodata)
    return np.nan if nodata is None else nodata


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
    model: nn.Module, dequantize: Dequantize, arrays: list[dict[str, np.ndarray]],
    run: Inference,
) -> np.ndarray:  # fmt: skip
    """(B, 61, T, T) float32 L3 logits of a batch of windows in compact shard form."""
    device = run.device
    batch = {k: torch.from_numpy(np.stack([a[k] for a in arrays])).to(device) for k in arrays[0]}
    batch["label"] = torch.zeros(batch["emb"].shape[0], *batch["emb"].shape[-2:], device=device)
    x, _ = dequantize(batch)
    with run.autocast():
        logits = model(run.inputs(x))["l3"]
    return logits.float().cpu().numpy()


def predict_block(
    model: nn.Module, dequantize: Dequantize, src: rasterio.DatasetReader, source: str,
    block: Window, spec: PredictSpec, run: Inference,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Blended L3 logits (C, h, w) float32, weight sum (h, w) and valid mask (h, w) of one block.

    Pixels of the block covered only by windows without any valid pixel keep weight 0.
    """
    r0, c0, bh, bw = block.row_off, block.col_off, block.height, block.width
    tile, weights = spec.tile, blend_weights(spec.tile)
    nodata = embedding_nodata(src.dtypes[0], src.nodata)
    acc: np.ndarray | None = None
    wsum = np.zeros((bh, bw), np.float32)
    valid = np.zeros((bh, bw), bool)
    rows = tile_origins(r0, r0 + bh, src.height, tile, spec.stride)
    cols = tile_origins(c0, c0 + bw, src.width, tile, spec.stride)
    origins = [(r, c) for r in rows for c in cols]
    for i in range(0, len(origins), spec.batch_size):
        chunk, arrays, masks = [], [], []
        for r, c in origins[i : i + spec.batch_size]:
            where = f"{src.name}: window at row {r}, column {c}"
            compact = shard_arrays(source, read_window(src, r, c, tile), nodata, name=where)
            mask = valid_pixels(source, compact)
            if mask.any():  # an all-nodata window costs no model call
                chunk.append((r, c))
                arrays.append(compact)
                masks.append(mask)
        if not chunk:
            continue
        logits = _window_logits(model, dequantize, arrays, run)
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
