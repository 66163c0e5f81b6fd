"""Stage: per-channel mean and std of a seeded random sample of training tiles.

Only valid pixels count. Each tile's moments are summed in float64 (shifted by a mean where
plain sums would cancel, see ``tile_moments``), and tiles are merged with Chan's parallel
update: exact for large means and small spreads too.
"""

from __future__ import annotations

import argparse
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from emb.io import atomic_path, write_json
from emb.loading.batch_reader import BatchReader, round_robin
from emb.loading.shard_index import SampleAt, ShardError, scan_shard_cached
from emb.prep.manifest import ManifestError, read_manifest
from emb.rasters import valid_pixels

T = TypeVar("T")
R = TypeVar("R")


class StatsError(ValueError):
    """Statistics that cannot be computed from the given shards."""


class RunningMoments:
    """Per-channel count, mean and M2 (sum of squared deviations), float64."""

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.mean = np.zeros(dim, np.float64)
        self.m2 = np.zeros(dim, np.float64)

    def update(self, values: np.ndarray) -> None:
        """Add (D, N) values (two-pass within the batch)."""
        if values.shape[1] == 0:
            return
        v = values.astype(np.float64)
        mean_b = v.mean(axis=1)
        self.merge(v.shape[1], mean_b, ((v - mean_b[:, None]) ** 2).sum(axis=1))

    def merge(self, n_b: int, mean_b: np.ndarray, m2_b: np.ndarray) -> None:
        """Add a part summarized by its count, mean and M2 (Chan et al.'s parallel update)."""
        if n_b == 0:
            return
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta**2 * (self.n * n_b / n)
        self.n = n

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.n, 1))


# A tile's unshifted float64 sums are kept only where (sum of squares) / M2 <= this, i.e.
# mean**2 / var < 1e4: their relative error (at most pixels * 2**-53, 7e-12 for a 256-px
# tile) then grows to at most 1.5e-7 in M2. A channel nearly constant within the tile (the
# large-mean test) takes the shifted path instead.
MAX_CANCELLATION = 1e4


def tile_moments(source: str, sample: dict[str, np.ndarray]) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, mean, M2) per channel of one shard sample's valid pixels, in float64.

    TESSERA tiles with a per-pixel scale take two matrix-vector products (``Q @ s`` and
    ``(Q * Q) @ s**2``; pixels without data have scale 0 and drop out by themselves), cheaper
    than shifted sums; the rest, and tiles whose sums would cancel, are shifted.
    """
    scale = sample.get("scale")
    if source != "aef" and scale is not None and scale.ndim == 2:
        fast = _matvec_moments(sample["emb"], scale)
        if fast is not None:
            return fast
    return _shifted_moments(source, sample)


def _matvec_moments(
    emb: np.ndarray, scale: np.ndarray, chunk: int = 2048
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """Unshifted float64 sums of ``emb * scale`` and its square, or None where they cancel.

    Products of int8 codes and float32 scales are exact in float64. Pixels are converted
    ``chunk`` at a time into a float64 buffer small enough to stay in cache.
    """
    q = torch.from_numpy(emb).reshape(emb.shape[0], -1)
    s = torch.from_numpy(scale).reshape(-1).double()
    n = int((s > 0).sum())
    dim, pixels = q.shape
    if n == 0:
        return 0, np.zeros(dim), np.zeros(dim)
    w = s * s
    buf = torch.empty(dim, min(chunk, pixels), dtype=torch.float64)
    s1, s2 = torch.zeros(dim, dtype=torch.float64), torch.zeros(dim, dtype=torch.float64)
    for start in range(0, pixels, chunk):
        x = buf[:, : min(chunk, pixels - start)]
        x.copy_(q[:, start : start + chunk])
        s1.addmv_(x, s[start : start + chunk])
        s2.addmv_(x.square_(), w[start : start + chunk])
    mean = s1 / n
    m2 = s2 - s1 * mean
    if not bool((m2 * MAX_CANCELLATION >= s2).all()):
        return None
    return n, mean.numpy(), m2.numpy()


def _shifted_moments(
    source: str, sample: dict[str, np.ndarray], chunk: int = 2048
) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, mean, M2) from sums shifted by the first chunk's mean, so squares do not cancel.

    Pixels are de-quantized ``chunk`` at a time into a float64 buffer that stays in cache,
    then summed in place with torch, whose int8 -> float64 copy and in-place ops were faster
    than numpy's.
    """
    q = torch.from_numpy(sample["emb"]).reshape(sample["emb"].shape[0], -1)
    valid = torch.from_numpy(valid_pixels(source, sample)).reshape(-1)
    scale = None
    if source != "aef":
        raw = torch.from_numpy(sample["scale"]).double()
        scale = raw.reshape(-1) if raw.dim() == 2 else raw.reshape(raw.shape[0], -1)
    dim, pixels = q.shape
    buf = torch.empty(dim, chunk, dtype=torch.float64)
    n, s1, s2 = 0, torch.zeros(dim, dtype=torch.float64), torch.zeros(dim, dtype=torch.float64)
    shift: torch.Tensor | None = None
    all_valid = bool(valid.all())
    for start in range(0, pixels, chunk):
        qc = q[:, start : start + chunk]
        sc = None if scale is None else scale[..., start : start + chunk]
        if not all_valid:
            keep = valid[start : start + chunk]
            qc = qc[:, keep]
            sc = None if sc is None else sc[..., keep]
        if qc.shape[1] == 0:
            continue
        x = buf[:, : qc.shape[1]]
        x.copy_(qc)
        if sc is None:
            x.div_(127.5)
            x.mul_(x.abs())  # sign(x) * x**2
        else:
            x.mul_(sc)
        if shift is None:
            shift = x.mean(dim=1, keepdim=True)
        x.sub_(shift)
        n += x.shape[1]
        s1 += x.sum(dim=1)
        s2 += x.square_().sum(dim=1)
    if shift is None:
        return 0, np.zeros(dim), np.zeros(dim)
    mean, m2 = shift[:, 0] + s1 / n, s2 - s1 * s1 / n
    return n, mean.numpy(), m2.numpy()


def _in_threads(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) in order, up to ``workers`` computed at once (torch's loops release
    the GIL), each thread running torch single-threaded (OpenMP's thread count is per
    thread); at most ``workers`` items are held, however long ``items`` is."""
    one = (1,)
    with ThreadPoolExecutor(max(workers, 1), "stats", torch.set_num_threads, one) as pool:
        pending: deque = deque()
        for item in items:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) >= workers:
                item, future = pending.popleft()
                yield item, future.result()
        while pending:
            item, future = pending.popleft()
            yield item, future.result()


def channel_stats(
    source: str,
    shards: list[str],
    n_tiles: int,
    seed: int,
    shard_keys: list[list[str]] | None = None,
    threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(D,) float32 mean and std over the sampled tiles, and a record of what was sampled.

    Only the sampled tiles' arrays are read (at offsets from the shards' headers), by one
    thread ahead of ``threads`` summing threads (default: torch's thread count); the result
    does not depend on ``threads``. ``shard_keys`` (the manifest's sample keys per shard)
    saves scanning shards that hold no sampled tile.
    """
    if shard_keys is None:
        shard_keys = [[s.key for s in scan_shard_cached(shard)] for shard in shards]
    keys = [k for per_shard in shard_keys for k in per_shard]
    if not keys:
        raise StatsError(f"no training tiles in {len(shards)} shard(s): cannot compute statistics")
    rng = np.random.default_rng(seed)
    chosen = set(rng.choice(keys, size=min(n_tiles, len(keys)), replace=False).tolist())
    sampled = _sampled_tiles(shards, shard_keys, chosen)
    names = ("emb",) if source == "aef" else ("emb", "scale")
    dim = sampled[0].arrays["emb"].shape[0]
    reader = BatchReader(dim, arrays=names)
    moments = RunningMoments(dim)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # chunks fit in cache: one tile per thread, not one op per thread
    tiles = round_robin([_read_tiles(reader, sampled, names)], depth=3)
    summed = _in_threads(lambda t: tile_moments(source, t), tiles, threads or torch_threads)
    try:
        for _, part in summed:
            moments.merge(*part)  # in sample order: the result does not depend on threads
    finally:
        summed.close()  # its threads finish first, then the reader's thread stops
        tiles.close()
        reader.close()
        torch.set_num_threads(torch_threads)
    record = {
        "source": source,
        "n_tiles": len(chosen),
        "seed": seed,
        "pixels": moments.n,
        "tile_keys": sorted(chosen),
    }
    std = np.where(moments.std > 0, moments.std, 1.0)
    return moments.mean.astype(np.float32), std.astype(np.float32), record


def _sampled_tiles(
    shards: list[str], shard_keys: list[list[str]], chosen: set[str]
) -> list[SampleAt]:
    """Where the ``chosen`` tiles lie, in shard and file order (reads stay sequential)."""
    sampled: list[SampleAt] = []
    for shard, listed in zip(shards, shard_keys, strict=True):
        wanted = chosen.intersection(listed)
        if not wanted:
            continue
        found = [s for s in scan_shard_cached(shard) if s.key in wanted]
        missing = wanted - {s.key for s in found}
        if missing:
            raise StatsError(
                f"{shard}: the manifest lists sample(s) {sorted(missing)[:3]} in this shard, "
                "the shard does not hold them (rebuilt or replaced since?)"
            )
        sampled.extend(found)
    return sampled


def _read_tiles(
    reader: BatchReader, sampled: list[SampleAt], names: tuple[str, ...]
) -> Iterator[dict[str, np.ndarray]]:
    """Each sampled tile's arrays, read into recycled buffers (freed once summed)."""
    for sample in sampled:
        batch = reader.read([sample])
        yield {name: batch[name][0].numpy() for name in names}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--n-tiles", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=None, help="summing threads")
    args = parser.parse_args(argv)
    try:
        manifest = read_manifest(args.manifest, splits=("train",), keys=("source",))
    except ManifestError as err:
        raise SystemExit(f"error: {err}") from err
    shards = manifest["splits"]["train"]["shards"]
    try:
        keys = manifest["splits"]["train"].get("shard_keys")
        mean, std, record = channel_stats(
            manifest["source"], shards, args.n_tiles, args.seed, keys, args.threads
        )
    except (StatsError, ShardError) as err:
        raise SystemExit(f"error: {args.manifest}: {err}") from err
    for name, array in (("channel_mean.npy", mean), ("channel_std.npy", std)):
        with atomic_path(args.out_dir / name) as tmp, open(tmp, "wb") as fh:
            np.save(fh, array)
    write_json(args.out_dir / "stats.json", record)
    print(f"{manifest['source']}: {record['n_tiles']} tiles, {record['pixels']} pixels")


if __name__ == "__main__":
    main()
