"""Counting a class map's pixels per class by streaming (``emb.estimation.population``)
against reading the whole array and bincounting it: seconds, and peak memory at two sizes.

Writes SxS maps as predict writes them (COG, 512 px tiles, DEFLATE; fields of 32 px in 40
classes, 5% speckle, a nodata border) into a temporary folder, then for each size and method, in a
fresh process each (so one peak does not hide another): seconds (best of ``--repeats``), the
peak RSS growth over the process's state before counting (``ru_maxrss``: numpy and GDAL's C
allocations) and the tracemalloc peak (numpy's arrays). Streaming and whole-array runs of one
size alternate in one invocation, so the ratio compares like with like on a noisy machine.

Usage: ``python bench/map_counts.py [--quick] [--sides 2048 8192] [--repeats 3] [--json PATH]``
(``--quick``: sides 512 and 2048, one repeat). The goal (issue 49): 8192 x 8192 in under 2 s
on one core, memory flat in the map's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import rasterio
from rasterio.crs import CRS
from rasterio.transform import from_origin
from rasterio.windows import Window

from emb.evaluation.map_files import to_cog

REPO = Path(__file__).resolve().parents[1]
FIELD = 32  # pixels per side of one field of a class
NOISE = 0.05  # share of pixels of a random class (a map's speckle), so DEFLATE has work to do
CHILD = """
import json, os, sys, time, tracemalloc
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
import numpy as np, rasterio
from emb.classes import load_class_map
from emb.estimation.population import count_classes
path, method, repeats, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
cmap = load_class_map(sys.argv[4])
def whole(path):
    with rasterio.open(path) as src:
        return np.bincount(src.read(1).ravel(), minlength=256)
count = (lambda p: count_classes(p, 3, cmap)) if method == "stream" else whole
count(warm)  # GDAL's and numpy's code paged in on a tiny map, outside the measure
def peak_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # resets the peak RSS (VmHWM) to the current RSS
before = rss_kib()
tracemalloc.start()
start = time.perf_counter()
count(path)
seconds = [time.perf_counter() - start]
traced = tracemalloc.get_traced_memory()[1]
after = peak_kib()
tracemalloc.stop()
for _ in range(repeats - 1):
    start = time.perf_counter()
    count(path)
    seconds.append(time.perf_counter() - start)
print(json.dumps({"s": min(seconds), "rss_mib": (after - before) / 1024,
                  "traced_mib": traced / 2**20}))
"""


def write_map(path: Path, side: int, seed: int = 0) -> Path:
    """An SxS class map: fields of FIELD px in 40 classes, a nodata border of side/16 px."""
    rng = np.random.default_rng(seed)
    profile = {
        "driver": "GTiff", "width": side, "height": side, "count": 1, "dtype": "uint8",
        "crs": CRS.from_epsg(32615), "transform": from_origin(300_000, 4_500_000, 10, 10),
        "nodata": 255, "tiled": True, "blockxsize": 512, "blockysize": 512,
    }  # fmt: skip
    tmp = path.with_suffix(".tmp.tif")
    border = side // 16
    fields = -(-side // FIELD)
    with rasterio.open(tmp, "w", **profile) as dst:
        for row in range(0, side, 512):
            h = min(512, side - row)
            ids = rng.integers(0, 40, size=(-(-h // FIELD), fields), dtype=np.uint8)
            strip = np.repeat(np.repeat(ids, FIELD, 0), FIELD, 1)[:h, :side]
            rows = np.arange(row, row + h)[:, None]
            cols = np.arange(side)[None, :]
            edge = (rows < border) | (rows >= side - border) | (cols < border)
            noise = rng.random((h, side)) < NOISE
            strip = np.where(noise, rng.integers(0, 61, (h, side)), strip)
            strip = np.where(edge | (cols >= side - border), 255, strip).astype(np.uint8)
            dst.write(strip, 1, window=Window(0, row, side, h))
    to_cog(tmp, path, "nearest")
    return path


def measure(path: Path, method: str, repeats: int, warm: Path) -> dict:
    """Seconds (best of ``repeats``; the first run, under tracemalloc, included) and memory of
    one method on one map, in a fresh process pinned to one core."""
    cmd = [sys.executable, "-c", CHILD, str(path), method, str(repeats),
           str(REPO / "config" / "classes.csv"), str(warm)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", GDAL_NUM_THREADS="1")
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sides 512 and 2048, 1 repeat")
    parser.add_argument("--sides", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sides = args.sides or ([512, 2048] if args.quick else [2048, 8192])
    repeats = args.repeats or (1 if args.quick else 3)
    rows = []
    with tempfile.TemporaryDirectory(prefix="map_counts-") as folder:
        warm = write_map(Path(folder) / "warm.tif", 256)
        for side in sides:
            path = write_map(Path(folder) / f"map{side}.tif", side)
            stream = measure(path, "stream", repeats, warm)
            whole = measure(path, "whole", repeats, warm)
            rows.append({"side": side, "mib_on_disk": path.stat().st_size / 2**20,
                         "stream": stream, "whole": whole,
                         "stream_over_whole": stream["s"] / whole["s"]})  # fmt: skip
    head = ("side", "MiB on disk", "stream s", "whole s", "stream/whole", "stream RSS+ MiB",
            "whole RSS+ MiB", "stream traced MiB", "whole traced MiB")  # fmt: skip
    print("  ".join(head))
    for r in rows:
        s, w = r["stream"], r["whole"]
        cells = (r["side"], f"{r['mib_on_disk']:.1f}", f"{s['s']:.3f}", f"{w['s']:.3f}",
                 f"{r['stream_over_whole']:.2f}", f"{s['rss_mib']:.1f}", f"{w['rss_mib']:.1f}",
                 f"{s['traced_mib']:.1f}", f"{w['traced_mib']:.1f}")  # fmt: skip
        print("  ".join(f"{c:>{len(h)}}" for c, h in zip(cells, head, strict=True)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
