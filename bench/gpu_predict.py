"""bench/gpu.py part (c): megapixels/s of ``predict`` on one GPU, as the rule starts it, and
the map job against its parts, side by side.

The job maps one synthetic AEF region (S x S px, 64 bands int8) with a run that part (b)
trained (its best.pt, config and data), through ``python -m emb.cluster.launch
--nproc-per-node 1 ... -- emb.evaluation.predict --regions TABLE``, with the options of
the workflow's ``predict:`` settings and the rule's threads. Two figures:

- ``job_mpx_s``: the region's megapixels over the whole job's wall time (process start,
  imports, CUDA set-up, model load, the map, its COG, legend and quicklook, publishing);
- ``map_mpx_s``: the same megapixels over the time between the stage's "regions to map" and
  "published" lines, stamped as they arrive: the mapping alone, without the start-up that a
  job pays once however many regions it maps. None if the stage no longer writes those lines.

Then, in this process on the same device and raster, with the run's checkpoint and
precision, the map job (``predict_raster``: the map and its COG) against its parts, each
printed as it finishes (:func:`map_contenders`): ``read`` (every block read once, halo
included, in shard form and on the device), ``model`` (the grid's unique windows, cut
beforehand, de-quantized and through the model), ``write`` (a map's bytes into the tiled
GeoTIFF and its COG); ``job_over_parts`` = job / (read + model + write), and Mpx/s and
km^2/hour at 10 m for each.

The raster is one random 64 x 256 x 256 block written at every block position: its content
does not change the cost, and writing it takes seconds, not the minutes of drawing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import rasterio
import torch
import yaml
from affine import Affine
from gpu_loop import REPO, job_env

from emb.classes import load_class_map
from emb.evaluation.map_files import map_profile, tmp_sibling, to_cog
from emb.evaluation.predict import predict_raster
from emb.evaluation.predict_spec import PredictSpec
from emb.evaluation.runs import TrainedRun, open_run
from emb.evaluation.windows import BlockReader, blocks, owned_origins
from emb.models.runtime import CPU_HOST, Host, Runtime

START, END = "regions to map", "published"  # the predict stage's own log lines


def write_aef_raster(path: Path, size: int) -> Path:
    """An S x S AEF raster (64 bands int8, nodata -128, 256 px blocks) of one repeated block."""
    block = 256 if size >= 256 else 16 * max(1, size // 16)
    profile = dict(driver="GTiff", count=64, width=size, height=size, dtype="int8",
                   nodata=-128, crs="EPSG:32615", transform=Affine(10, 0, 4e5, 0, -10, 5e6),
                   tiled=True, blockxsize=block, blockysize=block)  # fmt: skip
    data = np.random.default_rng(0).integers(-127, 128, (64, block, block), dtype=np.int8)
    with rasterio.open(path, "w", **profile) as dst:
        for _, window in dst.block_windows(1):
            dst.write(data[:, : window.height, : window.width], window=window)
    return path


def predict_settings() -> dict:
    """``predict:`` as the workflow gets it: ``config/config.yaml`` with the config schema's
    defaults filled in (Snakemake's validation, common.smk)."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))
    return config["predict"]


def predict_options() -> list[str]:
    """``predict:`` as the workflow passes it to the stage (common.smk)."""
    cfg = predict_settings()
    options = [f"--overlap={cfg['overlap']}", f"--block={cfg['block']}",
               f"--batch-size={cfg['batch_size']}"]  # fmt: skip
    return options + ([f"--tile={cfg['tile']}"] if cfg.get("tile") else [])


def timed_job(cmd: list[str], env: dict[str, str], log: Path) -> dict[str, float | None]:
    """Run ``cmd`` with its output in ``log``; the job's seconds and those between the
    ``START`` and ``END`` lines (None where either is missing)."""
    stamps: dict[str, float] = {}
    tick = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            for mark in (START, END):
                if mark in line and mark not in stamps:
                    stamps[mark] = time.perf_counter()
        code = proc.wait()
    seconds = time.perf_counter() - tick
    if code:
        raise SystemExit(f"bench/gpu.py: predict job failed ({code}), log {log}:\n"
                         f"{log.read_text()[-4000:]}")  # fmt: skip
    mapped = stamps[END] - stamps[START] if len(stamps) == 2 else None
    return {"job_s": seconds, "map_s": mapped}


KM2_PER_PX = 1e-4  # a 10 m pixel


def rates(seconds: float, px: int) -> dict[str, float]:
    """Megapixels/s and km^2/hour at 10 m of ``px`` pixels in ``seconds``."""
    return {"s": seconds, "mpx_s": px / seconds / 1e6, "km2_h": px * KM2_PER_PX / seconds * 3600}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def read_part(raster: Path, source: str, spec: PredictSpec, device: torch.device) -> Callable:
    """Every block of the map job read once (halo included), in shard form, on the device."""

    def run() -> None:
        with rasterio.open(raster, num_threads=max(1, torch.get_num_threads())) as src:
            reader = BlockReader(src, source, spec, device)
            for window in blocks(src.height, src.width, spec.grid_block):
                block = reader.read(window)
                for t in block.arrays.values():
                    t.to(device, non_blocking=True)
        sync(device)

    return run


def model_part(run: TrainedRun, raster: Path, spec: PredictSpec, on: Runtime) -> Callable:
    """De-quantization and forward passes over the grid's unique windows, cut beforehand on
    the device (the whole raster in shard form), at the job's batch size."""
    model, dequantize = on.prepare(run.model(run.selected)), run.dequantize().to(on.device)
    source = run.cfg.data.source
    with rasterio.open(raster) as src:
        whole = PredictSpec(spec.tile, spec.overlap, max(src.height, src.width), spec.batch_size)
        reader = BlockReader(src, source, whole, on.device)
        data = reader.read(next(blocks(src.height, src.width, whole.grid_block)))
    arrays = {k: v.to(on.device) for k, v in data.arrays.items()}
    origins, t = data.origins, spec.tile
    batches = []
    for i in range(0, len(origins), spec.batch_size):
        chunk = origins[i : i + spec.batch_size]
        batch = {k: torch.stack([v[..., r : r + t, c : c + t] for r, c in chunk])
                 for k, v in arrays.items()}  # fmt: skip
        batch["label"] = torch.zeros(len(chunk), 1, 1, device=on.device)
        batches.append(batch)

    @torch.no_grad()
    def run_all() -> None:
        for batch in batches:
            x, _ = dequantize(batch)
            with on.autocast():
                model(on.inputs(x))["l3"].float()
        sync(on.device)

    return run_all


def write_part(raster: Path, out: Path, spec: PredictSpec) -> Callable:
    """A map's uint8 bytes, block by block, into the tiled GeoTIFF and then its COG."""
    with rasterio.open(raster) as src:
        profile = map_profile(src, 1)
        height, width = src.height, src.width
    ids = np.random.default_rng(0).integers(0, 61, (height, width), dtype=np.uint8)

    def run() -> None:
        tmp = tmp_sibling(out, "map")
        with rasterio.open(tmp, "w", **profile) as dst:
            for w in blocks(height, width, spec.grid_block):
                dst.write(ids[w.row_off : w.row_off + w.height, w.col_off : w.col_off + w.width],
                          1, window=w)  # fmt: skip
        to_cog(tmp, out, "MODE")

    return run


def unique_windows(raster: Path, spec: PredictSpec) -> int:
    """The grid's windows over the raster (with or without data)."""
    with rasterio.open(raster) as src:
        rows = owned_origins(0, src.height, src.height, spec.tile, spec.stride)
        cols = owned_origins(0, src.width, src.width, spec.tile, spec.stride)
    return len(rows) * len(cols)


def map_contenders(
    run: TrainedRun, raster: Path, spec: PredictSpec, on: Runtime, work: Path,
    extra: dict[str, Callable] | None = None,
) -> dict[str, Callable]:  # fmt: skip
    """The map job and its parts (and ``extra`` contenders), each a no-argument callable."""
    cmap = load_class_map(REPO / "config/classes.csv")
    fns = {
        "job": lambda: predict_raster(
            run, run.selected, raster, cmap, spec, work / "job.tif", run_on=on
        ),  # fmt: skip
        "read": read_part(raster, run.cfg.data.source, spec, on.device),
        "model": model_part(run, raster, spec, on),
        "write": write_part(raster, work / "write.tif", spec),
    }
    return {**fns, **(extra or {})}


def side_by_side(fns: dict[str, Callable], repeats: int, px: int, label: str) -> dict:
    """Contenders alternated, best time of each kept, each printed as it finishes; the job
    against the sum of its parts."""
    best = dict.fromkeys(fns, float("inf"))
    for i in range(repeats):
        for name, fn in fns.items():
            tick = time.perf_counter()
            fn()
            took = time.perf_counter() - tick
            best[name] = min(best[name], took)
            r = rates(took, px)
            print(f"  {label} {name} (round {i + 1}/{repeats}): {took:.2f} s, "
                  f"{r['mpx_s']:.3g} Mpx/s, {r['km2_h']:.4g} km^2/h at 10 m",
                  flush=True)  # fmt: skip
    rows = {name: rates(seconds, px) for name, seconds in best.items()}
    parts = best["read"] + best["model"] + best["write"]
    rows["parts"] = rates(parts, px)
    rows["job_over_parts"] = best["job"] / parts
    print(f"  {label}: job {best['job']:.2f} s against its parts {parts:.2f} s (read "
          f"{best['read']:.2f} + model {best['model']:.2f} + write {best['write']:.2f}): "
          f"{rows['job_over_parts']:.2f}x", flush=True)  # fmt: skip
    return rows


def bench_predict(run_dir: Path, root: Path, size: int, cpu: bool) -> dict:
    """Part (c)'s row: one S x S region mapped by one predict job with ``run_dir``'s best.pt."""
    work = root / "predict"
    work.mkdir(parents=True)
    tick = time.perf_counter()
    raster = write_aef_raster(work / "aef.tif", size)
    written = time.perf_counter() - tick
    table = work / "regions.tsv"
    table.write_text(f"region\tyear\taef\ttessera\tcdl\tsplit\nr0\t2024\t{raster}\t\t\ttest\n")
    out_dir = work / "maps"
    threads = 1 if cpu else min(8, os.cpu_count() or 1)  # the rule's threads: 8, capped by cores
    cmd = [sys.executable, "-m", "emb.cluster.launch", "--nodes", "1", "--nproc-per-node", "1",
           "--threads", "1", f"--checkpoint={work / '.partial/.stopped'}", "--attempt=1",
           f"--failure-record={work / 'failed.json'}", "--", "emb.evaluation.predict",
           f"--run-dir={run_dir}", f"--regions={table}",
           f"--classes={REPO / 'config/classes.csv'}", f"--out-dir={out_dir}",
           f"--staging={work / '.partial'}", f"--threads={threads}",
           *predict_options()]  # fmt: skip
    times = timed_job(cmd, job_env(cpu), root / "predict.log")
    if not (out_dir / "r0.tif").is_file():
        raise SystemExit(f"bench/gpu.py: the predict job wrote no {out_dir / 'r0.tif'}")
    mpx = size * size / 1e6
    mapped = times["map_s"]
    print(f"predict job ({run_dir.name}, {size} px): {times['job_s']:.1f} s, mapping alone "
          f"{mapped or float('nan'):.1f} s", flush=True)  # fmt: skip
    parts = in_process_parts(run_dir, raster, work, cpu, threads)
    return {
        "run": run_dir.name, "px": size, "mpx": mpx, "threads": threads, "job_s": times["job_s"],
        "job_mpx_s": mpx / times["job_s"], "map_s": mapped,
        "map_mpx_s": mpx / mapped if mapped else None, "raster_write_s": written,
        "parts": parts,
    }  # fmt: skip


def in_process_parts(run_dir: Path, raster: Path, work: Path, cpu: bool, threads: int) -> dict:
    """The map job against its parts in this process, on the bench's device, with the run's
    checkpoint, resolved runtime (precision, memory format), tile size and ``config.yaml``'s
    predict options."""
    cfg = predict_settings()
    run = open_run(
        run_dir, load_class_map(REPO / "config/classes.csv"), REPO / "config/classes.csv"
    )
    if cpu:
        torch.set_num_threads(threads)
    # the bench's one device: the CPU, or the first GPU as a job's only rank would take it
    on = run.runtime(CPU_HOST if cpu else Host.here({"LOCAL_RANK": "0"}))
    device = on.device
    tile = cfg.get("tile") or run.tile_size
    spec = PredictSpec(tile, cfg["overlap"], cfg["block"], cfg["batch_size"])
    with rasterio.open(raster) as src:
        px = src.width * src.height
    print(f"map job against its parts ({run_dir.name}, {device}, {unique_windows(raster, spec)} "
          f"unique windows of {tile} px):", flush=True)  # fmt: skip
    return side_by_side(map_contenders(run, raster, spec, on, work), 2, px, run_dir.name)


def print_predict(row: dict) -> None:
    """Part (c)'s lines: the job, then the map job and its parts side by side."""
    mapped = f"{row['map_mpx_s']:.3g}" if row["map_mpx_s"] else "-"
    print(f"\npredict ({row['run']}, {row['px']} px, {row['mpx']:.3g} Mpx): "
          f"{row['job_mpx_s']:.3g} Mpx/s over the job ({row['job_s']:.1f} s), "
          f"{mapped} Mpx/s mapping alone (threads {row['threads']})")  # fmt: skip
    parts = row.get("parts")
    if parts:
        for name in ("job", "read", "model", "write", "parts"):
            r = parts[name]
            print(f"  {name:6s} {r['s']:8.2f} s {r['mpx_s']:9.3g} Mpx/s {r['km2_h']:10.4g} km^2/h")
        print(f"  job / (read + model + write) = {parts['job_over_parts']:.2f}")
