"""Scale benchmark: the bookkeeping of a cluster-sized dataset (file counts, not bytes).

A synthetic source of 1,000 regions x 20 shards = 20,000 shards, written by the project's
shard writer (index sidecars, moments), with tiny TESSERA tiles (128 x 8 x 8); per region 18
training shards holding 20 tiles (two hold two), one validation and one test shard: 20,000
training tiles. Each stage then runs in its own process, as Snakemake and torchrun run it,
and reports its own time (interpreter and imports excluded) and peak RSS:

- manifest_merge_s, manifest_peak_rss_mib: ``emb.prep.manifest`` over the 1,000 region
  indexes (goals < 5 s, < 1024 MiB).
- loader_first_batch_s, loader_peak_rss_mib: two rank processes (world 2, 2 reader threads
  each) started together, each from reading the manifest to its first training batch; the
  slower rank's time and the larger RSS (goals < 5 s, < 1024 MiB).
- stats_s, stats_peak_rss_mib: ``emb.prep.channel_stats --n-tiles all`` over the 20,000
  training tiles, merged from their stored moments (goals < 5 s, < 1024 MiB).

Usage: ``python bench/scale.py [--json PATH] [--workdir DIR] [--keep] [--regions N]``.
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
from pathlib import Path

import numpy as np

from emb.io import write_json
from emb.prep.moments import moments_array, tile_moments
from emb.prep.shard_writer import TarShard, encode_npy

TILE, DIM, SHARDS_PER_REGION = 8, 128, 20
TRAIN_TILES = [2, 2] + [1] * 16  # 18 training shards, 20 tiles


def write_region(root: Path, region: str, rng: np.random.Generator) -> Path:
    """A region's shards and its index JSON, as ``emb.prep.shards`` writes them."""
    folder = root / region
    folder.mkdir(parents=True)
    splits = {}
    for split, sizes in (("train", TRAIN_TILES), ("val", [1]), ("test", [1])):
        shards = []
        for n, size in enumerate(sizes):
            path = folder / f"{split}-{n:04d}.tar"
            sink, keys = TarShard(str(path)), []
            for i in range(size):
                keys.append(f"{region}_{n * 8}_{i * 8}")
                sink.write(sample(keys[-1], rng, split == "train"))
            sink.close()
            shards.append({"path": str(path), "samples": size, "bytes": path.stat().st_size,
                           "keys": keys})  # fmt: skip
        samples = sum(sizes)
        splits[split] = {
            "shards": shards, "samples": samples, "labelled_pixels": samples * TILE * TILE,
            "class_hist": [samples * TILE * TILE] + [0] * 60,
            "bytes_per_sample": sum(s["bytes"] for s in shards) / samples,
        }  # fmt: skip
    index = {"source": "tessera", "region": region, "in_dim": DIM, "tile_size": TILE,
             "dtype": "int8", "dropped": {}, "splits": splits}  # fmt: skip
    write_json(folder / "index.json", index)
    return folder / "index.json"


def sample(key: str, rng: np.random.Generator, train: bool) -> dict:
    q = rng.integers(-127, 128, (DIM, TILE, TILE), dtype=np.int8)
    scale = (rng.random((TILE, TILE)) * 0.02 + 0.001).astype(np.float32)
    arrays = {"emb": q, "scale": scale, "label": np.zeros((TILE, TILE), np.uint8)}
    if train:
        arrays["moments"] = moments_array(*tile_moments("tessera", arrays))
    out: dict = {"__key__": key} | {f"{k}.npy": encode_npy(a) for k, a in arrays.items()}
    out["meta.json"] = (b'{"region": "synthetic"}',)
    return out


# --- the stages, each run in a child process (``--child NAME ARGS``) ---------------------


def child_manifest(indexes_file: str, out: str) -> dict:
    from emb.prep.manifest import main  # noqa: PLC0415 - imports are not the stage's time

    indexes = Path(indexes_file).read_text().split()
    start = time.perf_counter()
    main([*indexes, "--out", out, "--ranks", "2", "--workers", "2"])
    return {"s": time.perf_counter() - start}


def child_rank(manifest_path: str, rank: str) -> dict:
    from emb.loading.batches import LoaderSpec, train_batches  # noqa: PLC0415
    from emb.loading.shard_manifest import read_manifest, shard_sample_counts  # noqa: PLC0415

    start = time.perf_counter()
    train = read_manifest(Path(manifest_path))["splits"]["train"]
    spec = LoaderSpec("tessera", DIM, batch_size=8, num_workers=2, shuffle_buffer=256, seed=0)
    batches = train_batches(train["shards"], train["samples"], spec, int(rank), 2, 0,
                            shard_samples=shard_sample_counts(train))  # fmt: skip
    batch = next(batches)
    seconds = time.perf_counter() - start
    batches.close()
    assert batch["emb"].shape == (8, DIM, TILE, TILE)
    return {"s": seconds}


def child_stats(manifest_path: str, out_dir: str) -> dict:
    from emb.prep.channel_stats import main  # noqa: PLC0415

    start = time.perf_counter()
    main(["--manifest", manifest_path, "--n-tiles", "all", "--out-dir", out_dir])
    seconds = time.perf_counter() - start
    record = json.loads((Path(out_dir) / "stats.json").read_text())
    return {"s": seconds, "tiles": record["n_tiles"], "stored": record["stored_moments"]}


CHILDREN = {"manifest": child_manifest, "rank": child_rank, "stats": child_stats}


def spawn(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--child", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{proc.args}: exit {proc.returncode}\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


GOALS = {
    "manifest_merge_s": 5.0, "manifest_peak_rss_mib": 1024.0,
    "loader_first_batch_s": 5.0, "loader_peak_rss_mib": 1024.0,
    "stats_s": 5.0, "stats_peak_rss_mib": 1024.0,
}  # fmt: skip


def run(work: Path, regions: int) -> dict:
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    indexes = [write_region(work / "shards", f"r{i:04d}", rng) for i in range(regions)]
    figures: dict = {"regions": regions, "shards": regions * SHARDS_PER_REGION}
    figures["generate_s"] = time.perf_counter() - start
    (work / "indexes.txt").write_text("\n".join(map(str, indexes)))
    manifest = work / "manifest.json"
    merged = result(spawn("manifest", str(work / "indexes.txt"), str(manifest)))
    figures |= {"manifest_merge_s": merged["s"], "manifest_peak_rss_mib": merged["rss_mib"]}
    ranks = [result(p) for p in [spawn("rank", str(manifest), str(r)) for r in (0, 1)]]
    figures["loader_first_batch_s"] = max(r["s"] for r in ranks)
    figures["loader_peak_rss_mib"] = max(r["rss_mib"] for r in ranks)
    stats = result(spawn("stats", str(manifest), str(work / "stats")))
    figures |= {"stats_tiles": stats["tiles"], "stats_stored_moments": stats["stored"]}
    figures |= {"stats_s": stats["s"], "stats_peak_rss_mib": stats["rss_mib"]}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write all figures as one JSON object")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--regions", type=int, default=1000)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        figures = CHILDREN[args.child[0]](*args.child[1:])
        figures["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(figures))
        return
    work = Path(tempfile.mkdtemp(prefix="emb-scale-", dir=args.workdir))
    try:
        figures = run(work, args.regions)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'figure':26s} {'value':>10s}  goal")
    for name, value in figures.items():
        goal = GOALS.get(name)
        met = f"< {goal:g}  {'met' if value < goal else 'MISSED'}" if goal else ""
        print(f"{name:26s} {value:10.3f}  {met}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
