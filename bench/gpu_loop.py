"""bench/gpu.py part (b): the real training module through the launcher, on synthetic shards.

Why synthetic shards written directly: the demo's rasters take minutes to synthesize at full
size (``demo_region`` at 1536 px: over 160 s on 16 cores) and their content does not change a
step's cost. The shards are real ones all the same: emb's shard writer (tar members and index
sidecars), ``shard_arrays`` for the stored arrays (TESSERA quantized, with a per-pixel scale;
its training tiles' moments), a region index as ``emb.prep.shards`` writes it; the manifest and
the channel statistics come from their own stages (``python -m emb.prep.manifest``,
``python -m emb.prep.channel_stats``). A few distinct tiles are written many times under their
own keys: writing, not drawing random numbers, is what the set-up costs.

Each run is then resolved by ``python -m emb.training.train_config`` (defaults, the run's file,
a bench overlay: the step count, ``logging.detail_every``, one validation at the end) and
trained by ``python -m emb.cluster.launch ... -- emb.training.train``, the ``train`` rule's
command. Its figures come from the loop's own detailed log lines (``samples/s X ...
data_wait Y%``, each averaged since the previous detailed line); the first window holds the
warm-up (cuDNN autotuning, the loader's first fill) and is reported apart.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from emb.classes import N_L3
from emb.io import write_json
from emb.prep.moments import moments_array, stores_moments, tile_moments
from emb.prep.shard_writer import encode_npy, write_shards
from emb.rasters import BANDS, shard_arrays

REPO = Path(__file__).resolve().parents[1]
DETAIL = re.compile(r"step (\d+) .*samples/s ([0-9.]+) .*data_wait ([0-9.]+)%")
POOL = 4  # distinct tiles per source, written in turn
RUNS = {  # run: (arch, bands, recipe batch per GPU)
    "aef_segformer": ("segformer", 64, 32),
    "aef_deeplab": ("deeplab", 64, 64),
    "tessera_segformer": ("segformer", 128, 32),
    "tessera_deeplab": ("deeplab", 128, 64),
}
TINY = {"widths": (8, 8, 16, 16), "depths": (1, 1, 1, 1), "decoder_dim": 8}
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class LoopSpec:
    """Shards and run length of part (b)."""

    tile: int  # px
    train_tiles: int  # per source
    val_tiles: int
    test_tiles: int
    shard_tiles: int  # tiles per shard
    steps: int  # optimizer steps (train.max_updates)
    detail_every: int  # logging.detail_every: one figure window per this many steps
    threads: int  # the launcher's --threads (config launch.threads)
    cpu: bool  # hide GPUs from the jobs (``--device cpu`` on a GPU machine)
    model: dict | None = None  # a model: overlay (the tiny models), else the run's own


def job_env(cpu: bool) -> dict[str, str]:
    """The environment of a launched stage: this interpreter first on PATH, no torchrun state
    of a caller, and no GPU when the bench runs on the CPU."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def stage(args: list[str], log: Path, env: dict[str, str]) -> float:
    """Run ``python -m ...`` (or the launcher) with its output in ``log``; seconds taken.
    A failure ends the bench with the log's tail."""
    tick = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, stdout=out,
                              stderr=subprocess.STDOUT)  # fmt: skip
    if done.returncode:
        tail = log.read_text()[-4000:]
        raise SystemExit(f"bench/gpu.py: {' '.join(args[:1])} failed ({done.returncode}), "
                         f"log {log}:\n{tail}")  # fmt: skip
    return time.perf_counter() - tick


def tile_pool(source: str, tile: int) -> list[dict[str, np.ndarray]]:
    """``POOL`` distinct tiles as the shard stage stores them: ``emb`` (D, T, T) int8,
    TESSERA's ``scale`` (T, T) float32, ``label`` (T, T) uint8 L3 ids."""
    rng = np.random.default_rng(0)
    pool = []
    for _ in range(POOL):
        shape = (BANDS[source], tile, tile)
        if source == "aef":
            block = rng.integers(-127, 128, shape, dtype=np.int8)
        else:
            block = rng.normal(0.0, 0.5, shape).astype(np.float32)
        arrays = shard_arrays(source, block, None)
        arrays["label"] = rng.integers(0, N_L3, (tile, tile), dtype=np.uint8)
        pool.append(arrays)
    return pool


def samples(
    source: str, pool: list[dict[str, np.ndarray]], first: int, n: int, moments: bool
) -> Iterator[dict]:
    """``n`` encoded samples (keys ``synthetic_{row}_0``), the pool's tiles in turn."""
    encoded = []
    for arrays in pool:
        stored = dict(arrays)
        if moments and stores_moments(source):  # what the statistics read
            stored["moments"] = moments_array(*tile_moments(source, arrays))
        encoded.append({f"{name}.npy": encode_npy(a) for name, a in stored.items()})
    tile = pool[0]["label"].shape[0]
    for i in range(first, first + n):
        window = [0, i * tile, tile, tile]
        meta = {"region": "synthetic", "source": source, "window": window, "block": i,
                "crs": "EPSG:32615", "transform": [10, 0, 4e5, 0, -10, 5e6]}  # fmt: skip
        key = f"synthetic_{i * tile}_0"
        yield {"__key__": key, **encoded[i % POOL], "meta.json": (json.dumps(meta).encode(),)}


def write_source(source: str, root: Path, spec: LoopSpec) -> Path:
    """One source's shards and region index, as ``emb.prep.shards`` writes them."""
    folder = root / "shards" / source
    folder.mkdir(parents=True)
    pool = tile_pool(source, spec.tile)
    hist = [np.bincount(a["label"].ravel(), minlength=N_L3)[:N_L3] for a in pool]
    splits, first = {}, 0
    for split, n in (("train", spec.train_tiles), ("val", spec.val_tiles),
                     ("test", spec.test_tiles)):  # fmt: skip
        written = samples(source, pool, first, n, split == "train")
        shards = write_shards(written, str(folder / f"{split}-%04d.tar"), spec.shard_tiles, 1 << 40)
        counts = np.sum([hist[i % POOL] for i in range(first, first + n)], axis=0)
        splits[split] = {
            "shards": shards, "samples": n, "labelled_pixels": int(counts.sum()),
            "class_hist": counts.tolist(),
            "blocks": {f"synthetic_{i * spec.tile}_0": i for i in range(first, first + n)},
            "bytes_per_sample": sum(s["bytes"] for s in shards) / n,
        }  # fmt: skip
        first += n
    index = {"source": source, "region": "synthetic", "in_dim": BANDS[source],
             "tile_size": spec.tile, "dtype": "int8", "split_group": "synthetic",
             "dropped": {s: {} for s in splits}, "splits": splits}  # fmt: skip
    write_json(folder / "index.json", index)
    return folder / "index.json"


def prepare_source(source: str, root: Path, spec: LoopSpec) -> dict[str, object]:
    """Shards, manifest and statistics of ``source``; their paths and the seconds taken."""
    tick = time.perf_counter()
    index = write_source(source, root, spec)
    written = time.perf_counter() - tick
    manifest, stats = root / "shards" / source / "manifest.json", root / "stats" / source
    env = job_env(spec.cpu)
    stage(["emb.prep.manifest", str(index), "--out", str(manifest), "--ranks", "1",
           "--workers", "4"], root / f"manifest_{source}.log", env)  # fmt: skip
    stage(["emb.prep.channel_stats", "--manifest", str(manifest), "--n-tiles", "64",
           "--out-dir", str(stats)], root / f"stats_{source}.log", env)  # fmt: skip
    return {"manifest": manifest, "stats": stats, "write_s": written}


def overlay(spec: LoopSpec) -> dict:
    """The bench's train config overlay: run length, detailed lines, one validation at the
    end (it writes best.pt, which part (c) maps with), no epoch checkpoints."""
    train = {"max_updates": spec.steps, "val_every_updates": spec.steps, "save_every": 0}
    if spec.model:  # tiny: part (a)'s tiny batch
        train["batch_size"] = 2
    every = spec.detail_every
    cfg: dict = {"train": train, "logging": {"log_every": every, "detail_every": every}}
    if spec.model:  # YAML has lists, not tuples
        cfg["model"] = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.model.items()}
    return cfg


def windows(log: str) -> list[tuple[int, float, float]]:
    """(step, samples/s, data wait share) of each detailed line of a training log."""
    return [(int(m[1]), float(m[2]), float(m[3]) / 100) for m in DETAIL.finditer(log)]


def train_run(run: str, source: dict[str, object], root: Path, spec: LoopSpec) -> dict:
    """Resolve and train ``run`` as the workflow does; its row of figures."""
    run_dir = root / "runs" / run
    run_dir.mkdir(parents=True)
    extra = root / "bench_overlay.yaml"
    extra.write_text(yaml.safe_dump(overlay(spec)))
    env = job_env(spec.cpu)
    sets = [f"--set=data.manifest={source['manifest']}", f"--set=data.stats_dir={source['stats']}",
            f"--set=data.classes={REPO / 'config/classes.csv'}"]  # fmt: skip
    files = [str(REPO / "config/train/defaults.yaml"), str(REPO / f"config/train/{run}.yaml"),
             str(extra)]  # fmt: skip
    config = run_dir / "config.yaml"
    schema = REPO / "workflow/schemas/train.schema.yaml"
    stage(["emb.training.train_config", f"--schema={schema}", f"--out={config}", *sets, "--",
           *files], root / f"train_config_{run}.log", env)  # fmt: skip
    log = root / f"train_{run}.log"
    seconds = stage(["emb.cluster.launch", "--nodes", "1", "--nproc-per-node", "1",
                     "--threads", str(spec.threads),
                     f"--checkpoint={run_dir / 'ranks/rank0.stopped.json'}", "--attempt=1",
                     f"--failure-record={run_dir / 'launch.failed.json'}", "--",
                     "emb.training.train", f"--config={config}"], log, env)  # fmt: skip
    found = windows(log.read_text())
    if not found:
        raise SystemExit(f"bench/gpu.py: no 'samples/s ... data_wait' line in {log}")
    steady = found[1:] or found  # the first window holds the warm-up
    summary = json.loads((run_dir / "train.json").read_text())
    resolved = yaml.safe_load(config.read_text())
    return {
        "run": run, "batch": resolved["train"]["batch_size"], "px": spec.tile,
        "channels_last": summary.get("provenance", {}).get("channels_last"),
        "steps": summary["steps"], "job_s": seconds,
        "samples_s": statistics.median(w[1] for w in steady),
        "data_wait": statistics.median(w[2] for w in steady),
        "warmup_samples_s": found[0][1], "warmup_data_wait": found[0][2],
        "windows": [{"step": s, "samples_s": r, "data_wait": w} for s, r, w in found],
        "run_dir": str(run_dir),
    }  # fmt: skip


def bench_loop(runs: list[str], root: Path, spec: LoopSpec) -> tuple[list[dict], dict]:
    """Rows of part (b) for ``runs``, and each source's set-up seconds (shards written)."""
    sources: dict[str, dict[str, object]] = {}
    rows = []
    for run in runs:
        source = run.split("_")[0]
        if source not in sources:
            sources[source] = prepare_source(source, root, spec)
        rows.append(train_run(run, sources[source], root, spec))
    return rows, {s: round(float(v["write_s"]), 2) for s, v in sources.items()}


def of_bare(loop: list[dict], steps: list[dict]) -> None:
    """Each loop row's samples/s over the fastest bare step (eager or channels_last) of part
    (a) for the same run, where (a) ran it."""
    for row in loop:
        bare = [r["samples_s"] for r in steps
                if r["run"] == row["run"] and r["step"] in ("bare/eager", "bare/cl")]  # fmt: skip
        row["of_bare"] = row["samples_s"] / max(bare) if bare else None


def print_loop(rows: list[dict]) -> None:
    """Part (b)'s table: the loop's figures after its first (warm-up) window."""
    print(f"\n{'run (training job)':18s} {'batch':>5s} {'cl':>5s} {'steps':>5s} "
          f"{'samples/s':>10s} {'data wait':>9s} {'of bare':>8s} {'warm-up/s':>9s} "
          f"{'job s':>7s}")  # fmt: skip
    for r in rows:
        bare = f"{r['of_bare']:.2f}" if r.get("of_bare") else "-"
        cl = str(r["channels_last"] or "-")
        print(f"{r['run']:18s} {r['batch']:5d} {cl:>5s} {r['steps']:5d} {r['samples_s']:10.1f} "
              f"{r['data_wait']:9.1%} {bare:>8s} {r['warmup_samples_s']:9.1f} "
              f"{r['job_s']:7.1f}")  # fmt: skip
