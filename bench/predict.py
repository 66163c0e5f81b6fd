"""Prediction benchmark: each figure is a ratio of two things timed side by side in one run.

Contenders alternate and each keeps its best time, so both see the same machine.

- predict_ratio_block{B}: ``predict_raster`` (read, quantize, forward, blend, COG write) on an
  SxSx64 int8 raster with overlap 0.5 and block B, against inference alone on the same
  windows (``Dequantize`` + model on the grid's unique windows, read beforehand, same batch
  size): the share of the time that goes into inference (goal >= 0.6 at block 1024). Below
  1 it pays for reading, blending, writing and the windows that straddle two blocks, which
  are computed for each.
- overlap_cost: time at overlap 0.5 / time at overlap 0 (both block 1024); about the ratio of
  window counts (~4) when inference dominates.
- predict_mpx_per_s_1proc / _2proc: megapixels per second of one ``python -m
  emb.evaluation.predict`` process (1 thread) on its own, and per process when two run at once
  on two rasters (as the jobs of a group job do); processes_2_over_1: the total throughput of
  two processes over one (2.0 = perfect scaling; CPU processes share cores and memory
  bandwidth here, GPU processes each hold a GPU of their own).

Usage: ``python bench/predict.py [--quick] [--json PATH] [--size S] [--tile T]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import rasterio
import torch
import yaml
from affine import Affine

from emb.classes import load_class_map
from emb.evaluation.predict import predict_raster
from emb.evaluation.runs import TrainedRun
from emb.evaluation.windows import PredictSpec, read_window, tile_origins
from emb.models import build_model
from emb.rasters import shard_arrays
from emb.training import checkpoint
from emb.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]


def write_raster(path: Path, size: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    profile = dict(driver="GTiff", count=64, width=size, height=size, dtype="int8",
                   nodata=-128, crs="EPSG:32615", transform=Affine(10, 0, 4e5, 0, -10, 5e6),
                   tiled=True, blockxsize=256, blockysize=256)  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        for _, window in dst.block_windows(1):
            shape = (64, window.height, window.width)
            dst.write(rng.integers(-127, 128, shape, dtype=np.int8), window=window)
    return path


def demo_run(tmp: Path) -> TrainedRun:
    """The demo's AEF SegFormer, freshly initialized (weights do not change the cost)."""
    config: dict = {}
    for name in ("defaults", "aef_segformer", "demo"):
        data = yaml.safe_load((REPO / f"config/train/{name}.yaml").read_text())
        for key, value in data.items():
            config[key] = {**config.get(key, {}), **value}
    config["data"].update(manifest=str(tmp / "none.json"), classes=str(REPO / "config/classes.csv"))
    cfg = TrainConfig.from_dict(config)
    model = build_model(cfg.model)
    return TrainedRun(tmp / "run" / "best.pt", cfg, {"raw": model.state_dict()}, 0)


def save_run(run: TrainedRun) -> Path:
    """The run as a folder the predict stage can open."""
    run.path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save(run.path, {"model": run.weights["raw"], "config": run.cfg.resolved, "epoch": 0})
    return run.path.parent


def process_throughput(run_dir: Path, rasters: list[Path], tile: int) -> float:
    """Seconds for one predict process per raster, all started at once (1 thread each)."""
    commands = [
        [sys.executable, "-m", "emb.evaluation.predict", "--run-dir", str(run_dir),
         "--raster", str(raster), "--region", raster.stem, "--classes",
         str(REPO / "config/classes.csv"), "--out", str(raster.with_suffix(".map.tif")),
         "--png", str(raster.with_suffix(".png")), "--tile", str(tile), "--threads", "1"]
        for raster in rasters
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "PATH": str(Path(sys.executable).parent)}
    tick = time.perf_counter()
    running = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL) for c in commands]
    if any(proc.wait() != 0 for proc in running):
        raise SystemExit("a predict process failed")
    return time.perf_counter() - tick


def best_of(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            tick = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - tick)
    return best


def model_only(run: TrainedRun, raster: Path, spec: PredictSpec) -> Callable[[], None]:
    """De-quantization and forward passes over the grid's unique windows, read beforehand."""
    model, dequantize = run.model("raw"), run.dequantize()
    with rasterio.open(raster) as src:
        rows = tile_origins(0, src.height, src.height, spec.tile, spec.stride)
        cols = tile_origins(0, src.width, src.width, spec.tile, spec.stride)
        arrays = [shard_arrays("aef", read_window(src, r, c, spec.tile), src.nodata)["emb"]
                  for r in rows for c in cols]  # fmt: skip
    batches = []
    for i in range(0, len(arrays), spec.batch_size):
        emb = torch.from_numpy(np.stack(arrays[i : i + spec.batch_size]))
        batches.append({"emb": emb, "label": torch.zeros(emb.shape[0], 1, 1)})

    @torch.no_grad()
    def run_all() -> None:
        for batch in batches:
            model(dequantize(batch)[0])["l3"].numpy()

    return run_all


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 512 px raster, one repeat")
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--tile", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    size, repeats = (512, 1) if args.quick else (args.size, 2)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cmap = load_class_map(REPO / "config/classes.csv")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        raster = write_raster(tmp / "aef.tif", size)
        run = demo_run(tmp)

        def predict(overlap: float, block: int) -> Callable[[], None]:
            spec = PredictSpec(args.tile, overlap, block, 16)
            return lambda: predict_raster(run, "raw", raster, cmap, spec, tmp / "map.tif")

        spec = PredictSpec(args.tile, 0.5, 1024, 16)
        blocks = [512, 1024, 2048]
        fns = {"model": model_only(run, raster, spec)}
        fns.update({f"block{b}": predict(0.5, b) for b in blocks})
        fns["overlap0"] = predict(0.0, 1024)
        times = best_of(fns, repeats)
        for b in blocks:
            results[f"predict_ratio_block{b}"] = round(times["model"] / times[f"block{b}"], 3)
        results["overlap_cost"] = round(times["block1024"] / times["overlap0"], 3)
        results["predict_mpx_per_s_block1024"] = round(size * size / times["block1024"] / 1e6, 3)
        run_dir = save_run(run)
        second = write_raster(tmp / "aef2.tif", size, seed=1)
        one = two = float("inf")
        for _ in range(repeats):  # alternating, best of each
            one = min(one, process_throughput(run_dir, [raster], args.tile))
            two = min(two, process_throughput(run_dir, [raster, second], args.tile))
        mpx = size * size / 1e6
        results["predict_mpx_per_s_1proc"] = round(mpx / one, 3)
        results["predict_mpx_per_s_2proc"] = round(mpx / two, 3)
        results["processes_2_over_1"] = round(2 * one / two, 3)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
