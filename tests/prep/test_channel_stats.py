"""Channel statistics: exact against a numpy two-pass float64 reference, and reproducible."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TinyDemo, venv_env
from shard_reader import iter_samples

from emb.loading.dequantize import StatsError
from emb.loading.shard_index import ShardError
from emb.prep.channel_stats import channel_stats, tile_moments
from emb.prep.shards import encode_npy, write_shards
from emb.rasters import valid_pixels


def float64_values(source: str, sample: dict) -> np.ndarray:
    """(D, N) float64 de-quantized values of a sample's valid pixels, straight from the codes."""
    q = sample["emb"].astype(np.float64)
    if source == "aef":
        x = np.sign(q) * (q / 127.5) ** 2
    else:
        scale = sample["scale"].astype(np.float64)
        x = q * (scale if scale.ndim == 3 else scale[None])
    return x[:, valid_pixels(source, sample)]


def two_pass_reference(source: str, shards: list[str], keys: set[str]):
    """Mean and std of the valid pixels of the tiles ``keys``: numpy, float64, two passes."""
    x = np.concatenate(
        [float64_values(source, s) for s in iter_samples(shards) if s["__key__"] in keys], axis=1
    )
    mean = x.mean(axis=1)
    return mean, np.sqrt(((x - mean[:, None]) ** 2).mean(axis=1))


@pytest.mark.parametrize("source", ["tessera", "aef"])
def test_stats_equal_the_two_pass_reference(tiny_demo: TinyDemo, source: str) -> None:
    shards = tiny_demo.manifest(source)["splits"]["train"]["shards"]
    mean, std, record = channel_stats(source, shards, n_tiles=7, seed=3)
    ref_mean, ref_std = two_pass_reference(source, shards, set(record["tile_keys"]))
    assert record["n_tiles"] == 7 and len(record["tile_keys"]) == 7
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6, atol=1e-7 * np.abs(ref_mean).max())
    np.testing.assert_allclose(std, ref_std, rtol=1e-6)


def write_tessera_shard(path: Path, tiles: list[tuple[np.ndarray, np.ndarray]]) -> list[str]:
    samples = (
        {"__key__": f"r_{i}_0", "emb.npy": encode_npy(q), "scale.npy": encode_npy(scale)}
        for i, (q, scale) in enumerate(tiles)
    )
    return [s["path"] for s in write_shards(samples, str(path / "train-%04d.tar"), 100, 1 << 30)]


def test_stats_stay_exact_for_a_large_mean_and_a_small_spread(tmp_path: Path) -> None:
    """Values near 1.3e5 that vary by about one: a one-pass sum of squares loses it all."""
    rng = np.random.default_rng(0)
    tiles = []
    for _ in range(3):
        q = np.full((4, 16, 16), 127, np.int8)
        q[1] = rng.integers(120, 128, (16, 16))
        scale = (1000 + rng.random((16, 16)) * 0.01).astype(np.float32)
        scale[0, :3] = 0  # nodata pixels must not count
        tiles.append((q, scale))
    shards = write_tessera_shard(tmp_path, tiles)
    mean, std, record = channel_stats("tessera", shards, n_tiles=500, seed=0)
    ref_mean, ref_std = two_pass_reference("tessera", shards, set(record["tile_keys"]))
    assert record["n_tiles"] == 3 and record["pixels"] == 3 * (256 - 3)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6)
    np.testing.assert_allclose(std, ref_std, rtol=1e-6)


def test_per_channel_scales_are_supported(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, (3, 8, 8)).astype(np.int8)
    scale = rng.random((3, 8, 8)).astype(np.float32) + 0.1
    shards = write_tessera_shard(tmp_path, [(q, scale)])
    mean, std, _ = channel_stats("tessera", shards, n_tiles=1, seed=0)
    x = q.astype(np.float64) * scale
    np.testing.assert_allclose(mean, x.reshape(3, -1).mean(1), rtol=1e-6)
    np.testing.assert_allclose(std, x.reshape(3, -1).std(1), rtol=1e-6)


def ordinary_tile(rng: np.random.Generator, size: int = 64) -> dict[str, np.ndarray]:
    q = rng.integers(-127, 128, (5, size, size)).astype(np.int8)
    scale = (rng.random((size, size)) * 0.02 + 0.001).astype(np.float32)
    scale[:7, :9] = 0  # nodata pixels
    return {"emb": q, "scale": scale}


def test_ordinary_tiles_take_the_matrix_vector_sums_and_agree_with_shifted_ones() -> None:
    """The fast path must be taken for ordinary tiles (else it is dead code) and agree."""
    rng = np.random.default_rng(4)
    for _ in range(3):
        tile = ordinary_tile(rng)
        fast = tile_moments("tessera", tile)
        shifted = tile_moments("tessera", {**tile, "scale": tile["scale"][None].repeat(5, 0)})
        x = float64_values("tessera", tile)
        assert fast[0] == shifted[0] == x.shape[1]
        np.testing.assert_allclose(fast[1], x.mean(axis=1), rtol=1e-12)
        np.testing.assert_allclose(fast[2], ((x - x.mean(1, keepdims=True)) ** 2).sum(1), rtol=1e-9)
        np.testing.assert_allclose(fast[2], shifted[2], rtol=1e-9)


def test_stats_do_not_depend_on_the_thread_count(tiny_demo: TinyDemo) -> None:
    shards = tiny_demo.manifest("tessera")["splits"]["train"]["shards"]
    one = channel_stats("tessera", shards, n_tiles=9, seed=2, threads=1)
    three = channel_stats("tessera", shards, n_tiles=9, seed=2, threads=3)
    assert one[0].tobytes() == three[0].tobytes() and one[1].tobytes() == three[1].tobytes()
    assert one[2] == three[2]


def bytes_read() -> int:
    """Bytes this process has read through read(2) and friends, page cache included."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["rchar"])


def test_only_the_sampled_tiles_are_read(tmp_path: Path) -> None:
    """2 of 6 tiles sampled: about 2 tiles' bytes read; spoiling a tile outside the sample
    changes nothing, spoiling one inside it does."""
    rng = np.random.default_rng(7)
    tiles = [(t["emb"], t["scale"]) for t in (ordinary_tile(rng, 128) for _ in range(6))]
    shards = write_tessera_shard(tmp_path, tiles)
    before = bytes_read()
    mean, _, record = channel_stats("tessera", shards, n_tiles=2, seed=1)
    tile_bytes = tiles[0][0].nbytes + tiles[0][1].nbytes
    assert 2 * tile_bytes <= bytes_read() - before < 3 * tile_bytes
    data = Path(shards[0]).read_bytes()
    outside = next(i for i in range(6) if f"r_{i}_0" not in record["tile_keys"])
    inside = int(sorted(record["tile_keys"])[0].split("_")[1])
    for i, expect_same in ((outside, True), (inside, False)):
        spoiled = bytearray(data)
        at = spoiled.find(tiles[i][0].tobytes())  # the tile's codes, not its headers
        assert at > 0
        spoiled[at : at + 64] = bytes(range(64))
        Path(shards[0]).write_bytes(spoiled)
        again = channel_stats("tessera", shards, n_tiles=2, seed=1)
        assert (again[0].tobytes() == mean.tobytes()) is expect_same


def test_a_sampled_key_missing_from_its_shard_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    tiles = [(t["emb"], t["scale"]) for t in (ordinary_tile(rng, 16) for _ in range(2))]
    shards = write_tessera_shard(tmp_path, tiles)
    with pytest.raises(StatsError, match=r"train-0000\.tar: the manifest lists .*r_9_0"):
        channel_stats("tessera", shards, n_tiles=5, seed=0, shard_keys=[["r_0_0", "r_9_0"]])


def test_a_tile_with_other_channels_is_named(tmp_path: Path) -> None:
    """Raised in the reader thread, the error reaches the caller and names the sample."""
    rng = np.random.default_rng(9)
    tiles = [(t["emb"], t["scale"]) for t in (ordinary_tile(rng, 16) for _ in range(3))]
    tiles[2] = (tiles[2][0][:4], tiles[2][1])
    shards = write_tessera_shard(tmp_path, tiles)
    with pytest.raises(ShardError, match=r"train-0000\.tar: sample r_2_0: emb.npy has in_dim 4"):
        channel_stats("tessera", shards, n_tiles=3, seed=0)


def test_a_scale_that_does_not_fit_its_tile_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    tiles = [(t["emb"], t["scale"]) for t in (ordinary_tile(rng, 16) for _ in range(2))]
    tiles[1] = (tiles[1][0], tiles[1][1][:8])
    shards = write_tessera_shard(tmp_path, tiles)
    with pytest.raises(ShardError, match=r"sample r_1_0: scale.npy is \[8, 16\], emb.npy"):
        channel_stats("tessera", shards, n_tiles=2, seed=0)


def run_stats(manifest: Path, out: Path, seed: int, n_tiles: int) -> dict:
    subprocess.run(
        [sys.executable, "-m", "emb.prep.channel_stats", "--manifest", str(manifest),
         "--out-dir", str(out), "--seed", str(seed), "--n-tiles", str(n_tiles)],
        check=True, capture_output=True, env=venv_env(),
    )  # fmt: skip
    return json.loads((out / "stats.json").read_text())


def test_stats_json_records_the_seeded_sample(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    manifest = tiny_demo.manifests["tessera"]
    train = tiny_demo.manifest("tessera")["splits"]["train"]
    a = run_stats(manifest, tmp_path / "a", seed=5, n_tiles=6)
    b = run_stats(manifest, tmp_path / "b", seed=5, n_tiles=6)
    c = run_stats(manifest, tmp_path / "c", seed=6, n_tiles=6)
    everything = run_stats(manifest, tmp_path / "d", seed=5, n_tiles=10_000)
    assert a["n_tiles"] == 6 and a["seed"] == 5 and a["tile_keys"] == b["tile_keys"]
    assert c["tile_keys"] != a["tile_keys"]
    assert set(a["tile_keys"]) <= {k for ks in train["shard_keys"] for k in ks}
    assert everything["n_tiles"] == train["samples"] == len(everything["tile_keys"])
    mean = np.load(tmp_path / "a" / "channel_mean.npy")
    assert mean.dtype == np.float32 and mean.shape == (128,)


@pytest.mark.parametrize("sidecar", [True, False], ids=["sidecar", "scanned"])
def test_a_header_claiming_a_huge_shape_is_refused_before_anything_is_allocated(
    tmp_path: Path, sidecar: bool
) -> None:
    """A zero dimension makes any other claim cost 0 bytes in the shard: (2**40, 0, 16) once
    reached the statistics as a TiB-sized buffer (ArrayMemoryError) instead of a message."""
    rng = np.random.default_rng(11)
    tiles = [(t["emb"], t["scale"]) for t in (ordinary_tile(rng, 16) for _ in range(2))]
    claim = {"descr": "|i1", "fortran_order": False, "shape": (2**40, 0, 16)}
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, claim)
    samples = [{"__key__": f"r_{i}_0", "emb.npy": encode_npy(q), "scale.npy": encode_npy(scale)}
               for i, (q, scale) in enumerate(tiles)]  # fmt: skip
    samples[0]["emb.npy"] = (header.getvalue(), memoryview(b""))  # the claim, no data
    shards = [s["path"] for s in write_shards(iter(samples), str(tmp_path / "train-%04d.tar"),
                                               100, 1 << 30)]  # fmt: skip
    if not sidecar:
        Path(f"{shards[0]}.idx.json").unlink()
    with pytest.raises(ShardError, match=r"train-0000\.tar.*r_0_0\.emb\.npy.*claims shape "
                       r"\[1099511627776, 0, 16\], expected 1 or more"):  # fmt: skip
        channel_stats("tessera", shards, n_tiles=2, seed=0)


def test_tiles_are_bounded_by_the_manifests_in_dim_before_their_sums_are_sized(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(12)
    tiles = [(t["emb"], t["scale"]) for t in (ordinary_tile(rng, 16) for _ in range(2))]
    shards = write_tessera_shard(tmp_path, tiles)
    with pytest.raises(
        ShardError, match=r"sample r_0_0: emb.npy has in_dim 5, the manifest says 128"
    ):
        channel_stats("tessera", shards, n_tiles=2, seed=0, in_dim=128)
