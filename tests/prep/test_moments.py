"""Moments stored by the shard build: exact per tile, and merged by the stats stage into the
statistics that reading the tiles gives, and that a two-pass numpy reference gives."""

from __future__ import annotations

import tarfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from conftest import TinyDemo
from shard_reader import iter_samples
from test_channel_stats import bytes_read, float64_values, two_pass_reference

from emb.prep.channel_stats import MissingMomentsWarning, channel_stats
from emb.prep.moments import tile_moments
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec


def test_each_training_tile_stores_the_moments_of_its_valid_pixels(tiny_demo: TinyDemo) -> None:
    splits = tiny_demo.manifest("tessera")["splits"]
    checked = 0
    for split, part in splits.items():
        for sample in iter_samples(part["shards"]):
            if split != "train":
                assert "moments" not in sample  # the statistics read the training split only
                continue
            x, m = float64_values("tessera", sample), sample["moments"]
            assert m.dtype == np.float64 and m.shape == (3, 128)
            assert (m[0] == x.shape[1]).all() and x.shape[1] > 0
            mean = x.mean(axis=1)
            np.testing.assert_allclose(m[1], mean, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(m[2], ((x - mean[:, None]) ** 2).sum(axis=1), rtol=1e-9)
            checked += 1
    assert checked == splits["train"]["samples"]
    aef = tiny_demo.manifest("aef")["splits"]["train"]["shards"]
    assert not any("moments" in s for s in iter_samples(aef))  # AEF's tiles are read instead


def strip_moments(shards: list[str], dest: Path) -> list[str]:
    """Copies of ``shards`` without their moments members (and without sidecars): shards as
    the build wrote them before it stored moments."""
    dest.mkdir()
    out = []
    for n, url in enumerate(shards):
        path = dest / f"{n}-{Path(url).name}"  # regions' shards share names
        with tarfile.open(url) as src, tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as dst:
            for member in src.getmembers():
                if not member.name.endswith(".moments.npy"):
                    dst.addfile(member, src.extractfile(member))
        out.append(str(path))
    return out


def test_stats_from_stored_moments_equal_the_stats_read_from_the_tiles(tiny_demo, tmp_path):
    part = tiny_demo.manifest("tessera")["splits"]["train"]
    stored = channel_stats("tessera", part["shards"], 7, 3, part["shard_keys"])
    old = strip_moments(part["shards"], tmp_path / "old")
    with pytest.warns(MissingMomentsWarning, match="7 sampled tile"):
        read = channel_stats("tessera", old, 7, 3, part["shard_keys"])
    assert stored[2]["stored_moments"] == 7 and read[2]["stored_moments"] == 0
    assert stored[2]["tile_keys"] == read[2]["tile_keys"]
    assert stored[2]["pixels"] == read[2]["pixels"]
    np.testing.assert_allclose(stored[0], read[0], rtol=1e-6, atol=1e-7 * np.abs(read[0]).max())
    np.testing.assert_allclose(stored[1], read[1], rtol=1e-6)


@pytest.mark.parametrize("source", ["tessera", "aef"])
def test_all_training_tiles_equal_a_two_pass_reference(tiny_demo: TinyDemo, source: str) -> None:
    part = tiny_demo.manifest(source)["splits"]["train"]
    mean, std, record = channel_stats(source, part["shards"], "all", 0, part["shard_keys"])
    keys = {k for ks in part["shard_keys"] for k in ks}
    assert record["n_tiles"] == part["samples"] == len(keys) and record["requested"] == "all"
    assert record["stored_moments"] == (part["samples"] if source == "tessera" else 0)
    ref_mean, ref_std = two_pass_reference(source, part["shards"], keys)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6, atol=1e-7 * np.abs(ref_mean).max())
    np.testing.assert_allclose(std, ref_std, rtol=1e-6)


def write_geotiff(path: Path, data: np.ndarray, nodata: float | None) -> Path:
    profile = dict(
        driver="GTiff", count=data.shape[0], height=data.shape[1], width=data.shape[2],
        dtype=data.dtype.name, crs="EPSG:32615", nodata=nodata,
        transform=Affine(10, 0, 400_000, 0, -10, 4_600_000),
    )  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
    return path


def test_a_large_mean_and_a_small_spread_stay_exact_through_the_build(tmp_path: Path) -> None:
    """Every band ~990 (within TESSERA's range check) varying by 0.0005 (so every code is 127
    and the scale carries it):
    unshifted sums of squares lose it all; the stored moments must not."""
    rng = np.random.default_rng(11)
    pixel = (990 + 0.0005 * rng.random((32, 32))).astype(np.float32)
    data = np.repeat(pixel[None], 128, axis=0)
    data[:, 3, :5] = np.nan  # nodata pixels must not count
    emb = write_geotiff(tmp_path / "tessera.tif", data, None)
    labels = np.where(np.isnan(data[0]), 255, 1).astype(np.uint8)[None]
    label_path = write_geotiff(tmp_path / "labels.tif", labels, 255)
    index = build_region(
        "tessera", "big", emb, label_path, tmp_path / "shards", TileSpec(16), SplitSpec(1280.0),
        fixed_split="train",
    )  # fmt: skip
    shards = [s["path"] for s in index["splits"]["train"]["shards"]]
    mean, std, record = channel_stats("tessera", shards, "all", 0)
    assert record["stored_moments"] == record["n_tiles"] == 4 and record["pixels"] == 32 * 32 - 5
    ref_mean, ref_std = two_pass_reference("tessera", shards, set(record["tile_keys"]))
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6)
    np.testing.assert_allclose(std, ref_std, rtol=1e-6)
    x = np.concatenate([float64_values("tessera", s) for s in iter_samples(shards)], axis=1)
    one_pass = np.sqrt(np.maximum((x * x).mean(1) - x.mean(1) ** 2, 0))
    assert np.abs(one_pass / ref_std - 1).max() > 1e-3  # the case is as hard as claimed


def exact_aef_moments(q: np.ndarray) -> tuple[int, list[Fraction], list[Fraction]]:
    """(n, mean, M2) of AEF codes ``q`` (D, N) in rational arithmetic: no rounding at all."""
    values = [[Fraction(int(c) * abs(int(c)) * 4, 65025) for c in row] for row in q]
    n = len(values[0])
    means = [sum(row) / n for row in values]
    return n, means, [sum((v - m) ** 2 for v in row) for row, m in zip(values, means, strict=True)]


def test_aef_tile_moments_are_exact() -> None:
    """Integer sums, then one rounding: equal to rational arithmetic to the last bits."""
    rng = np.random.default_rng(12)
    q = rng.integers(-127, 128, (6, 12, 12)).astype(np.int8)
    q[0, :2, :] = -128  # nodata: band 0 decides, whatever the other bands hold
    q[4], q[4, 5, 5] = 127, 126  # one pixel off: float sums of squares would cancel here
    q[5] = 77  # a constant channel: M2 exactly 0
    n, mean, m2 = tile_moments("aef", {"emb": q})
    valid = q[0] != -128
    exact_n, exact_mean, exact_m2 = exact_aef_moments(q[:, valid])
    assert n == exact_n == 120
    np.testing.assert_allclose(mean, [float(m) for m in exact_mean], rtol=4e-16)
    np.testing.assert_allclose(m2, [float(m) for m in exact_m2], rtol=4e-16)
    assert m2[5] == 0.0


def test_the_stats_read_only_the_moments_when_they_are_stored(tiny_demo: TinyDemo) -> None:
    """Every training tile, for less than 5% of their bytes (moments and sidecars)."""
    part = tiny_demo.manifest("tessera")["splits"]["train"]
    tile_bytes = sum(a.nbytes for s in iter_samples(part["shards"]) for a in (s["emb"], s["scale"]))
    before = bytes_read()
    record = channel_stats("tessera", part["shards"], "all", 0)[2]
    assert record["stored_moments"] == part["samples"]
    assert bytes_read() - before < 0.05 * tile_bytes
