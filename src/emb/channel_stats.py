"""Stage: per-channel mean and std of a seeded random sample of training tiles.

Only valid pixels count. Tiles are merged with Chan's parallel update in float64, which
stays exact where a sum-of-squares formula cancels (large means, small spreads).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from emb.data import iter_samples
from emb.io import atomic_path, write_json
from emb.rasters import to_float, valid_pixels


class StatsError(ValueError):
    """Statistics that cannot be computed from the given shards."""


class RunningMoments:
    """Per-channel count, mean and M2 (sum of squared deviations), float64."""

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.mean = np.zeros(dim, np.float64)
        self.m2 = np.zeros(dim, np.float64)

    def update(self, values: np.ndarray) -> None:
        """Add (D, N) values."""
        n_b = values.shape[1]
        if n_b == 0:
            return
        v = values.astype(np.float64)
        mean_b = v.mean(axis=1)
        m2_b = ((v - mean_b[:, None]) ** 2).sum(axis=1)
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta**2 * (self.n * n_b / n)
        self.n = n

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.n, 1))


def channel_stats(
    source: str,
    shards: list[str],
    n_tiles: int,
    seed: int,
    shard_keys: list[list[str]] | None = None,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(D,) float32 mean and std over the sampled tiles, and a record of what was sampled.

    With ``shard_keys`` (the manifest's sample keys per shard) only the shards holding a
    sampled tile are read, once; without, a first pass lists the keys.
    """
    if shard_keys is None:
        shard_keys = [[s["__key__"] for s in iter_samples([shard])] for shard in shards]
    keys = [k for per_shard in shard_keys for k in per_shard]
    if not keys:
        raise StatsError(f"no training tiles in {len(shards)} shard(s): cannot compute statistics")
    rng = np.random.default_rng(seed)
    chosen = set(rng.choice(keys, size=min(n_tiles, len(keys)), replace=False).tolist())
    needed = [shard for shard, ks in zip(shards, shard_keys, strict=True) if chosen & set(ks)]
    moments: RunningMoments | None = None
    for sample in iter_samples(needed):
        if sample["__key__"] not in chosen:
            continue
        x = to_float(source, sample)
        moments = moments or RunningMoments(x.shape[0])
        moments.update(x[:, valid_pixels(source, sample)])
    assert moments is not None
    record = {
        "source": source,
        "n_tiles": len(chosen),
        "seed": seed,
        "pixels": moments.n,
        "tile_keys": sorted(chosen),
    }
    std = np.where(moments.std > 0, moments.std, 1.0)
    return moments.mean.astype(np.float32), std.astype(np.float32), record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--n-tiles", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    manifest = json.loads(args.manifest.read_text())
    shards = manifest["splits"]["train"]["shards"]
    try:
        keys = manifest["splits"]["train"].get("shard_keys")
        mean, std, record = channel_stats(manifest["source"], shards, args.n_tiles, args.seed, keys)
    except StatsError as err:
        raise SystemExit(f"error: {args.manifest}: {err}") from err
    for name, array in (("channel_mean.npy", mean), ("channel_std.npy", std)):
        with atomic_path(args.out_dir / name) as tmp, open(tmp, "wb") as fh:
            np.save(fh, array)
    write_json(args.out_dir / "stats.json", record)
    print(f"{manifest['source']}: {record['n_tiles']} tiles, {record['pixels']} pixels")


if __name__ == "__main__":
    main()
