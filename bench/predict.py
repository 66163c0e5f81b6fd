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
- predict_mpx_per_s_1proc: megapixels per second of the predict stage's real job form, ``python
  -m emb.cluster.launch --nproc-per-node 1 --threads 1 -- emb.evaluation.predict --regions
  TABLE`` on a table of two SxS rasters: their megapixels over the wall time of the whole job
  (process start, model load, both maps, publishing).
- predict_mpx_per_s_per_proc_2proc: the same table by one job with ``--nproc-per-node 2``
  (torchrun, 1 thread each; one region per rank): megapixels / seconds / 2.
- processes_2_over_1: time of the 1-process job / time of the 2-process job (2.0 = perfect
  scaling; CPU processes share cores and memory bandwidth here, GPU processes each hold a GPU
  of their own). Both jobs must write byte-identical ``{region}.tif`` maps, or the bench fails.
  On a machine with one GPU the 2-process job cannot run (one process per GPU): it is left out
  and these two figures are null (the launcher would refuse it in one line, not hang).

Usage: ``python bench/predict.py [--quick] [--json PATH] [--size S] [--tile T]``.
"""

from __future__ import annotations

import argparse
import json
import os
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


def region_table(path: Path, rasters: list[Path]) -> Path:
    """A regions.tsv naming ``rasters`` as the AEF rasters of regions ``r0``, ``r1``, ..."""
    rows = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    rows += [f"r{i}\t2024\t{raster}\t\t\ttest" for i, raster in enumerate(rasters)]
    path.write_text("\n".join(rows) + "\n")
    return path


def predict_job(run_dir: Path, table: Path, out_dir: Path, nproc: int, tile: int) -> float:
    """Seconds for one predict job mapping every region of ``table`` into ``out_dir`` (fresh)
    on ``nproc`` processes of 1 thread, started through the launcher as the rule starts it."""
    if out_dir.exists():
        raise SystemExit(f"{out_dir} exists; each predict job needs a fresh folder")
    cmd = [sys.executable, "-m", "emb.cluster.launch", "--nproc-per-node", str(nproc),
           "--threads", "1", "--", "emb.evaluation.predict", "--run-dir", str(run_dir),
           "--regions", str(table), "--classes", str(REPO / "config/classes.csv"),
           "--out-dir", str(out_dir), "--tile", str(tile), "--threads", "1"]  # fmt: skip
    torchrun_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in torchrun_vars}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    tick = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - tick
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise SystemExit(f"predict job ({nproc} processes) failed ({done.returncode}):\n{tail}")
    return seconds


def job_processes() -> list[int]:
    """Process counts for the predict jobs: 1 and 2, but never more processes than GPUs on a
    GPU machine (a second rank on a one-GPU machine would ask for a ``cuda:1`` it lacks)."""
    gpus = torch.cuda.device_count()
    return [1] if gpus == 1 else [1, 2]


def map_bytes(out_dir: Path, regions: list[str]) -> dict[str, bytes]:
    """Each region's ``{region}.tif``, as bytes."""
    missing = [r for r in regions if not (out_dir / f"{r}.tif").is_file()]
    if missing:
        raise SystemExit(f"{out_dir}: no map for {', '.join(missing)}")
    return {r: (out_dir / f"{r}.tif").read_bytes() for r in regions}


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
    results: dict[str, float | None] = {}
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
        table = region_table(tmp / "regions.tsv", [raster, second])
        regions = ["r0", "r1"]
        seconds = dict.fromkeys(job_processes(), float("inf"))
        first: dict[str, bytes] = {}  # the maps of the first job, which every job must write
        for i in range(repeats):  # alternating, best of each, a fresh folder per job
            for nproc in seconds:
                out_dir = tmp / f"job{nproc}-{i}" / "maps"
                took = predict_job(run_dir, table, out_dir, nproc, args.tile)
                seconds[nproc] = min(seconds[nproc], took)
                made = map_bytes(out_dir, regions)
                first = first or made
                differ = [f"{r}.tif" for r in regions if made[r] != first[r]]
                if differ:
                    raise SystemExit(
                        f"{out_dir}: the {nproc}-process job wrote other bytes than the first "
                        f"(1-process) job for {', '.join(differ)}"
                    )
        mpx = 2 * size * size / 1e6
        results["predict_mpx_per_s_1proc"] = round(mpx / seconds[1], 3)
        two = seconds.get(2)  # None on a one-GPU machine: no second process
        results["predict_mpx_per_s_per_proc_2proc"] = (
            None if two is None else round(mpx / two / 2, 3)
        )
        results["processes_2_over_1"] = None if two is None else round(seconds[1] / two, 3)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
