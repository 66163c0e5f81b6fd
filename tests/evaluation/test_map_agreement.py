"""Maps on the device's path: the same maps as the host algorithm they replaced, every block
read once, every window through the model once.

``reference_map`` below is the algorithm of emb 0dcd26c (``emb.evaluation.windows``'s
``predict_block`` and ``classify``), kept here as the yardstick: each window read on its own,
windows straddling two blocks computed for each, logits blended and classified in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from conftest import CLASSES_CSV, TinyDemo
from rasterio.windows import Window
from tiny_runs import tiny_run

from emb.classes import load_class_map
from emb.evaluation.predict import predict_raster
from emb.evaluation.predict_spec import PredictSpec
from emb.evaluation.runs import TrainedRun, open_run
from emb.evaluation.windows import map_blocks
from emb.models.runtime import Runtime
from emb.prep.demo_region import DEMO_REGIONS
from emb.rasters import embedding_nodata, shard_arrays, valid_pixels

TILE = 32
RUNS = [("aef", "segformer"), ("aef", "deeplab"), ("tessera", "segformer"), ("tessera", "deeplab")]
REGIONS = [r.name for r in DEMO_REGIONS]


# --- the replaced algorithm (emb 0dcd26c), numpy on the host -------------------------------


def _origins(start: int, stop: int, length: int, tile: int, stride: int) -> list[int]:
    last = 1 + max(0, math.ceil((length - tile) / stride)) - 1
    first = max(0, (start - tile) // stride + 1)
    return [k * stride for k in range(first, min(last, (stop - 1) // stride) + 1)]


def _tent(tile: int) -> np.ndarray:
    i = np.arange(tile, dtype=np.float32) + 0.5
    ramp = np.minimum(i, tile - i) / (tile / 2)
    return np.outer(ramp, ramp)


def _read_window(src: rasterio.DatasetReader, row: int, col: int, tile: int) -> np.ndarray:
    h, w = min(tile, src.height - row), min(tile, src.width - col)
    data = src.read(window=Window(col, row, w, h))
    if (h, w) == (tile, tile):
        return data
    nodata = embedding_nodata(src.dtypes[0], src.nodata)
    out = np.full((src.count, tile, tile), np.nan if nodata is None else nodata, data.dtype)
    out[:, :h, :w] = data
    return out


@torch.no_grad()
def reference_map(
    run: TrainedRun, raster: Path, spec: PredictSpec
) -> tuple[np.ndarray, np.ndarray]:
    """(H, W) uint8 ids and (C, H, W) uint8 probabilities as emb 0dcd26c computed them."""
    model, dequantize, source = (
        run.model(run.selected).eval(),
        run.dequantize(),
        run.cfg.data.source,
    )
    tile, weights = spec.tile, _tent(spec.tile)
    seen: dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]] = {}
    with rasterio.open(raster) as src:
        nodata = embedding_nodata(src.dtypes[0], src.nodata)
        ids = np.full((src.height, src.width), 255, np.uint8)
        probs = np.full((61, src.height, src.width), 255, np.uint8)
        for r0 in range(0, src.height, spec.block):
            for c0 in range(0, src.width, spec.block):
                bh, bw = min(spec.block, src.height - r0), min(spec.block, src.width - c0)
                acc = np.zeros((61, bh, bw), np.float32)
                wsum = np.zeros((bh, bw), np.float32)
                valid = np.zeros((bh, bw), bool)
                rows = _origins(r0, r0 + bh, src.height, tile, spec.stride)
                cols = _origins(c0, c0 + bw, src.width, tile, spec.stride)
                for r in rows:
                    for c in cols:
                        if (r, c) not in seen:  # the same logits each time: computed once here
                            compact = shard_arrays(source, _read_window(src, r, c, tile), nodata)
                            mask = valid_pixels(source, compact)
                            logits = None
                            if mask.any():
                                batch = {k: torch.from_numpy(v[None]) for k, v in compact.items()}
                                batch["label"] = torch.zeros(1, tile, tile)
                                logits = model(dequantize(batch)[0])["l3"].float().numpy()[0]
                            seen[(r, c)] = mask, logits
                        mask, logits = seen[(r, c)]
                        if logits is None:
                            continue
                        y0, y1 = max(r, r0), min(r + tile, r0 + bh)
                        x0, x1 = max(c, c0), min(c + tile, c0 + bw)
                        b = np.s_[y0 - r0 : y1 - r0, x0 - c0 : x1 - c0]
                        t = np.s_[y0 - r : y1 - r, x0 - c : x1 - c]
                        acc[(slice(None), *b)] += weights[t] * logits[(slice(None), *t)]
                        wsum[b] += weights[t]
                        valid[b] = mask[t]
                out = np.s_[r0 : r0 + bh, c0 : c0 + bw]
                ids[out] = np.where(valid, acc.argmax(0), 255).astype(np.uint8)
                acc /= np.where(wsum > 0, wsum, 1.0)
                acc -= acc.max(0, keepdims=True)
                np.exp(acc, out=acc)
                acc /= acc.sum(0, keepdims=True)
                p = np.rint(acc * 254).astype(np.uint8)
                p[:, ~valid] = 255
                probs[(slice(None), *out)] = p
    return ids, probs


# --- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Callable:
    """The tiny demo's runs (both sources, both architectures), briefly fitted, each when a
    test first asks for it."""
    root = tmp_path_factory.mktemp("agreement")
    made: dict[tuple[str, str], Path] = {}

    def run_of(key: tuple[str, str]) -> Path:
        if key not in made:
            made[key] = tiny_run(tiny_demo, root, key[0], key[1], steps=16)
        return made[key]

    return run_of


def opened(run_dir: Path) -> TrainedRun:
    return open_run(run_dir, load_class_map(CLASSES_CSV), CLASSES_CSV)


# every run at the default overlap with blocks that windows straddle; one run at other
# overlaps, one block for the whole raster, and blocks no wider than the halo
CASES = [(run, 0.5, 48) for run in RUNS] + [
    (RUNS[0], overlap, block) for overlap, block in ((0.5, 1024), (0.25, 40), (0.75, 24), (0.0, 48))
]


@pytest.mark.parametrize(
    ("run_key", "overlap", "block"), CASES, ids=[f"{'_'.join(r)}-{o}-{b}" for r, o, b in CASES]
)
def test_maps_agree_with_the_replaced_host_algorithm(
    runs: Callable, tiny_demo: TinyDemo, tmp_path: Path, run_key: tuple, overlap: float, block: int
) -> None:
    """Every demo run, both regions (one bottom-up), several overlaps and blocks (windows
    straddling blocks, blocks smaller than the halo): >= 99.9% of pixels equal, nodata
    identical, probabilities within 1/254."""
    run = opened(runs(run_key))
    cmap = load_class_map(CLASSES_CSV)
    spec = PredictSpec(TILE, overlap, block, 8)
    for region in REGIONS:
        raster = tiny_demo.rasters[region][run_key[0]]
        out, prob = tmp_path / f"{region}.tif", tmp_path / f"{region}_prob.tif"
        predict_raster(run, run.selected, raster, cmap, spec, out, prob)
        with rasterio.open(out) as a, rasterio.open(prob) as b:
            ids, probs = a.read(1), b.read()
        want_ids, want_probs = reference_map(run, raster, spec)
        assert ((ids == 255) == (want_ids == 255)).all(), f"{region}: nodata moved"
        assert (want_ids == 255).any() and (want_ids != 255).any()
        agree = (ids == want_ids).mean()
        assert agree >= 0.999, f"{region}: {agree:.5f} of pixels agree"
        assert ((probs == 255) == (want_probs == 255)).all()
        gap = np.abs(probs.astype(int) - want_probs.astype(int)).max()
        assert gap <= 1, f"{region}: probabilities differ by {gap}/254"


def grid_windows_with_data(raster: Path, source: str, spec: PredictSpec) -> int:
    """Windows of the whole raster's grid holding a valid pixel, counted from the raster."""
    with rasterio.open(raster) as src:
        valid = valid_pixels(source, shard_arrays(source, src.read(), src.nodata))
        rows = _origins(0, src.height, src.height, spec.tile, spec.stride)
        cols = _origins(0, src.width, src.width, spec.tile, spec.stride)
    return sum(bool(valid[r : r + spec.tile, c : c + spec.tile].any()) for r in rows for c in cols)


@pytest.mark.parametrize("source", ["aef", "tessera"])
@pytest.mark.parametrize(("overlap", "block"), [(0.5, 48), (0.5, 32), (0.75, 40), (0.0, 64)])
def test_every_block_is_read_once_and_no_window_is_computed_twice(
    runs: Callable, tiny_demo: TinyDemo, monkeypatch: pytest.MonkeyPatch, source: str,
    overlap: float, block: int,
) -> None:  # fmt: skip
    """GDAL reads counted on the real dataset class, windows counted as the model receives
    them: one read per block (its halo included), as many windows as the grid has with data."""
    run = opened(runs((source, "segformer")))
    raster = tiny_demo.rasters["demo_a"][source]
    spec = PredictSpec(TILE, overlap, block, 5)
    expected = grid_windows_with_data(raster, source, spec)
    reads: list[Window] = []
    real_read = rasterio.io.DatasetReader.read

    def counted_read(self, *args, **kwargs):  # the real read, counted
        if Path(self.name) == raster:
            reads.append(kwargs.get("window"))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(rasterio.io.DatasetReader, "read", counted_read)
    model = run.model(run.selected).eval()
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
    on = Runtime(torch.device("cpu"), "fp32", False, False, None)
    with rasterio.open(raster) as src:
        mapped = list(map_blocks(model, run.dequantize(), src, source, spec, on, 61, False))
        height, width = src.height, src.width
    side = spec.grid_block
    assert len(mapped) == math.ceil(height / side) * math.ceil(width / side) > 1
    assert len(reads) == len(mapped), "one read per block"
    starts = sorted((w.row_off, w.col_off) for w in reads)
    assert starts == sorted((m.window.row_off, m.window.col_off) for m in mapped)
    assert sum(seen) == expected
    assert sum(m.window.height * m.window.width for m in mapped) == height * width
