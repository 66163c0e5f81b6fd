"""Sliding-window maps on the model's device: one read per block, every window computed once,
windows blended and classified where the model runs, only uint8 bytes back to the host.

Windows of the training tile size lie on one global grid (origins at multiples of ``stride =
tile - overlap``); where they overlap, their L3 logits are blended with a tent weight that falls
towards each window's edge, so a pixel is decided mostly by the windows that see it in their
interior and tile edges leave no seams.

The raster is processed in blocks aligned to that grid (side: ``predict.block`` rounded up to
a multiple of the stride). Each window belongs to the block that holds its origin, so no window
is computed twice. A block is read once with a halo of ``tile - stride`` pixels below and to
the right (every window it owns lies inside; GDAL decodes with several threads), turned into
shard form by :func:`emb.rasters.shard_arrays` and copied to the device once, compact (int8;
pinned memory and a non-blocking copy on a GPU). There the windows are cut as views,
de-quantized by the run's own :class:`~emb.loading.dequantize.Dequantize` (the model sees
exactly what training fed it), batched through the model, and their tent-weighted logits summed
into a buffer of the block and its halo. The halo's sums belong to pixels of later blocks: the
strip to the right (with the corner below it) goes to the next block of the row, the strip
below to the next row of blocks. When a block's pixels hold every window's share, the argmax,
the nodata mask and the probabilities are computed on the device; only uint8 comes back. A
reader thread reads and prepares the next block while the device works on this one, and a
writer thread writes the previous one. On a CPU the same code runs with torch tensors.

Memory on the device: the block with its halo (int8), its sums ((classes + 1) x (block +
halo)^2 float32), one batch, and the strip carried to the next row of blocks ((classes + 1) x
halo x raster width float32: 250 MiB for an 8192 px wide raster at tile 256, overlap 0.5).
Windows are placed by pixel offsets, so bottom-up rasters (AEF COGs, ``transform.e > 0``) work
like north-up ones.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import rasterio
import torch
from rasterio.windows import Window
from torch import nn

from emb.evaluation.map_files import NODATA, PROB_SCALE
from emb.evaluation.predict_spec import PredictSpec
from emb.io import reading
from emb.loading.dequantize import Dequantize
from emb.models.runtime import Runtime
from emb.rasters import embedding_nodata, shard_arrays, valid_pixels

log = logging.getLogger(__name__)

STRIP_BYTES = 64 << 20  # a float raster's block is read and quantized in strips of this size


def window_count(length: int, tile: int, stride: int) -> int:
    """Windows along an axis of ``length`` pixels: origins 0, stride, ... until covered."""
    return 1 + max(0, math.ceil((length - tile) / stride))


def tile_origins(start: int, stop: int, length: int, tile: int, stride: int) -> list[int]:
    """Origins of the grid's windows that intersect pixels [start, stop) of an axis."""
    last = window_count(length, tile, stride) - 1
    first = max(0, (start - tile) // stride + 1)
    return [k * stride for k in range(first, min(last, (stop - 1) // stride) + 1)]


def owned_origins(start: int, side: int, length: int, tile: int, stride: int) -> list[int]:
    """Origins of the grid's windows in [start, start + side): those a block owns."""
    last = window_count(length, tile, stride) - 1
    first = -(-start // stride)
    return [k * stride for k in range(first, min(last, (start + side - 1) // stride) + 1)]


def blend_weights(tile: int) -> np.ndarray:
    """(tile, tile) float32 tent, highest at the centre and near 0 (never 0) at the edges."""
    i = np.arange(tile, dtype=np.float32) + 0.5
    ramp = np.minimum(i, tile - i) / (tile / 2)
    return np.outer(ramp, ramp)


def fill_value(src: rasterio.DatasetReader) -> float:
    """What pads a window beyond the raster: its nodata (AEF: -128 when untagged), else NaN."""
    nodata = embedding_nodata(src.dtypes[0], src.nodata)
    return np.nan if nodata is None else nodata


def blocks(height: int, width: int, block: int) -> Iterator[Window]:
    """The raster's blocks of side ``block``, row by row (the last ones cut at the edges)."""
    for row in range(0, height, block):
        for col in range(0, width, block):
            yield Window(col, row, min(block, width - col), min(block, height - row))


@dataclass
class BlockData:
    """One block as read, with its halo: compact shard arrays and the windows it owns."""

    window: Window  # the block's own pixels (the map's block)
    arrays: dict[str, torch.Tensor]  # compact (D, h, w) / (h, w) from the block's first pixel
    valid: torch.Tensor  # (h, w) bool: embedding present
    origins: list[tuple[int, int]]  # owned windows with a valid pixel, in block pixels
    owned: int  # every window the block owns (the skipped all-nodata ones too)


@dataclass
class MapBlock:
    """One block of the map: uint8 ids and, when asked, uint8 probabilities (C, h, w)."""

    window: Window
    ids: torch.Tensor
    probs: torch.Tensor | None
    ready: torch.cuda.Event | None = None  # set when the device-to-host copies are done

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()


class BlockReader:
    """Reads a raster's blocks with their halos and prepares them for the device: shard
    form, validity and the windows worth a model call. Runs in a thread of its own."""

    def __init__(self, src: rasterio.DatasetReader, source: str, spec: PredictSpec,
                 device: torch.device) -> None:  # fmt: skip
        self.src, self.source, self.spec, self.device = src, source, spec, device
        self.nodata = embedding_nodata(src.dtypes[0], src.nodata)
        self.fill = fill_value(src)
        self.reads = 0  # GDAL reads, for the bench and the tests

    def extent(self, start: int, length: int) -> tuple[list[int], int]:
        """The owned origins along an axis and how far the block's data must reach."""
        spec = self.spec
        side = spec.grid_block
        origins = owned_origins(start, side, length, spec.tile, spec.stride)
        core = min(side, length - start)
        return origins, max([core, *(o + spec.tile - start for o in origins)])

    def read(self, window: Window) -> BlockData:
        r0, c0 = window.row_off, window.col_off
        src, tile = self.src, self.spec.tile
        rows, data_h = self.extent(r0, src.height)
        cols, data_w = self.extent(c0, src.width)
        arrays = self._compact(r0, c0, data_h, data_w)
        valid = valid_pixels(self.source, arrays)
        origins = [(r - r0, c - c0) for r in rows for c in cols
                   if valid[r - r0 : r - r0 + tile, c - c0 : c - c0 + tile].any()]  # fmt: skip
        return BlockData(window, {k: self._pinned(v) for k, v in arrays.items()},
                         self._pinned(valid), origins, len(rows) * len(cols))  # fmt: skip

    def _compact(self, r0: int, c0: int, height: int, width: int) -> dict[str, np.ndarray]:
        """Shard arrays of the (height, width) pixels from (r0, c0), padded with nodata beyond
        the raster; int8 in one read, float rasters in strips of :data:`STRIP_BYTES`."""
        src = self.src
        item = np.dtype(src.dtypes[0]).itemsize
        step = height if item == 1 else max(1, STRIP_BYTES // (src.count * width * item))
        out: dict[str, np.ndarray] = {}
        for y in range(0, height, step):
            n = min(step, height - y)
            h = max(0, min(n, src.height - r0 - y))
            w = min(width, src.width - c0)
            data = src.read(window=Window(c0, r0 + y, w, h)) if h else None
            self.reads += int(h > 0)
            if data is None or data.shape[1:] != (n, width):
                part = np.full((src.count, n, width), self.fill, src.dtypes[0])
                if data is not None:
                    part[:, :h, :w] = data
                data = part
            where = f"{src.name}: block at row {r0 + y}, column {c0}"
            strip = shard_arrays(self.source, data, self.nodata, name=where)
            if step >= height:
                return strip
            for key, value in strip.items():
                into = out.setdefault(key, np.empty((*value.shape[:-2], height, width),
                                                    value.dtype))  # fmt: skip
                into[..., y : y + n, :] = value
        return out

    def _pinned(self, array: np.ndarray) -> torch.Tensor:
        """A host tensor the device can copy from without blocking (pinned on a GPU)."""
        t = torch.from_numpy(np.ascontiguousarray(array))
        return t.pin_memory() if self.device.type == "cuda" else t


class BlockMapper:
    """Blends and classifies the blocks of one raster on the model's device, in row order,
    carrying the sums of each block's halo to the blocks that own those pixels."""

    def __init__(self, model: nn.Module, dequantize: Dequantize, run: Runtime,
                 spec: PredictSpec, classes: int, width: int,
                 probabilities: bool) -> None:  # fmt: skip
        self.model, self.dequantize, self.run, self.spec = model, dequantize, run, spec
        self.classes, self.probabilities = classes, probabilities
        self.device = run.device
        self.weights = torch.from_numpy(blend_weights(spec.tile)).to(self.device)
        halo = spec.halo
        self.below = (torch.zeros(classes + 1, halo, width, device=self.device)
                      if halo else None)  # fmt: skip
        self.right: torch.Tensor | None = None  # the previous block's right strip
        self.windows = 0  # windows through the model

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    @torch.no_grad()
    def map_block(self, block: BlockData, height: int, width: int) -> MapBlock:
        """The block's map, from its windows and the halo sums of the blocks before it."""
        spec, tile, c = self.spec, self.spec.tile, self.classes
        win = block.window
        r0, c0, bh, bw = win.row_off, win.col_off, win.height, win.width
        acc_h = min(height, r0 + bh + spec.halo) - r0
        acc_w = min(width, c0 + bw + spec.halo) - c0
        acc = torch.zeros(c + 1, acc_h, acc_w, device=self.device)  # sums, then weight sum
        if c0 == 0:
            self.right = None
        if self.below is not None and r0 > 0:
            top = min(spec.halo, bh)
            acc[:, :top, :bw] += self.below[:, :top, c0 : c0 + bw]
        if self.right is not None:
            acc[:, :, : self.right.shape[-1]] += self.right
        arrays = {k: self._to_device(v) for k, v in block.arrays.items()}
        valid = self._to_device(block.valid)
        for i in range(0, len(block.origins), spec.batch_size):
            chunk = block.origins[i : i + spec.batch_size]
            logits = self._logits(arrays, chunk)
            for (r, col), window_logits in zip(chunk, logits, strict=True):
                h, w = min(tile, acc_h - r), min(tile, acc_w - col)
                weight = self.weights[:h, :w]
                acc[:c, r : r + h, col : col + w].addcmul_(window_logits[:, :h, :w], weight)
                acc[c, r : r + h, col : col + w] += weight
        self.right = acc[:, :, bw:] if acc_w > bw else None
        if self.below is not None and acc_h > bh:
            self.below[:, : acc_h - bh, c0 : c0 + bw] = acc[:, bh:, :bw]
        return self._classify(win, acc[:, :bh, :bw], valid[:bh, :bw])

    @torch.no_grad()
    def _logits(
        self, arrays: dict[str, torch.Tensor], chunk: list[tuple[int, int]]
    ) -> torch.Tensor:
        """(B, C, T, T) float32 L3 logits of the windows at ``chunk`` (block pixels)."""
        tile = self.spec.tile
        batch = {k: torch.stack([v[..., r : r + tile, c : c + tile] for r, c in chunk])
                 for k, v in arrays.items()}  # fmt: skip
        batch["label"] = torch.zeros(len(chunk), 1, 1, device=self.device)
        x, _ = self.dequantize(batch)
        with self.run.autocast():
            logits = self.model(self.run.inputs(x))["l3"]
        if logits.shape[1] != self.classes:
            raise ValueError(
                f"the model gives {logits.shape[1]} L3 logits per pixel, expected "
                f"{self.classes} (the classes' L3 names)"
            )
        self.windows += len(chunk)
        return logits.float()

    def _classify(self, win: Window, acc: torch.Tensor, valid: torch.Tensor) -> MapBlock:
        """Blended sums -> uint8 ids (255 = nodata) and optionally uint8 probabilities
        (round(p * 254), 255 = nodata), started on their way to the host."""
        c = self.classes
        nodata = torch.tensor(NODATA, dtype=torch.uint8, device=self.device)
        ids = torch.where(valid, acc[:c].argmax(0).to(torch.uint8), nodata)
        probs = None
        if self.probabilities:
            wsum = acc[c]
            mean = acc[:c] / torch.where(wsum > 0, wsum, torch.ones_like(wsum))
            p = torch.softmax(mean, dim=0)  # max-subtracted inside
            probs = torch.where(valid, torch.round(p * PROB_SCALE).to(torch.uint8), nodata)
        if self.device.type != "cuda":
            return MapBlock(win, ids, probs)
        host = [_pinned_copy(ids), None if probs is None else _pinned_copy(probs)]
        ready = torch.cuda.Event()
        ready.record()
        return MapBlock(win, host[0], host[1], ready)


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def map_blocks(
    model: nn.Module, dequantize: Dequantize, src: rasterio.DatasetReader, source: str,
    spec: PredictSpec, run: Runtime, classes: int, probabilities: bool,
) -> Iterator[MapBlock]:  # fmt: skip
    """Every block of ``src`` mapped, in row order, the next block read in a thread while
    this one is on the device."""
    reader = BlockReader(src, source, spec, run.device)
    mapper = BlockMapper(model, dequantize, run, spec, classes, src.width, probabilities)
    todo = list(blocks(src.height, src.width, spec.grid_block))

    def read(window: Window) -> BlockData:
        with reading(src.name):
            return reader.read(window)

    skipped = 0
    with ThreadPoolExecutor(1, thread_name_prefix="emb-read") as pool:
        ahead: Future | None = pool.submit(read, todo[0]) if todo else None
        for i in range(len(todo)):
            assert ahead is not None
            block = ahead.result()
            ahead = pool.submit(read, todo[i + 1]) if i + 1 < len(todo) else None
            yield mapper.map_block(block, src.height, src.width)
            skipped += block.owned - len(block.origins)
    log.info("%s: %d blocks read once each (%d GDAL reads), %d windows through the model, "
             "%d without data skipped", src.name, len(todo), reader.reads, mapper.windows,
             skipped)  # fmt: skip
