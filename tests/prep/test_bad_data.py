"""Bad data gets a clear error naming the file, and nothing already written is lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from conftest import TINY, TinyDemo, venv_env

from emb.loading.batches import LoaderError, LoaderSpec, eval_batches, train_batches
from emb.loading.shard_manifest import shard_sample_counts
from emb.prep.align_labels import AlignmentError, align_labels
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec, TilingError
from emb.prep.tiles import TileSpec


def copy_split(demo: TinyDemo, source: str, split: str, dest: Path) -> tuple[list[str], dict]:
    """Copies of one split's shards, and their expected sample counts."""
    part = demo.manifest(source)["splits"][split]
    dest.mkdir(parents=True, exist_ok=True)
    paths = [str(Path(shutil.copy(p, dest))) for p in part["shards"]]
    return paths, dict(zip(paths, part["shard_samples"], strict=True))


def drain(batches) -> int:
    return sum(b["emb"].shape[0] for b in batches)


def spec(source: str = "aef", in_dim: int = 64) -> LoaderSpec:
    return LoaderSpec(source, in_dim, batch_size=4, num_workers=0, shuffle_buffer=8, seed=0)


def test_shard_truncated_inside_a_member_names_the_shard(tiny_demo: TinyDemo, tmp_path) -> None:
    shards, counts = copy_split(tiny_demo, "aef", "train", tmp_path)
    data = Path(shards[0]).read_bytes()
    Path(shards[0]).write_bytes(data[: len(data) // 2 + 700])
    with pytest.raises(LoaderError, match=Path(shards[0]).name):
        drain(eval_batches(shards, spec(), shard_samples=counts))


def test_shard_truncated_between_members_is_caught_by_the_count(tiny_demo: TinyDemo, tmp_path):
    shards, counts = copy_split(tiny_demo, "aef", "train", tmp_path)
    import tarfile

    with tarfile.open(shards[0]) as tar:
        members = tar.getmembers()
    cut = members[-4].offset  # drop the last sample (4 members: emb, label, meta ... header)
    keep = [m for m in members if m.offset < cut]
    with tarfile.open(shards[0]) as tar, tarfile.open(tmp_path / "short.tar", "w") as out:
        for member in keep:
            out.addfile(member, tar.extractfile(member))
    shutil.move(tmp_path / "short.tar", shards[0])
    with pytest.raises(LoaderError, match=rf"{Path(shards[0]).name}: read \d+ samples"):
        drain(eval_batches(shards, spec(), shard_samples=counts))


def test_corrupt_shard_names_the_shard(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    shards, counts = copy_split(tiny_demo, "aef", "val", tmp_path)
    Path(shards[-1]).write_bytes(np.random.default_rng(0).bytes(20_000))
    with pytest.raises(LoaderError, match=Path(shards[-1]).name):
        drain(eval_batches(shards, spec(), shard_samples=counts))


def test_shard_with_other_in_dim_than_manifest_is_refused(tiny_demo: TinyDemo) -> None:
    part = tiny_demo.manifest("tessera")["splits"]["train"]
    with pytest.raises(
        LoaderError, match=r"train-\d{4}\.tar: sample .* in_dim 128, manifest says 64"
    ):
        drain(train_batches(part["shards"], part["samples"], spec("tessera", 64), 0, 1, 0))


def test_resumed_epoch_continues_with_the_same_batches(tiny_demo: TinyDemo) -> None:
    part = tiny_demo.manifest("aef")["splits"]["train"]
    full = list(train_batches(part["shards"], part["samples"], spec(), 0, 1, epoch=3))
    tail = list(train_batches(part["shards"], part["samples"], spec(), 0, 1, 3, start_batch=2))
    assert len(tail) == len(full) - 2
    for a, b in zip(full[2:], tail, strict=True):
        assert torch_equal(a, b)


def torch_equal(a: dict, b: dict) -> bool:
    same = [a[k] == b[k] if isinstance(a[k], list) else bool((a[k] == b[k]).all()) for k in a]
    return a.keys() == b.keys() and all(same)


def write_float_raster(path: Path, data: np.ndarray, transform: Affine, crs: str) -> Path:
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        count=data.shape[0],
        height=data.shape[1],
        width=data.shape[2],
        dtype="float32",
        crs=crs,
        transform=transform,
        nodata=np.nan,
    ) as dst:
        dst.write(data)
    return path


def test_nan_and_inf_embeddings_are_nodata_and_counted(tiny_demo, class_map, tmp_path) -> None:
    src = tiny_demo.rasters["demo_b"]["tessera"]
    with rasterio.open(src) as ds:
        data, transform, crs = ds.read(), ds.transform, ds.crs.to_string()
    data[:, :] = np.nan_to_num(data, nan=1.0)
    data[5, 10, 10], data[7, 20, 30], data[0, 40, 41] = np.nan, np.inf, -np.inf
    emb = write_float_raster(tmp_path / "tess.tif", data, transform, crs)
    out = tmp_path / "labels.tif"
    report = align_labels(emb, tiny_demo.rasters["demo_b"]["cdl"], class_map, out)
    assert report["counts"]["emb_nodata"] == 3
    labels = rasterio.open(out).read(1)
    assert labels[10, 10] == labels[20, 30] == labels[40, 41] == 255


def test_raster_without_a_valid_tile_is_an_error(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    labels = tmp_path / "empty.tif"
    with rasterio.open(tiny_demo.labels[("aef", "demo_a")]) as src:
        profile = src.profile
    with rasterio.open(labels, "w", **profile) as dst:
        dst.write(np.full((1, profile["height"], profile["width"]), 255, np.uint8))
    with pytest.raises(TilingError, match="empty.tif: no tile"):
        build_region(
            "aef",
            "demo_a",
            tiny_demo.rasters["demo_a"]["aef"],
            labels,
            tmp_path / "shards",
            TileSpec(32),
            SplitSpec(320.0),
        )


def test_tile_larger_than_raster_yields_a_padded_tile(tiny_demo, tmp_path) -> None:
    index = build_region(
        "aef", "demo_a", tiny_demo.rasters["demo_a"]["aef"],
        tiny_demo.labels[("aef", "demo_a")], tmp_path, TileSpec(256, min_valid=0.05),
        SplitSpec(2560.0),
    )  # fmt: skip
    assert sum(p["samples"] for p in index["splits"].values()) >= 1


def test_failed_rebuild_leaves_the_previous_shards_untouched(tiny_demo, tmp_path) -> None:
    out = tmp_path / "shards"
    args = (
        "aef",
        "demo_a",
        tiny_demo.rasters["demo_a"]["aef"],
        tiny_demo.labels[("aef", "demo_a")],
    )
    build_region(*args, out, TileSpec(32), SplitSpec(320.0), max_samples=TINY["max_samples"])
    before = {p.name: p.read_bytes() for p in out.glob("*.tar")}
    broken = tmp_path / "broken.tif"
    shutil.copy(args[2], broken)
    with open(broken, "r+b") as fh:  # keep the header, destroy the pixel data
        fh.seek(4096)
        fh.write(b"\0" * (broken.stat().st_size - 4096))
    with pytest.raises(Exception):  # noqa: B017 - whatever GDAL raises on the damaged tiles
        build_region("aef", "demo_a", broken, args[3], out, TileSpec(32), SplitSpec(320.0))
    after = {p.name: p.read_bytes() for p in out.glob("*.tar")}
    assert after == before
    assert not list(out.glob(".staging-*"))


def test_empty_split_stops_the_manifest_with_a_clear_message(tiny_demo, tmp_path) -> None:
    index = json.loads(Path(tiny_demo.manifests["aef"]).read_text())
    region = {
        "source": "aef",
        "region": "demo_a",
        "in_dim": 64,
        "tile_size": 32,
        "dtype": "int8",
        "dropped": {},
        "splits": {},
    }
    for split in ("train", "val", "test"):
        part = index["splits"][split]
        shards = [
            {"path": p, "samples": n, "bytes": 1}
            for p, n in zip(part["shards"], part["shard_samples"], strict=True)
        ]
        region["splits"][split] = {
            **part,
            "shards": [] if split == "test" else shards,
            "samples": 0 if split == "test" else part["samples"],
        }
    path = tmp_path / "index.json"
    path.write_text(json.dumps(region))
    result = subprocess.run(
        [sys.executable, "-m", "emb.prep.manifest", str(path), "--out", str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        env=venv_env(),
    )
    assert result.returncode == 2, result.stderr[-2000:]  # bad input (emb.stage_runner)
    assert "split 'test' of aef has no tiles" in result.stderr
    assert not (tmp_path / "m.json").exists()


def test_stats_with_zero_training_tiles_keep_the_old_stats(tmp_path: Path) -> None:
    out = tmp_path / "stats"
    out.mkdir()
    (out / "stats.json").write_text('{"old": true}')
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"source": "tessera", "splits": {"train": {"shards": []}}}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "emb.prep.channel_stats",
            "--manifest",
            str(manifest),
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=venv_env(),
    )
    assert result.returncode == 2, result.stderr[-2000:]  # bad input (emb.stage_runner)
    assert "manifest.json" in result.stderr and "no training tiles" in result.stderr
    assert (out / "stats.json").read_text() == '{"old": true}'
    assert not (out / "channel_mean.npy").exists()


def test_stats_on_a_corrupt_shard_name_it_and_keep_the_old_stats(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    shards, _ = copy_split(tiny_demo, "tessera", "train", tmp_path / "shards")
    data = Path(shards[0]).read_bytes()
    Path(shards[0]).write_bytes(data[: len(data) // 2 + 700])
    manifest = tmp_path / "manifest.json"
    train = {"shards": shards}  # no shard_keys: every shard is scanned
    manifest.write_text(json.dumps({"source": "tessera", "splits": {"train": train}}))
    out = tmp_path / "stats"
    out.mkdir()
    (out / "stats.json").write_text('{"old": true}')
    result = subprocess.run(
        [sys.executable, "-m", "emb.prep.channel_stats", "--manifest", str(manifest),
         "--out-dir", str(out)],
        capture_output=True, text=True, env=venv_env(),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]  # bad input (emb.stage_runner)
    assert f"{Path(shards[0]).name}: truncated shard" in result.stderr
    assert "Traceback" not in result.stderr
    assert (out / "stats.json").read_text() == '{"old": true}'


def test_shard_sample_counts_pairs_paths_with_counts(tiny_demo: TinyDemo) -> None:
    part = tiny_demo.manifest("aef")["splits"]["train"]
    counts = shard_sample_counts(part)
    assert sum(counts.values()) == part["samples"] and set(counts) == set(part["shards"])


def test_cdl_in_a_crs_without_overlap_is_an_error_naming_both_files(tiny_demo, class_map, tmp_path):
    far = tmp_path / "far_cdl.tif"
    transform = Affine(30, 0, 2_000_000, 0, -30, 500_000)
    with rasterio.open(far, "w", driver="GTiff", count=1, height=32, width=32, dtype="uint8",
                       crs="EPSG:5070", transform=transform) as dst:  # fmt: skip
        dst.write(np.ones((1, 32, 32), np.uint8))
    out = tmp_path / "labels.tif"
    with pytest.raises(AlignmentError, match=r"far_cdl\.tif .*does not overlap .*demo_a"):
        align_labels(tiny_demo.rasters["demo_a"]["aef"], far, class_map, out)
    assert not out.exists()
