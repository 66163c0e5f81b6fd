"""Prediction benchmark: the map job against its parts, side by side in one run, each figure
printed as its contender finishes.

For each model (``tiny``: the tests' smallest, so that inference is cheap as on a GPU;
``demo``: the demo's AEF SegFormer; ``full``: the run file's, without the demo overlay) on an
S x S x 64 int8 raster, overlap 0.5, block 1024, batch 16, contenders alternate and each keeps
its best time:

- ``job``: ``predict_raster`` (every block read once with its halo, windows blended and
  classified on the model's device, the map and its COG written);
- its parts: ``read`` (every block read once, halo included, in shard form, on the device),
  ``model`` (the grid's unique windows, cut beforehand, de-quantized and through the model),
  ``write`` (a map's bytes into the tiled GeoTIFF and its COG);
- ``old``: the same job through the algorithm this one replaced (emb 0dcd26c's
  ``emb.evaluation.windows``, loaded from git: each window read on its own, straddling windows
  computed for each block, blending and argmax in numpy), when git has that commit.

Per model: ``job_over_parts`` = job / (read + model + write) (goal on 2 CPU cores with the tiny
model: <= 1.5) and ``old_over_job`` (goal with the full model: >= 1, not slower than before),
and Mpx/s and km^2/hour at 10 m of every contender.

Then the predict stage's job form: ``python -m emb.cluster.launch --nproc-per-node N ...
-- emb.evaluation.predict --regions TABLE`` on a table of two rasters with 1 and 2 processes
(``predict_mpx_per_s_1proc``, ``processes_2_over_1``; both jobs must write byte-identical
maps). On a machine with one GPU the 2-process job is refused by the launcher in one line:
the bench reports that line.

Usage: ``python bench/predict.py [--quick] [--models tiny demo] [--size S] [--tile T]
[--repeats N] [--no-jobs] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import rasterio
import torch
import yaml
from affine import Affine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_predict import map_contenders, side_by_side, unique_windows  # noqa: E402

from emb.evaluation.map_files import map_profile, tmp_sibling, to_cog  # noqa: E402
from emb.evaluation.predict_spec import PredictSpec  # noqa: E402
from emb.evaluation.runs import TrainedRun  # noqa: E402
from emb.models import build_model  # noqa: E402
from emb.models.runtime import Runtime  # noqa: E402
from emb.models.train_defaults import TRAIN_SCHEMA  # noqa: E402
from emb.training import checkpoint_file  # noqa: E402
from emb.training.run_config import TrainConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "0dcd26c"  # the last commit with the host-side algorithm
# its imports that moved since (the device, precision and memory format it ran with became
# emb.models.runtime.Runtime): the old path is the old algorithm on today's modules
MOVED = {"from emb.evaluation.inference import Inference":
         "from emb.models.runtime import Runtime as Inference"}  # fmt: skip
TINY_MODEL = {"widths": [8, 16, 16, 32], "depths": [1, 1, 1, 1], "decoder_dim": 16}


def write_raster(path: Path, size: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    profile = dict(driver="GTiff", count=64, width=size, height=size, dtype="int8",
                   nodata=-128, crs="EPSG:32615", transform=Affine(10, 0, 4e5, 0, -10, 5e6),
                   tiled=True, blockxsize=256, blockysize=256, compress="DEFLATE")  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        for _, window in dst.block_windows(1):
            shape = (64, window.height, window.width)
            dst.write(rng.integers(-127, 128, shape, dtype=np.int8), window=window)
    return path


def bench_run(tmp: Path, model: str) -> TrainedRun:
    """An AEF SegFormer of size ``model``, freshly initialized (weights do not change the
    cost), its manifest a stub naming the tile."""
    files = {"tiny": ("defaults", "aef_segformer", "demo"), "demo": ("defaults", "aef_segformer",
             "demo"), "full": ("defaults", "aef_segformer")}[model]  # fmt: skip
    # every section of the train schema; keys no file sets take the schema's defaults
    config: dict = {
        section: {} for section in yaml.safe_load(TRAIN_SCHEMA.read_text())["properties"]
    }
    for name in files:
        data = yaml.safe_load((REPO / f"config/train/{name}.yaml").read_text()) or {}
        for key, value in data.items():
            config[key] = {**config.get(key, {}), **value}
    if model == "tiny":
        config["model"].update(TINY_MODEL)
    manifest = tmp / "manifest.json"
    manifest.write_text(json.dumps({"tile_size": 256}))
    config["data"].update(manifest=str(manifest), classes=str(REPO / "config/classes.csv"))
    cfg = TrainConfig.from_dict(config)
    torch.manual_seed(0)
    net = build_model(cfg.model)
    return TrainedRun(tmp / f"run-{model}" / "best.pt", cfg, {"raw": net.state_dict()}, 0)


def old_module() -> types.ModuleType | None:
    """emb 0dcd26c's ``emb.evaluation.windows``, from git (None without that history)."""
    done = subprocess.run(["git", "show", f"{OLD_COMMIT}:src/emb/evaluation/windows.py"],
                          cwd=REPO, capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        print(f"old path left out: git show {OLD_COMMIT} failed ({done.stderr.strip()})")
        return None
    module = types.ModuleType("emb_windows_0dcd26c")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    source = done.stdout
    for moved, now in MOVED.items():  # what it imported that lives elsewhere now
        source = source.replace(moved, now)
    exec(compile(source, f"{OLD_COMMIT}:windows.py", "exec"), module.__dict__)  # noqa: S102
    return module


def old_job(old: types.ModuleType, run: TrainedRun, raster: Path, spec: PredictSpec,
            out: Path) -> Callable[[], None]:  # fmt: skip
    """The map and its COG as emb 0dcd26c made them (``predict_block`` + ``classify``)."""
    model, dequantize = run.model(run.selected).eval(), run.dequantize()
    old_spec = old.PredictSpec(spec.tile, spec.overlap, spec.block, spec.batch_size)
    on = Runtime(torch.device("cpu"), "fp32", False, False, None)

    def run_old() -> None:
        tmp = tmp_sibling(out, "map")
        with ExitStack() as stack:
            src = stack.enter_context(rasterio.open(raster))
            dst = stack.enter_context(rasterio.open(tmp, "w", **map_profile(src, 1)))
            for block in old.blocks(src.height, src.width, spec.block):
                acc, wsum, valid = old.predict_block(model, dequantize, src, "aef", block,
                                                     old_spec, on)  # fmt: skip
                ids, _ = old.classify(acc, wsum, valid, False)
                dst.write(ids, 1, window=block)
        to_cog(tmp, out, "MODE")

    return run_old


def region_table(path: Path, rasters: list[Path]) -> Path:
    """A regions.tsv naming ``rasters`` as the AEF rasters of regions ``r0``, ``r1``, ..."""
    rows = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    rows += [f"r{i}\t2024\t{raster}\t\t\ttest" for i, raster in enumerate(rasters)]
    path.write_text("\n".join(rows) + "\n")
    return path


def save_run(run: TrainedRun) -> Path:
    """The run as a folder the predict stage can open."""
    run.path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint_file.save(
        run.path, {"model": run.weights["raw"], "config": run.cfg.resolved, "epoch": 0}
    )
    return run.path.parent


def predict_job(run_dir: Path, table: Path, out_dir: Path, nproc: int, tile: int) -> float | str:
    """Seconds for one predict job mapping every region of ``table`` into ``out_dir`` on
    ``nproc`` processes of 1 thread, as the rule starts it; the launcher's one-line refusal
    (a string) where it refuses the job (more processes than a GPU machine's GPUs)."""
    cmd = [sys.executable, "-m", "emb.cluster.launch", "--nproc-per-node", str(nproc),
           "--threads", "1", "--", "emb.evaluation.predict", "--run-dir", str(run_dir),
           "--regions", str(table), "--classes", str(REPO / "config/classes.csv"),
           "--out-dir", str(out_dir), "--tile", str(tile), "--overlap", "0.5", "--block", "1024",
           "--batch-size", "16", "--threads", "1"]  # fmt: skip
    torchrun_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in torchrun_vars}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    tick = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - tick
    if done.returncode == 2 and torch.cuda.device_count() and nproc > torch.cuda.device_count():
        return (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise SystemExit(f"predict job ({nproc} processes) failed ({done.returncode}):\n{tail}")
    return seconds


def jobs(run: TrainedRun, tmp: Path, rasters: list[Path], size: int, tile: int,
         repeats: int) -> dict:  # fmt: skip
    """The predict stage's job form with 1 and 2 processes, alternated, maps compared."""
    run_dir = save_run(run)
    table = region_table(tmp / "regions.tsv", rasters)
    regions = [f"r{i}" for i in range(len(rasters))]
    seconds: dict[int, float] = {}
    refused: str | None = None
    first: dict[str, bytes] = {}
    for i in range(repeats):
        for nproc in (1, 2):
            out_dir = tmp / f"job{nproc}-{i}" / "maps"
            took = predict_job(run_dir, table, out_dir, nproc, tile)
            if isinstance(took, str):
                refused = took
                print(f"predict job, 2 processes: refused: {took}", flush=True)
                continue
            seconds[nproc] = min(seconds.get(nproc, float("inf")), took)
            print(f"predict job, {nproc} process(es): {took:.1f} s", flush=True)
            made = {r: (out_dir / f"{r}.tif").read_bytes() for r in regions}
            first = first or made
            differ = [r for r in regions if made[r] != first[r]]
            if differ:
                raise SystemExit(f"{out_dir}: the {nproc}-process job wrote other maps than "
                                 f"the first job for {', '.join(differ)}")  # fmt: skip
    mpx = len(rasters) * size * size / 1e6
    two = seconds.get(2)
    return {
        "predict_mpx_per_s_1proc": round(mpx / seconds[1], 3),
        "predict_mpx_per_s_per_proc_2proc": None if two is None else round(mpx / two / 2, 3),
        "processes_2_over_1": None if two is None else round(seconds[1] / two, 3),
        "two_process_refusal": refused,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 512 px raster, one repeat")
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--tile", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=("tiny", "demo", "full"),
                        default=["tiny", "demo"])  # fmt: skip
    parser.add_argument("--no-old", action="store_true", help="leave out the old path")
    parser.add_argument("--no-jobs", action="store_true", help="leave out the launched jobs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    size, repeats = (512, 1) if args.quick else (args.size, args.repeats)
    results: dict = {"size": size, "tile": args.tile, "threads": torch.get_num_threads()}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on = Runtime(device, "bf16" if device.type == "cuda" else "fp32", False, False, None)
    old = None if args.no_old or device.type == "cuda" else old_module()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        raster = write_raster(tmp / "aef.tif", size)
        spec = PredictSpec(args.tile, 0.5, 1024, 16)
        px = size * size
        print(f"{size} x {size} px AEF raster, tile {args.tile}, overlap 0.5, block 1024, "
              f"batch 16, {unique_windows(raster, spec)} unique windows, {device}, "
              f"{torch.get_num_threads()} threads", flush=True)  # fmt: skip
        for name in args.models:
            run = bench_run(tmp, name)
            extra = {"old": old_job(old, run, raster, spec, tmp / "old.tif")} if old else None
            rows = side_by_side(map_contenders(run, raster, spec, on, tmp, extra), repeats, px,
                                name)  # fmt: skip
            if "old" in rows:
                rows["old_over_job"] = rows["old"]["s"] / rows["job"]["s"]
                print(
                    f"  {name}: old path {rows['old']['s']:.2f} s against the job "
                    f"{rows['job']['s']:.2f} s: {rows['old_over_job']:.2f}x",
                    flush=True,
                )
            results[name] = rows
        if not args.no_jobs:
            second = write_raster(tmp / "aef2.tif", size, seed=1)
            run = bench_run(tmp, args.models[0])
            results["jobs"] = jobs(run, tmp, [raster, second], size, args.tile, repeats)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
