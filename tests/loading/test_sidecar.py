"""Index sidecars: the loader and the statistics take offsets from them, never from the tar's
headers; a shard without one is scanned (warned); one that disagrees with its tar is refused
naming both files."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from conftest import TINY, TinyDemo

from emb.loading.batches import LoaderError, LoaderSpec, eval_batches, train_batches
from emb.loading.shard_index import ShardError, scan_shard
from emb.loading.shard_manifest import shard_sample_counts
from emb.loading.sidecar import MissingSidecarWarning, read_sidecar, sidecar_path
from emb.prep.channel_stats import channel_stats
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec

SPEC = LoaderSpec("tessera", 128, batch_size=4, num_workers=2, shuffle_buffer=8, seed=3)


@pytest.mark.parametrize("source", ["aef", "tessera"])
def test_sidecars_give_the_samples_a_header_scan_finds(tiny_demo: TinyDemo, source: str) -> None:
    for part in tiny_demo.manifest(source)["splits"].values():
        for url in part["shards"]:
            assert read_sidecar(url, Path(url).stat().st_size) == scan_shard(url)


def copy_shards(part: dict, dest: Path, sidecars: bool = True) -> tuple[list[str], dict]:
    """Copies of a split's shards (each under its own name), with or without their sidecars."""
    dest.mkdir(parents=True)
    paths = []
    for n, url in enumerate(part["shards"]):
        path = dest / f"{n}-{Path(url).name}"
        shutil.copy(url, path)
        if sidecars:
            shutil.copy(sidecar_path(url), sidecar_path(path))
        paths.append(str(path))
    return paths, dict(zip(paths, part["shard_samples"], strict=True))


def scramble_headers(url: str) -> None:
    """Overwrite every tar header block of ``url`` (sizes unchanged): only a reader that takes
    the offsets from the sidecar can still read it."""
    members = json.loads(Path(sidecar_path(url)).read_text())["members"]
    with open(url, "r+b") as fh:
        for _, offset, *_ in members:
            fh.seek(offset - tarfile.BLOCKSIZE)
            fh.write(b"\xff" * tarfile.BLOCKSIZE)


def same_batches(a: list[dict], b: list[dict]) -> bool:
    """Same keys, same tensors bit for bit, batch by batch."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        for name, u in x.items():
            if not (torch.equal(u, y[name]) if isinstance(u, torch.Tensor) else u == y[name]):
                return False
    return True


def test_loader_and_stats_read_no_tar_header_when_sidecars_exist(tiny_demo, tmp_path) -> None:
    part = tiny_demo.manifest("tessera")["splits"]["train"]
    copies, counts = copy_shards(part, tmp_path / "copies")
    for url in copies:
        scramble_headers(url)
    with pytest.raises(ShardError):
        scan_shard(copies[0])

    def epoch(shards: list[str], shard_samples: dict) -> list[dict]:
        batches = train_batches(shards, part["samples"], SPEC, 0, 1, 2, shard_samples=shard_samples)
        return list(batches)

    assert same_batches(epoch(copies, counts), epoch(part["shards"], shard_sample_counts(part)))
    ours = channel_stats("tessera", copies, "all", 0)
    theirs = channel_stats("tessera", part["shards"], "all", 0)
    assert ours[0].tobytes() == theirs[0].tobytes() and ours[1].tobytes() == theirs[1].tobytes()


def test_a_shard_without_sidecar_is_scanned_with_a_warning(tiny_demo, tmp_path) -> None:
    part = tiny_demo.manifest("tessera")["splits"]["val"]
    copies, counts = copy_shards(part, tmp_path / "bare", sidecars=False)
    with pytest.warns(MissingSidecarWarning, match=r"no index sidecar .*\.tar\.idx\.json"):
        scanned = list(eval_batches(copies, SPEC, shard_samples=counts))
    indexed = list(eval_batches(part["shards"], SPEC, shard_samples=shard_sample_counts(part)))
    assert same_batches(scanned, indexed) and scanned


def truncate(url: str) -> None:
    data = Path(url).read_bytes()
    Path(url).write_bytes(data[:-2048])


def append(url: str) -> None:
    with open(url, "ab") as fh:
        fh.write(b"\0" * 512)


def drop_last_sample(url: str) -> None:
    """The sidecar (consistent in itself) lists one sample fewer than the tar holds."""
    index = json.loads(Path(sidecar_path(url)).read_text())
    last = index["members"][-1][0].partition(".")[0]
    index["members"] = [m for m in index["members"] if not m[0].startswith(f"{last}.")]
    index["samples"] -= 1
    Path(sidecar_path(url)).write_text(json.dumps(index))


def edit_sidecar(change):
    def edit(url: str) -> None:
        index = json.loads(Path(sidecar_path(url)).read_text())
        change(index)
        Path(sidecar_path(url)).write_text(json.dumps(index))

    return edit


def member_outside(index: dict) -> None:
    index["members"][3][1] = index["tar_bytes"] + 512


def sizes_do_not_add_up(index: dict) -> None:
    index["members"][0][4][0] += 1  # emb.npy's shape: one more channel than its bytes hold


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (truncate, r"\.tar\.idx\.json indexes \d+ bytes, .*\.tar has \d+: the two disagree"),
        (append, r"\.tar\.idx\.json indexes \d+ bytes, .*\.tar has \d+: the two disagree"),
        (
            drop_last_sample,
            r"\.tar: read 5 samples from its index .*\.tar\.idx\.json, the manifest",
        ),
        (lambda url: Path(sidecar_path(url)).write_text("{"), r"idx\.json \(index of .*\.tar\)"),
        (edit_sidecar(member_outside), r"idx\.json \(index of .*\.tar\): member .* is not where"),
        (edit_sidecar(sizes_do_not_add_up), r"\(index of .*\.tar\): member .*emb\.npy: .* != size"),
        (edit_sidecar(lambda i: i.update(samples=7)), r"says 7 samples, its members make 6"),
    ],
)
def test_a_sidecar_that_disagrees_with_its_tar_is_refused_naming_both(
    tiny_demo: TinyDemo, tmp_path: Path, spoil, message: str
) -> None:
    part = tiny_demo.manifest("aef")["splits"]["train"]
    copies, counts = copy_shards(part, tmp_path / "copies")
    assert counts[copies[0]] == TINY["max_samples"] == 6
    spoil(copies[0])
    with pytest.raises(LoaderError, match=message):
        list(
            eval_batches(
                copies, LoaderSpec("aef", 64, 4, 0, shuffle_buffer=0, seed=0), shard_samples=counts
            )
        )


def test_a_rebuild_publishes_every_sidecar_with_its_tar_and_drops_stale_ones(tiny_demo, tmp_path):
    files = tiny_demo.rasters["demo_a"]
    labels = tiny_demo.labels[("aef", "demo_a")]
    out = tmp_path / "shards"
    for max_samples in (2, 100):  # many shards, then few: the surplus must go, sidecars too
        build_region("aef", "demo_a", files["aef"], labels, out, TileSpec(32), SplitSpec(320.0),
                     max_samples=max_samples)  # fmt: skip
        tars = sorted(out.glob("*.tar"))
        assert sorted(out.glob("*.idx.json")) == sorted(Path(sidecar_path(t)) for t in tars)
        for tar in tars:
            assert read_sidecar(str(tar), tar.stat().st_size) == scan_shard(str(tar))
    assert len(tars) == 3 and not list(out.glob(".staging-*"))


def test_shards_stay_plain_tars_that_webdataset_reads(tiny_demo: TinyDemo) -> None:
    shards = tiny_demo.manifest("tessera")["splits"]["train"]["shards"]
    samples = list(wds.WebDataset(shards, shardshuffle=False))
    assert len(samples) == tiny_demo.manifest("tessera")["splits"]["train"]["samples"]
    for sample in samples:
        assert {"emb.npy", "scale.npy", "label.npy", "moments.npy", "meta.json"} <= set(sample)
        moments = np.load(io.BytesIO(sample["moments.npy"]))
        assert moments.shape == (3, 128) and moments.dtype == np.float64
    with tarfile.open(shards[0]) as tar:
        assert not any(m.name.endswith(".idx.json") for m in tar.getmembers())
