"""Data-stage benchmarks: each figure is a ratio of two things timed side by side in one run.

- shard_build_ratio_{aef,tessera}: shard-build MB/s / plain rasterio windowed read MB/s of the
  same windows (goal >= 0.7).
- loader_ratio_w{0,2}: loader samples/s (``train_batches``) / raw sequential read of the same
  tar bytes (goal >= 0.5); ``loader_dequant_ratio_w2`` adds ``Dequantize`` on the CPU.
- stats_ratio: ``channel_stats`` time / raw read time of the sampled tiles' shards (goal <= 1.2).
- shard_build_peak_rss_mib: peak RSS of ``python -m emb.shards`` on an SxSx64 int8 raster
  (default S = 8192; goal < 1024 MiB).

Usage: ``python bench/data.py [--quick] [--json PATH] [--workdir DIR] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from rasterio.windows import Window

from emb.channel_stats import channel_stats
from emb.data import Dequantize, LoaderSpec, train_batches
from emb.shards import build_region
from emb.tiles import SplitSpec, TileSpec, tile_windows

CRS = "EPSG:32615"


def write_raster(path: Path, count: int, size: int, dtype: str, nodata, seed: int = 0) -> Path:
    """A tiled GeoTIFF written block by block (memory stays at one block row)."""
    rng = np.random.default_rng(seed)
    profile = dict(
        driver="GTiff",
        count=count,
        height=size,
        width=size,
        dtype=dtype,
        crs=CRS,
        transform=Affine(10, 0, 400_000, 0, -10, 4_600_000),
        nodata=nodata,
        tiled=True,
        blockxsize=256,
        blockysize=256,
    )
    with rasterio.open(path, "w", **profile) as dst:
        for row in range(0, size, 256):
            h = min(256, size - row)
            if dtype == "int8":
                block = rng.integers(-127, 128, (count, h, size), dtype=np.int8)
            elif dtype == "uint8":
                block = np.zeros((count, h, size), np.uint8)
            else:
                block = (rng.standard_normal((count, h, size)) * 5 + 3).astype(dtype)
            dst.write(block, window=Window(0, row, size, h))
    return path


def best_of(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def shard_build_ratio(work: Path, source: str, size: int, tile: int, repeats: int) -> dict:
    bands, dtype, nodata = (64, "int8", -128) if source == "aef" else (128, "float32", None)
    emb = write_raster(work / f"{source}.tif", bands, size, dtype, nodata)
    labels = write_raster(work / f"{source}_labels.tif", 1, size, "uint8", 255)
    windows = tile_windows(size, size, TileSpec(tile))
    nbytes = len(windows) * bands * tile * tile * np.dtype(dtype).itemsize

    def raw() -> None:
        with rasterio.open(emb) as src:
            for w in windows:
                src.read(window=w)

    def build() -> None:
        out = work / f"shards_{source}"
        index = build_region(
            source,
            "bench",
            emb,
            labels,
            out,
            TileSpec(tile),
            SplitSpec(block_m=1e9),
            fixed_split="train",
            max_samples=64,
        )
        (out / "index.json").write_text(json.dumps(index))

    raw_s, build_s = [], []
    for _ in range(repeats):  # alternate, so both see the same machine state
        raw_s.append(best_of(raw, 1))
        build_s.append(best_of(build, 1))
    mb = nbytes / 1e6
    return {
        f"raw_read_mb_s_{source}": mb / min(raw_s),
        f"shard_build_mb_s_{source}": mb / min(build_s),
        f"shard_build_ratio_{source}": min(raw_s) / min(build_s),
    }


def read_raw(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass


def loader_ratios(work: Path, repeats: int, batch: int = 8) -> dict:
    shards = sorted(str(p) for p in (work / "shards_aef").glob("train-*.tar"))
    index = json.loads((work / "shards_aef" / "index.json").read_text())["splits"]["train"]
    samples = index["samples"]
    read_raw([Path(p) for p in shards])  # warm the page cache for both contenders
    out = {}
    raw_t = best_of(lambda: read_raw([Path(p) for p in shards]), repeats)
    out["raw_tar_samples_s"] = samples / raw_t
    prepare = Dequantize("aef")
    for workers in (0, 2):
        spec = LoaderSpec("aef", 64, batch, num_workers=workers, shuffle_buffer=64)

        def load(dequant: bool = False, spec: LoaderSpec = spec) -> None:
            for b in train_batches(shards, samples, spec, 0, 1, epoch=0):
                if dequant:
                    prepare(b)

        t = best_of(load, repeats)
        out[f"loader_samples_s_w{workers}"] = samples / t
        out[f"loader_ratio_w{workers}"] = raw_t / t
        if workers == 2:
            t = best_of(lambda: load(True), repeats)
            out["loader_dequant_ratio_w2"] = raw_t / t
    return out


def stats_ratio(work: Path, repeats: int, n_tiles: int) -> dict:
    index = json.loads((work / "shards_tessera" / "index.json").read_text())["splits"]["train"]
    shards = [s["path"] for s in index["shards"]]
    keys = [s["keys"] for s in index["shards"]]
    _, _, record = channel_stats("tessera", shards, n_tiles, 0, keys)
    chosen = set(record["tile_keys"])
    needed = [Path(p) for p, ks in zip(shards, keys, strict=True) if chosen & set(ks)]
    read_raw(needed)
    raw_t = best_of(lambda: read_raw(needed), repeats)
    stats_t = best_of(lambda: channel_stats("tessera", shards, n_tiles, 0, keys), repeats)
    return {"stats_s": stats_t, "stats_raw_read_s": raw_t, "stats_ratio": stats_t / raw_t}


def peak_rss(work: Path, size: int, tile: int) -> dict:
    emb = write_raster(work / "big.tif", 64, size, "int8", -128)
    labels = write_raster(work / "big_labels.tif", 1, size, "uint8", 255)
    cmd = [
        sys.executable,
        "-m",
        "emb.shards",
        "--source",
        "aef",
        "--region",
        "big",
        "--emb",
        str(emb),
        "--labels",
        str(labels),
        "--index",
        str(work / "big" / "index.json"),
        "--tile-size",
        str(tile),
        "--split",
        "train",
        "--max-bytes",
        str(256 << 20),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "big_raster_side": size,
        "shard_build_peak_rss_mib": max(after, before) / 1024,
        "shard_build_big_s": seconds,
    }


GOALS = {
    "shard_build_ratio_aef": (">=", 0.7),
    "shard_build_ratio_tessera": (">=", 0.7),
    "loader_ratio_w2": (">=", 0.5),
    "stats_ratio": ("<=", 1.2),
    "shard_build_peak_rss_mib": ("<", 1024),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small inputs, one repeat")
    parser.add_argument("--json", type=Path, help="write all figures as one JSON object")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="emb-bench-", dir=args.workdir))
    size, big, repeats = (512, 1024, 1) if args.quick else (2048, 8192, 3)
    figures: dict[str, float] = {}
    try:
        figures.update(shard_build_ratio(work, "aef", size, 256, repeats))
        figures.update(shard_build_ratio(work, "tessera", size // 2, 256, repeats))
        figures.update(loader_ratios(work, repeats))
        figures.update(stats_ratio(work, repeats, n_tiles=500))
        figures.update(peak_rss(work, big, 256))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'figure':34s} {'value':>10s}  goal")
    for name, value in figures.items():
        goal = GOALS.get(name)
        met = ""
        if goal:
            op, bound = goal
            ok = {">=": value >= bound, "<=": value <= bound, "<": value < bound}[op]
            met = f"{op} {bound}  {'met' if ok else 'MISSED'}"
        print(f"{name:34s} {value:10.3f}  {met}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
