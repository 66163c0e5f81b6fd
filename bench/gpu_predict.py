"""bench/gpu.py part (c): megapixels/s of ``predict`` on one GPU, as the rule starts it.

The job maps one synthetic AEF region (S x S px, 64 bands int8) with a run that part (b)
trained (its best.pt, config and data), through ``python -m emb.cluster.launch
--nproc-per-node 1 ... -- emb.evaluation.predict --regions TABLE``, with the options of
``config/config.yaml``'s ``predict:`` and the rule's threads. Two figures:

- ``job_mpx_s``: the region's megapixels over the whole job's wall time (process start,
  imports, CUDA set-up, model load, the map, its COG, legend and quicklook, publishing);
- ``map_mpx_s``: the same megapixels over the time between the stage's "regions to map" and
  "published" lines, stamped as they arrive: the mapping alone, without the start-up that a
  job pays once however many regions it maps. None if the stage no longer writes those lines.

The raster is one random 64 x 256 x 256 block written at every block position: its content
does not change the cost, and writing it takes seconds, not the minutes of drawing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import rasterio
import yaml
from affine import Affine
from gpu_loop import REPO, job_env

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


def predict_options() -> list[str]:
    """``config/config.yaml``'s ``predict:`` as the workflow passes it (common.smk)."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())["predict"]
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
    return {
        "run": run_dir.name, "px": size, "mpx": mpx, "threads": threads, "job_s": times["job_s"],
        "job_mpx_s": mpx / times["job_s"], "map_s": mapped,
        "map_mpx_s": mpx / mapped if mapped else None, "raster_write_s": written,
    }  # fmt: skip


def print_predict(row: dict) -> None:
    """Part (c)'s line."""
    mapped = f"{row['map_mpx_s']:.3g}" if row["map_mpx_s"] else "-"
    print(f"\npredict ({row['run']}, {row['px']} px, {row['mpx']:.3g} Mpx): "
          f"{row['job_mpx_s']:.3g} Mpx/s over the job ({row['job_s']:.1f} s), "
          f"{mapped} Mpx/s mapping alone (threads {row['threads']})")  # fmt: skip
