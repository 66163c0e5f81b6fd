"""Data-stage benchmarks: each figure is a ratio of two things timed side by side in one run.

Contenders alternate (raw, stage, raw, stage, ...) and each keeps its best time, so both see
the same machine; the machine is shared, so run it twice and compare.

- shard_build_ratio_{aef,tessera}: shard-build MB/s / plain rasterio windowed read MB/s of the
  same windows, both under the build's GDAL cache size, index sidecars and (TESSERA) every
  tile's moments written (goals: AEF >= 0.7, TESSERA >= 0.8). Each build starts from an empty
  output folder: replacing files by rename makes ext4 flush them first, a cost of re-runs on
  that file system, not of the build. ``shard_build_moments_share_tessera``: the moments of
  the built tiles summed on one thread / the build time (what they cost it at most; the
  build overlaps them with reading the next tile).
- loader_ratio_w{0,2}: loader samples/s (``train_batches``, one epoch, worker start-up
  included, offsets from the shards' sidecars) / raw sequential read of the same tar bytes
  (goal for w2 >= 0.8); ``index_scan_ratio``: reading a shard's sidecar / scanning its
  headers (what the sidecar saves before the first batch, more so on Lustre);
  ``loader_steady_ratio_w2`` times from the first batch on (start-up excluded);
  ``loader_dequant_ratio_w2`` adds ``Dequantize`` (with augmentation) on the CPU;
  ``loader_process_ceiling_ratio_w2``: two DataLoader worker *processes* that only read each
  batch's bytes into shared memory (no decode, no batching logic): the most a process-based
  loader can reach here, kept to show why the loader reads in threads (emb.loading.batch_reader).
  Absolute figures beside them: ``raw_tar_mb_s``, ``loader_mb_s_w{0,2}`` (MB/s of shard
  bytes), ``loader_samples_s_w{0,2}`` and ``loader_samples_s_per_thread_w2``, to set against
  the bandwidth a GPU node needs at the recipe (docs/gpu.md).
- stats_ratio: ``channel_stats`` time (moments stored by the build, merged) / raw read time
  of the sampled tiles' arrays (``emb``, ``scale``), page cache warm (goal <= 0.2);
  ``stats_ratio_cold``: both after evicting the shards from the page cache, as for a stats
  job on another node reading from disk or Lustre (goal <= 0.2). ``stats_subset_*``: a
  quarter of the tiles sampled. ``stats_from_tiles_ratio``: the same stage on copies of the
  shards without moments (it reads the tiles and sums them, as before moments were stored);
  ``stats_sum_1thread_ratio`` (those sums alone on one thread / the warm read) and
  ``stats_floor_ratio`` (one int8 sum: the least work that touches every value) show why
  reading the tiles could not get near the goal on two cores.
- shard_build_peak_rss_mib: peak RSS of ``python -m emb.prep.shards`` on an SxSx64 int8 raster
  (default S = 8192; goal < 1024 MiB), measured by a wrapper process whose only child is the
  build.

Usage: ``python bench/data.py [--quick] [--json PATH] [--workdir DIR] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import rasterio
import torch
from affine import Affine
from rasterio.windows import Window
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from emb.loading import sidecar
from emb.loading.batches import LoaderSpec, train_batches
from emb.loading.dequantize import Dequantize
from emb.loading.shard_index import SampleAt, scan_shard
from emb.prep.channel_stats import channel_stats, tile_moments
from emb.prep.shards import GDAL_CACHE_MB, build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec, tile_windows

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


def alternate(contenders: dict[str, Callable[[], object]], repeats: int, before=None) -> dict:
    """Best seconds of each contender, run in turns so that all see the same machine."""
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(repeats):
        for name, fn in contenders.items():
            if before:
                before()
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def shard_build_ratio(work: Path, source: str, size: int, tile: int, repeats: int) -> dict:
    bands, dtype, nodata = (64, "int8", -128) if source == "aef" else (128, "float32", None)
    emb = write_raster(work / f"{source}.tif", bands, size, dtype, nodata)
    labels = write_raster(work / f"{source}_labels.tif", 1, size, "uint8", 255)
    os.sync()  # the rasters' write-back would otherwise run during the first timings
    windows = tile_windows(size, size, TileSpec(tile))
    nbytes = len(windows) * bands * tile * tile * np.dtype(dtype).itemsize
    out = work / f"shards_{source}"

    def raw() -> None:
        with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_MB << 20), rasterio.open(emb) as src:
            for w in windows:
                src.read(window=w)

    def build() -> None:
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

    def fresh_output() -> None:  # untimed; see the module docstring
        shutil.rmtree(out, ignore_errors=True)

    best = alternate({"raw": raw, "build": build}, repeats, before=fresh_output)
    build()  # leave the shards for the loader and stats figures
    mb = nbytes / 1e6
    figures = {
        f"raw_read_mb_s_{source}": mb / best["raw"],
        f"shard_build_mb_s_{source}": mb / best["build"],
        f"shard_build_ratio_{source}": best["raw"] / best["build"],
    }
    if source != "aef":
        figures["shard_build_moments_share_tessera"] = moments_time(out, repeats) / best["build"]
    return figures


def moments_time(out: Path, repeats: int) -> float:
    """Best seconds to compute the moments of every built tile, on one thread, in memory."""
    samples = [s for p in sorted(out.glob("*.tar")) for s in scan_shard(str(p))]
    tiles = [{n: read_array(s, n) for n in ("emb", "scale")} for s in samples]

    def moments() -> None:
        for tile in tiles:
            tile_moments("tessera", tile)

    return alternate({"moments": moments}, repeats)["moments"]


def read_raw(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass


def evict(paths: list[Path]) -> None:
    """Drop these files from the page cache (written back first), so the next read is cold."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class RawSamples(IterableDataset):
    """Each batch's bytes read into shared memory: a 2-process loader's ceiling."""

    def __init__(self, shards: list[str], sample_bytes: int, batch: int) -> None:
        self.shards, self.sample_bytes, self.batch = shards, sample_bytes, batch

    def __iter__(self):
        info = get_worker_info()
        mine = self.shards[info.id :: info.num_workers] if info else self.shards
        for path in mine:
            with open(path, "rb", buffering=0) as fh:
                while True:
                    nbytes = self.batch * self.sample_bytes
                    storage = torch.UntypedStorage._new_shared(nbytes)
                    out = torch.empty(0, dtype=torch.uint8).set_(storage)
                    got = fh.readinto(out.numpy())
                    if not got:
                        break
                    yield out[:got]


def loader_ratios(work: Path, repeats: int, batch: int = 8) -> dict:
    shards = sorted(str(p) for p in (work / "shards_aef").glob("train-*.tar"))
    index = json.loads((work / "shards_aef" / "index.json").read_text())["splits"]["train"]
    samples = index["samples"]
    sample_bytes = index["bytes_per_sample"]
    read_raw([Path(p) for p in shards])  # warm the page cache for every contender
    prepare = Dequantize("aef")
    first: dict[str, float] = {}

    def load(workers: int, dequant: bool = False) -> None:
        spec = LoaderSpec("aef", 64, batch, num_workers=workers, shuffle_buffer=64, seed=0)
        start = time.perf_counter()
        for i, b in enumerate(train_batches(shards, samples, spec, 0, 1, epoch=0)):
            if i == 0:
                first[f"w{workers}"] = time.perf_counter() - start
            if dequant:
                prepare(b)

    def ceiling() -> None:
        dataset = RawSamples(shards, int(sample_bytes), batch)
        for _ in DataLoader(dataset, batch_size=None, num_workers=2):
            pass

    steady = float("inf")

    def load_w2() -> None:
        nonlocal steady
        start = time.perf_counter()
        load(2)
        steady = min(steady, time.perf_counter() - start - first["w2"])

    best = alternate(
        {
            "raw": lambda: read_raw([Path(p) for p in shards]),
            "w0": lambda: load(0),
            "w2": load_w2,
            "w2_dequant": lambda: load(2, True),
            "ceiling": ceiling,
            "sidecar": lambda: [sidecar.read_sidecar(p, Path(p).stat().st_size) for p in shards],
            "scan": lambda: [scan_shard(p) for p in shards],
        },
        repeats,
    )
    raw_t = best["raw"]
    mb = samples * sample_bytes / 1e6
    threads_w2 = min(2, len(shards))  # train_batches never starts more threads than shards
    return {
        "index_scan_ratio": best["sidecar"] / best["scan"],
        "loader_epoch_samples": samples,
        "loader_sample_mib": sample_bytes / 2**20,
        "raw_tar_samples_s": samples / raw_t,
        "raw_tar_mb_s": mb / raw_t,
        # absolute figures beside the ratios: a GPU at 760-1000 samples/s needs 3-4 GB/s of
        # 4 MiB AEF samples (docs/gpu.md); w0 reads on the consumer's one thread
        "loader_samples_s_w0": samples / best["w0"],
        "loader_mb_s_w0": mb / best["w0"],
        "loader_ratio_w0": raw_t / best["w0"],
        "loader_samples_s_w2": samples / best["w2"],
        "loader_mb_s_w2": mb / best["w2"],
        "loader_samples_s_per_thread_w2": samples / best["w2"] / threads_w2,
        "loader_ratio_w2": raw_t / best["w2"],
        "loader_steady_ratio_w2": raw_t * (samples - batch) / samples / steady,
        "loader_startup_s_w2": first["w2"],
        "loader_dequant_ratio_w2": raw_t / best["w2_dequant"],
        "loader_process_ceiling_ratio_w2": raw_t / best["ceiling"],
    }


STATS_ARRAYS = ("emb", "scale")


def stats_ratio(work: Path, repeats: int) -> dict:
    """Stats of every training tile (64) and of a quarter of them, each against a raw read of
    exactly the arrays stats needs of the sampled tiles."""
    index = json.loads((work / "shards_tessera" / "index.json").read_text())["splits"]["train"]
    shards = [s["path"] for s in index["shards"]]
    keys = [s["keys"] for s in index["shards"]]
    figures, sampled = stats_vs_raw(shards, keys, 500, repeats, "")
    figures |= stats_vs_raw(shards, keys, sum(map(len, keys)) // 4, repeats, "_subset")[0]
    old = without_moments(shards, work / "shards_tessera_old")
    best = alternate(
        {"raw": lambda: read_arrays_raw(sampled, STATS_ARRAYS),
         "tiles": lambda: fresh_stats(old, 500, keys)},
        repeats,
    )  # fmt: skip
    figures["stats_from_tiles_ratio"] = best["tiles"] / best["raw"]
    return figures | stats_arithmetic(sampled, repeats)


def fresh_stats(shards: list[str], n_tiles: int, keys: list[list[str]]) -> None:
    """``channel_stats`` as a new stats job runs it: no shard index remembered."""
    sidecar._indexed.cache_clear()
    sidecar._scanned.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the copies without moments or sidecars say so
        channel_stats("tessera", shards, n_tiles, 0, keys)


def without_moments(shards: list[str], dest: Path) -> list[str]:
    """Copies of ``shards`` without moments members or sidecars, as built before them."""
    dest.mkdir(exist_ok=True)
    out = []
    for url in shards:
        path = dest / Path(url).name
        with tarfile.open(url) as src, tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as dst:
            for member in src.getmembers():
                if not member.name.endswith(".moments.npy"):
                    dst.addfile(member, src.extractfile(member))
        out.append(str(path))
    return out


def stats_vs_raw(
    shards: list[str], keys: list[list[str]], n_tiles: int, repeats: int, tag: str
) -> tuple[dict, list[SampleAt]]:
    _, _, record = channel_stats("tessera", shards, n_tiles, 0, keys)
    chosen = set(record["tile_keys"])
    sampled = [s for p in shards for s in scan_shard(p) if s.key in chosen]
    needed = sorted({Path(s.url) for s in sampled})
    needed += [Path(sidecar.sidecar_path(p)) for p in needed]
    contenders = {
        "raw": lambda: read_arrays_raw(sampled, STATS_ARRAYS),
        "stats": lambda: fresh_stats(shards, n_tiles, keys),
    }
    read_arrays_raw(sampled, STATS_ARRAYS)
    warm = alternate(contenders, repeats)
    cold = alternate(contenders, repeats, before=lambda: evict(needed))
    figures = {
        f"stats{tag}_tiles": len(chosen),
        f"stats{tag}_stored_moments": record["stored_moments"],
        f"stats{tag}_s": warm["stats"],
        f"stats{tag}_raw_read_s": warm["raw"],
        f"stats{tag}_ratio": warm["stats"] / warm["raw"],
        f"stats{tag}_cold_s": cold["stats"],
        f"stats{tag}_raw_read_cold_s": cold["raw"],
        f"stats{tag}_ratio_cold": cold["stats"] / cold["raw"],
    }
    return figures, sampled


def stats_arithmetic(sampled: list[SampleAt], repeats: int) -> dict:
    """The sums alone on one thread, and one int8 sum, over tiles held in memory."""
    tiles = [{n: read_array(s, n) for n in STATS_ARRAYS} for s in sampled]

    def floor() -> None:
        for tile in tiles:
            tile["emb"].sum(dtype=np.int64)

    def one_thread() -> None:
        for tile in tiles:
            tile_moments("tessera", tile)

    def raw() -> None:
        read_arrays_raw(sampled, STATS_ARRAYS)

    best = alternate({"raw": raw, "floor": floor, "one_thread": one_thread}, repeats)
    return {
        "stats_floor_ratio": best["floor"] / best["raw"],
        "stats_sum_1thread_ratio": best["one_thread"] / best["raw"],
    }


def read_array(sample: SampleAt, name: str) -> np.ndarray:
    at = sample.arrays[name]
    count = math.prod(at.shape)
    return np.fromfile(sample.url, at.dtype, count, offset=at.offset).reshape(at.shape)


def read_arrays_raw(samples: list[SampleAt], names: tuple[str, ...]) -> None:
    """Each sample's ``names`` arrays read at their offsets into one reused buffer."""
    buffer = bytearray(max(s.arrays[n].nbytes for s in samples for n in names))
    files: dict[str, BinaryIO] = {}
    try:
        for sample in samples:
            if sample.url not in files:
                files[sample.url] = open(sample.url, "rb", buffering=0)  # noqa: SIM115
            for name in names:
                at = sample.arrays[name]
                files[sample.url].seek(at.offset)
                files[sample.url].readinto(memoryview(buffer)[: at.nbytes])
    finally:
        for fh in files.values():
            fh.close()


def peak_rss(work: Path, size: int, tile: int) -> dict:
    emb = write_raster(work / "big.tif", 64, size, "int8", -128)
    labels = write_raster(work / "big_labels.tif", 1, size, "uint8", 255)
    cmd = [
        sys.executable,
        "-m",
        "emb.prep.shards",
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
        "--block-m",
        "1280",
        "--split",
        "train",
        "--max-bytes",
        str(256 << 20),
    ]
    # A fresh wrapper process whose only child is the build: RUSAGE_CHILDREN of this bench
    # would also count DataLoader workers forked earlier from a large parent.
    wrapper = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", wrapper, *cmd], check=True, capture_output=True)
    seconds = time.perf_counter() - start
    after = int(done.stdout.split()[-1])
    return {
        "big_raster_side": size,
        "shard_build_peak_rss_mib": after / 1024,
        "shard_build_big_s": seconds,
    }


GOALS = {
    "shard_build_ratio_aef": (">=", 0.7),
    "shard_build_ratio_tessera": (">=", 0.8),
    "loader_ratio_w2": (">=", 0.8),
    "stats_ratio": ("<=", 0.2),
    "stats_ratio_cold": ("<=", 0.2),
    "stats_subset_ratio": ("<=", 0.2),
    "stats_subset_ratio_cold": ("<=", 0.2),
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
    size, big, repeats = (1024, 1024, 1) if args.quick else (4096, 8192, 3)
    figures: dict[str, float] = {}
    try:
        figures.update(shard_build_ratio(work, "aef", size, 256, repeats))
        figures.update(shard_build_ratio(work, "tessera", size // 2, 256, repeats))
        figures.update(loader_ratios(work, repeats))
        figures.update(stats_ratio(work, repeats))
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
