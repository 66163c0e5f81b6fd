"""Shared fixtures: a tiny demo (two regions, both sources) built by the real stage code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import rasterio
import slow_tests
import torch

from emb.classes import ClassMap, load_class_map
from emb.prep.align_labels import align_labels
from emb.prep.demo_region import DEMO_REGIONS, write_region
from emb.prep.manifest import merge_indexes
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec

# One intra-op thread in the test process (subprocesses get OMP_NUM_THREADS=1 from venv_env):
# on a busy 2-core machine torch's default of a thread per core made the tiny fits 15x slower
# (221 against 15 ms a step), and the first evaluate call set 1 anyway, in mid-session.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
CLASSES_CSV = REPO / "config" / "classes.csv"
TINY = {"size": 128, "tile": 32, "block_m": 320.0, "max_samples": 6}


def corrupt_copy(src: Path, dst: Path) -> Path:
    """``src`` as a tiled DEFLATE GeoTIFF whose last block is garbage: the header and the first
    pixel read (the regions check passes), the whole raster does not."""
    with rasterio.open(src) as raster:
        profile = {**raster.profile, "tiled": True, "blockxsize": 64, "blockysize": 64,
                   "compress": "deflate"}  # fmt: skip
        data = raster.read()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(dst, "w", **profile) as out:
        out.write(data)
    with rasterio.open(dst) as raster:
        col, row = raster.width // 64 - 1, raster.height // 64 - 1
        offset = int(raster.get_tag_item(f"BLOCK_OFFSET_{col}_{row}", "TIFF", bidx=1))
        size = int(raster.get_tag_item(f"BLOCK_SIZE_{col}_{row}", "TIFF", bidx=1))
    with open(dst, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * size)
    return dst


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None, what: str = ""):
    """Poll ``predicate`` every 5 ms until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended (code {proc.returncode}) before {what}")
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def venv_env() -> dict[str, str]:
    """The environment for subprocesses: this interpreter's bin first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass(frozen=True)
class TinyDemo:
    root: Path
    rasters: dict[str, dict[str, Path]]  # region -> {"aef", "tessera", "cdl"} paths
    labels: dict[tuple[str, str], Path]  # (source, region) -> label GeoTIFF
    manifests: dict[str, Path]  # source -> manifest.json

    def manifest(self, source: str) -> dict:
        return json.loads(self.manifests[source].read_text())


@pytest.fixture(scope="session")
def class_map() -> ClassMap:
    return load_class_map(CLASSES_CSV)


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory: pytest.TempPathFactory, class_map: ClassMap) -> TinyDemo:
    """Demo rasters -> labels -> shards -> manifests, 128 px regions, 32 px tiles."""
    root = tmp_path_factory.mktemp("tiny_demo")
    rasters, labels, manifests = {}, {}, {}
    for region in DEMO_REGIONS:
        rasters[region.name] = write_region(
            region, TINY["size"], root / "demo" / region.name, CLASSES_CSV, seed=7
        )
    for source in ("aef", "tessera"):
        indexes, paths = [], []
        for name, files in rasters.items():
            label = root / "labels" / source / f"{name}.tif"
            align_labels(files[source], files["cdl"], class_map, label)
            labels[(source, name)] = label
            out_dir = root / "shards" / source / name
            indexes.append(
                build_region(
                    source, name, files[source], label, out_dir,
                    TileSpec(TINY["tile"]), SplitSpec(TINY["block_m"]),
                    max_samples=TINY["max_samples"],
                )
            )  # fmt: skip
            paths.append(out_dir / "index.json")
        manifest = root / "shards" / source / "manifest.json"
        manifest.write_text(json.dumps(merge_indexes(indexes, paths)))
        manifests[source] = manifest
    return TinyDemo(root, rasters, labels, manifests)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marks added here must count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tier (tests/slow_tests.py): mark its tests, and stop on an entry naming nothing;
    the longest modules first (what pytest-xdist's workers take in this order)."""
    here = config.invocation_params.dir
    whole = any((here / arg).resolve() in (REPO, REPO / "tests") for arg in config.args)
    problems = slow_tests.check(config.rootpath, items, config.args, whole)
    if problems:
        raise pytest.UsageError(
            "tests/slow_tests.py names tests or fixtures that do not exist:\n  "
            + "\n  ".join(problems)
        )
    slow_tests.mark(config.rootpath, items)
    slow_tests.order(items)
    config.stash[slow_tests.COLLECTED] = list(items)
