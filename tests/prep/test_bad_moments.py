"""Bad moments, empty tiles and bad tile requests: a clear error naming shard and sample (or a
documented fallback), and the previous statistics untouched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import yaml
from conftest import REPO, TinyDemo, venv_env
from test_channel_stats import ordinary_tile, two_pass_reference

from emb.loading.dequantize import StatsError
from emb.loading.shard_index import ShardError
from emb.loading.sidecar import sidecar_path
from emb.prep.channel_stats import channel_stats
from emb.prep.moments import moments_array, tile_moments
from emb.prep.shards import encode_npy, write_shards


def write_shard(path: Path, tiles: list[dict], moments: dict[int, np.ndarray] | None = None):
    """A real shard whose samples carry the moments the build would store (``moments``
    replaces some of them)."""
    samples = []
    for i, tile in enumerate(tiles):
        stored = (moments or {}).get(i, moments_array(*tile_moments("tessera", tile)))
        samples.append({
            "__key__": f"r_{i}_0", "emb.npy": encode_npy(tile["emb"]),
            "scale.npy": encode_npy(tile["scale"]), "moments.npy": encode_npy(stored),
        })  # fmt: skip
    return [
        s["path"] for s in write_shards(iter(samples), str(path / "train-%04d.tar"), 9, 1 << 30)
    ]


def good_moments(tile: dict) -> np.ndarray:
    return moments_array(*tile_moments("tessera", tile))


def spoiled(tile: dict, how: str) -> np.ndarray:
    m = good_moments(tile)
    if how == "count_over_tile":
        m[0] = 64 * 64 + 1
    elif how == "counts_differ":
        m[0, 2] -= 1
    elif how == "negative_m2":
        m[2, 1] = -1.0
    elif how == "nan_mean":
        m[1, 3] = np.nan
    elif how == "float32":
        m = m.astype(np.float32)
    elif how == "other_channels":
        m = m[:, :4]
    return m


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("count_over_tile", r"pixel counts \[4097\. .*expected one whole number in 0\.\.4096"),
        ("counts_differ", r"pixel counts .*expected one whole number"),
        ("negative_m2", r"M2 \[.*-1\.0+e\+00 .*expected finite, M2 >= 0"),
        ("nan_mean", r"means \[.*nan.*expected finite"),
        ("float32", r"moments\.npy is float32\[3, 5\], expected float64\[3, 5\]"),
        ("other_channels", r"moments\.npy is float64\[3, 4\], expected float64\[3, 5\]"),
    ],
)
def test_moments_that_cannot_be_their_tiles_are_named(tmp_path: Path, how: str, message: str):
    rng = np.random.default_rng(20)
    tiles = [ordinary_tile(rng) for _ in range(3)]
    shards = write_shard(tmp_path, tiles, {1: spoiled(tiles[1], how)})
    with pytest.raises(ShardError, match=rf"train-0000\.tar: sample r_1_0: .*{message}"):
        channel_stats("tessera", shards, "all", 0)


def test_a_tile_with_other_channels_than_the_first_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(27)
    tiles = [ordinary_tile(rng) for _ in range(2)]
    tiles[1]["emb"] = tiles[1]["emb"][:4]  # its stored moments are (3, 4): consistent in itself
    shards = write_shard(tmp_path, tiles)
    with pytest.raises(ShardError, match=r"sample r_1_0: emb\.npy has in_dim 4, expected 5"):
        channel_stats("tessera", shards, "all", 0)


def test_a_tile_without_valid_pixels_counts_nothing(tmp_path: Path) -> None:
    """Documented fallback: its moments are all zero and it adds no pixel."""
    rng = np.random.default_rng(21)
    tiles = [ordinary_tile(rng) for _ in range(3)]
    tiles[1]["scale"][:] = 0  # every pixel nodata
    assert not good_moments(tiles[1]).any()
    shards = write_shard(tmp_path, tiles)
    mean, std, record = channel_stats("tessera", shards, "all", 0)
    assert record["n_tiles"] == 3 and record["pixels"] == 2 * (64 * 64 - 7 * 9)
    ref_mean, ref_std = two_pass_reference("tessera", shards, {"r_0_0", "r_2_0"})
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(std, ref_std, rtol=1e-6)


def test_empty_moments_claiming_values_are_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(22)
    tiles = [ordinary_tile(rng) for _ in range(2)]
    bad = good_moments(tiles[0])
    bad[0] = 0  # no pixel, yet means and M2
    shards = write_shard(tmp_path, tiles, {0: bad})
    with pytest.raises(ShardError, match=r"sample r_0_0: moments\.npy: no valid pixel but"):
        channel_stats("tessera", shards, "all", 0)


def run_stats(tmp_path: Path, shards: list[str], *args: str) -> subprocess.CompletedProcess:
    """The stats stage on a manifest of ``shards``, over a folder holding earlier stats."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"source": "tessera", "splits": {"train": {"shards": shards}}}))
    out = tmp_path / "stats"
    out.mkdir(exist_ok=True)
    (out / "stats.json").write_text('{"old": true}')
    return subprocess.run(
        [sys.executable, "-m", "emb.prep.channel_stats", "--manifest", str(manifest),
         "--out-dir", str(out), *args],
        capture_output=True, text=True, env=venv_env(),
    )  # fmt: skip


def test_tiles_without_any_valid_pixel_are_an_error_and_keep_the_old_stats(tmp_path):
    tile = ordinary_tile(np.random.default_rng(23))
    tile["scale"][:] = 0
    result = run_stats(tmp_path, write_shard(tmp_path, [tile, tile]), "--n-tiles", "all")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the 2 sampled tiles have no valid pixel (first" in result.stderr
    assert (tmp_path / "stats" / "stats.json").read_text() == '{"old": true}'
    assert not (tmp_path / "stats" / "channel_mean.npy").exists()


def test_corrupt_moments_stop_the_stage_and_keep_the_old_stats(tmp_path: Path) -> None:
    rng = np.random.default_rng(24)
    tiles = [ordinary_tile(rng) for _ in range(2)]
    shards = write_shard(tmp_path, tiles, {1: spoiled(tiles[1], "negative_m2")})
    result = run_stats(tmp_path, shards)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "train-0000.tar: sample r_1_0: moments.npy: means" in result.stderr
    assert (tmp_path / "stats" / "stats.json").read_text() == '{"old": true}'


def test_a_truncated_shard_beside_its_sidecar_names_both_and_keeps_the_old_stats(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    url = tiny_demo.manifest("tessera")["splits"]["train"]["shards"][0]
    copy = tmp_path / "train-0000.tar"
    shutil.copy(url, copy)
    shutil.copy(sidecar_path(url), sidecar_path(copy))
    copy.write_bytes(copy.read_bytes()[:-4096])
    result = run_stats(tmp_path, [str(copy)], "--n-tiles", "all")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "train-0000.tar.idx.json indexes" in result.stderr
    assert f"{copy} has {copy.stat().st_size}: the two disagree" in result.stderr
    assert (tmp_path / "stats" / "stats.json").read_text() == '{"old": true}'


def test_more_tiles_requested_than_exist_uses_every_tile_and_says_so(tmp_path: Path) -> None:
    """Documented fallback: all training tiles, a warning, and the request on record."""
    rng = np.random.default_rng(25)
    result = run_stats(tmp_path, write_shard(tmp_path, [ordinary_tile(rng) for _ in range(3)]),
                       "--n-tiles", "10000")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "WARNING emb.prep.channel_stats: 10000 tiles requested, the train split has 3: all" in (
        result.stderr
    )
    record = json.loads((tmp_path / "stats" / "stats.json").read_text())
    assert record["n_tiles"] == 3 and record["requested"] == 10000
    assert record["stored_moments"] == 3


def test_n_tiles_takes_all_or_a_positive_number(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    base = {"regions": "r.tsv", "runs": ["a"]}
    for good in ("all", 1, 500):
        jsonschema.validate({**base, "stats": {"n_tiles": good}}, schema)
    for bad in ("most", 0, "500"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**base, "stats": {"n_tiles": bad}}, schema)
    shards = tiny_demo.manifest("tessera")["splits"]["train"]["shards"]
    assert run_stats(tmp_path, shards, "--n-tiles", "all").returncode == 0
    record = json.loads((tmp_path / "stats" / "stats.json").read_text())
    assert record["requested"] == "all"
    assert record["n_tiles"] == tiny_demo.manifest("tessera")["splits"]["train"]["samples"]
    refused = run_stats(tmp_path, shards, "--n-tiles", "most")
    assert refused.returncode == 2 and "expected a positive number or 'all'" in refused.stderr


def test_no_valid_pixel_in_the_sample_is_a_stats_error(tmp_path: Path) -> None:
    tile = ordinary_tile(np.random.default_rng(26))
    tile["scale"][:] = 0
    with pytest.raises(StatsError, match="no valid pixel"):
        channel_stats("tessera", write_shard(tmp_path, [tile]), 1, 0)
