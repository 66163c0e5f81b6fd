"""Stage: per-channel mean and std of the training tiles, merged from the moments in the shards.

The shard build stores each TESSERA training tile's moments (count, mean and M2 of its valid
pixels, :mod:`emb.prep.moments`); this stage reads those few KB per tile at the offsets of the
shards' index sidecars and merges them exactly, so it can use every training tile
(``n_tiles="all"``) for less than a raw read of a few. Tiles without stored moments (AEF, and
shards built before moments were stored, warned) are read and their moments computed here,
with the same result.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from emb import stage_runner
from emb.config_schema import config_option
from emb.io import atomic_path, write_json
from emb.loading.batch_reader import BatchReader, check_tile_header, round_robin
from emb.loading.dequantize import StatsError
from emb.loading.shard_index import SampleAt, ShardError
from emb.loading.shard_manifest import read_manifest
from emb.loading.sidecar import index_shard
from emb.prep.moments import (
    check_moments,
    merge_moments,
    moments_array,
    stores_moments,
    tile_moments,
)
from emb.progress import Progress
from emb.threads import in_threads

__all__ = ["ALL", "channel_stats", "tile_moments"]
ALL = "all"  # n_tiles: every training tile
MOMENTS_DTYPE = np.dtype("<f8")
log = logging.getLogger(__name__)


class MissingMomentsWarning(UserWarning):
    """Sampled tiles without stored moments (shards built before they were): tiles are read."""


def choose_tiles(keys: list[str], n_tiles: int | str, seed: int) -> set[str]:
    """``n_tiles`` keys drawn with ``seed``, or every key for ``"all"`` or more than there are."""
    if n_tiles == ALL or int(n_tiles) >= len(keys):
        return set(keys)
    rng = np.random.default_rng(seed)
    return set(rng.choice(keys, size=int(n_tiles), replace=False).tolist())


def channel_stats(
    source: str,
    shards: list[str],
    n_tiles: int | str,
    seed: int,
    shard_keys: list[list[str]] | None = None,
    threads: int | None = None,
    in_dim: int | None = None,
    tile_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(D,) float32 mean and std over the sampled tiles, and a record of what was sampled.

    ``n_tiles``: a number of tiles drawn with ``seed`` (all of them when there are fewer), or
    ``"all"``. ``shard_keys`` (the manifest's sample keys per shard) saves indexing shards
    that hold no sampled tile. Stored moments are read and checked; tiles without them are
    read by one thread ahead of ``threads`` summing threads (default: torch's thread count).
    The result depends on neither ``threads`` nor which tiles had stored moments.
    ``in_dim`` (the manifest's) bounds what the tiles' headers claim before anything is
    allocated from them, as the loader does; with ``tile_size`` (the manifest's) so are
    their tile shape and dtype.
    """
    if shard_keys is None:
        shard_keys = [[s.key for s in index_shard(shard)] for shard in shards]
    keys = [k for per_shard in shard_keys for k in per_shard]
    if not keys:
        raise StatsError(f"no training tiles in {len(shards)} shard(s): cannot compute statistics")
    chosen = choose_tiles(keys, n_tiles, seed)
    sampled = _sampled_tiles(shards, shard_keys, chosen)
    dim = _in_dim(sampled[0])
    for sample in sampled:  # before any buffer is sized by a header's claim
        if in_dim is not None and _in_dim(sample) != in_dim:
            raise ShardError(
                f"{sample.url}: sample {sample.key}: emb.npy has in_dim {_in_dim(sample)}, "
                f"the manifest says {in_dim}"
            )
        if tile_size is not None:
            check_tile_header(sample, dim, tile_size)
    progress = Progress(len(sampled), "tiles", f"{source} channel stats", log)
    parts = _stored_moments(sampled, dim, progress)
    missing = [i for i, s in enumerate(sampled) if "moments" not in s.arrays]
    if missing and stores_moments(source):
        _warn_missing([sampled[i] for i in missing])
    if missing:
        tiles = [sampled[i] for i in missing]
        parts[missing] = _moments_from_tiles(source, tiles, dim, threads, progress, tile_size)
    progress.done()
    pixels, mean, m2 = merge_moments(parts)
    if pixels == 0:
        raise StatsError(
            f"the {len(sampled)} sampled tiles have no valid pixel (first {sampled[0].url}: "
            f"{sampled[0].key}): no statistics; raise tiles.min_valid or check the rasters"
        )
    record = {
        "source": source,
        "n_tiles": len(chosen),
        "requested": n_tiles,
        "seed": seed,
        "pixels": pixels,
        "stored_moments": len(sampled) - len(missing),
        "tile_keys": sorted(chosen),
    }
    std = np.sqrt(m2 / pixels)
    std = np.where(std > 0, std, 1.0)
    return mean.astype(np.float32), std.astype(np.float32), record


def _sampled_tiles(
    shards: list[str], shard_keys: list[list[str]], chosen: set[str]
) -> list[SampleAt]:
    """Where the ``chosen`` tiles lie, in shard and file order (reads stay sequential)."""
    sampled: list[SampleAt] = []
    for shard, listed in zip(shards, shard_keys, strict=True):
        wanted = chosen.intersection(listed)
        if not wanted:
            continue
        found = [s for s in index_shard(shard) if s.key in wanted]
        missing = wanted - {s.key for s in found}
        if missing:
            raise StatsError(
                f"{shard}: the manifest lists sample(s) {sorted(missing)[:3]} in this shard, "
                "the shard does not hold them (rebuilt or replaced since?)"
            )
        sampled.extend(found)
    return sampled


def _stored_moments(sampled: list[SampleAt], dim: int, progress: Progress) -> np.ndarray:
    """(N, 3, D) moments of the sampled tiles, read where stored (other rows stay 0).

    All are checked against their tiles (shape, counts within the tile, finite, M2 >= 0): a
    shard whose moments disagree with its samples is an error naming shard and sample.
    """
    parts = np.zeros((len(sampled), 3, dim))
    pixels = np.zeros(len(sampled))
    fd, fd_url = -1, ""
    try:
        for i, sample in enumerate(sampled):
            at = sample.arrays.get("moments")
            if at is None:
                continue
            where = f"{sample.url}: sample {sample.key}"
            if _in_dim(sample) != dim:
                found = sample.arrays["emb"].shape[0]
                raise ShardError(f"{where}: emb.npy has in_dim {found}, expected {dim}")
            if (at.dtype, at.shape) != (MOMENTS_DTYPE, (3, dim)):
                raise ShardError(
                    f"{where}: moments.npy is {at.dtype}{list(at.shape)}, expected "
                    f"float64[3, {dim}] (count, mean, M2 per channel)"
                )
            if sample.url != fd_url:
                if fd >= 0:
                    os.close(fd)
                fd, fd_url = os.open(sample.url, os.O_RDONLY), sample.url
            data = os.pread(fd, at.nbytes, at.offset)
            if len(data) != at.nbytes:
                raise ShardError(f"{where}: moments.npy ends early (truncated shard)")
            parts[i] = np.frombuffer(data, MOMENTS_DTYPE).reshape(3, dim)
            pixels[i] = math.prod(sample.arrays["emb"].shape[1:])
            progress.advance()
    finally:
        if fd >= 0:
            os.close(fd)
    problem = check_moments(parts, pixels)
    if problem is not None:
        bad = sampled[problem[0]]
        raise ShardError(
            f"{bad.url}: sample {bad.key}: moments.npy: {problem[1]} (a corrupt shard: rebuild it)"
        )
    return parts


def _in_dim(sample: SampleAt) -> int:
    emb = sample.arrays.get("emb")
    if emb is None or len(emb.shape) != 3:
        found = "no emb.npy" if emb is None else f"emb.npy of shape {list(emb.shape)}"
        raise ShardError(f"{sample.url}: sample {sample.key}: {found}, expected (D, T, T)")
    return emb.shape[0]


def _warn_missing(samples: list[SampleAt]) -> None:
    shards = dict.fromkeys(s.url for s in samples)
    warnings.warn(
        f"{len(samples)} sampled tile(s) in {len(shards)} shard(s) (first {next(iter(shards))}) "
        "have no stored moments (shards built before moments were stored): reading those "
        "tiles to compute them; rebuild the shards to skip this",
        MissingMomentsWarning,
        stacklevel=3,
    )


def _moments_from_tiles(
    source: str,
    sampled: list[SampleAt],
    dim: int,
    threads: int | None,
    progress: Progress,
    tile_size: int | None = None,
) -> np.ndarray:
    """(N, 3, D) moments computed from the tiles' arrays, read in a thread ahead of the sums."""
    names = ("emb",) if source == "aef" else ("emb", "scale")
    reader = BatchReader(dim, arrays=names, tile_size=tile_size)
    tiles = round_robin([_read_tiles(reader, sampled, names)], depth=3)
    workers = threads or torch.get_num_threads()
    summed = in_threads(lambda t: tile_moments(source, t), tiles, workers)
    try:
        parts = []
        for _, part in summed:  # in sample order
            parts.append(moments_array(*part))
            progress.advance()
        return np.stack(parts)
    finally:
        summed.close()  # its threads finish first, then the reader's thread stops
        tiles.close()
        reader.close()


def _read_tiles(
    reader: BatchReader, sampled: list[SampleAt], names: tuple[str, ...]
) -> Iterator[dict[str, np.ndarray]]:
    """Each sampled tile's arrays, read into recycled buffers (freed once summed)."""
    for sample in sampled:
        batch = reader.read([sample])
        yield {name: batch[name][0].numpy() for name in names}


def n_tiles_arg(text: str) -> int | str:
    """``--n-tiles``: a positive number or ``all``."""
    if text == ALL:
        return ALL
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number or 'all', found {text!r}")
    return int(text)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument(
        "--n-tiles", type=n_tiles_arg, **config_option("stats.n_tiles", "a number or 'all'")
    )
    parser.add_argument("--seed", type=int, **config_option("stats.seed"))
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=None, help="summing threads")
    args = parser.parse_args(argv)
    manifest = read_manifest(args.manifest, splits=("train",), keys=("source",))
    train = manifest["splits"]["train"]
    try:
        mean, std, record = channel_stats(
            manifest["source"], train["shards"], args.n_tiles, args.seed,
            train.get("shard_keys"), args.threads, manifest.get("in_dim"),
            manifest.get("tile_size"),
        )  # fmt: skip
    except (StatsError, ShardError) as err:
        raise type(err)(f"{args.manifest}: {err}") from err
    if args.n_tiles != ALL and args.n_tiles > record["n_tiles"]:
        log.warning(
            "%s tiles requested, the train split has %s: all of them used",
            args.n_tiles, record["n_tiles"],
        )  # fmt: skip
    for name, array in (("channel_mean.npy", mean), ("channel_std.npy", std)):
        with atomic_path(args.out_dir / name) as tmp, open(tmp, "wb") as fh:
            np.save(fh, array)
    write_json(args.out_dir / "stats.json", record)
    log.info(
        "%s: %s tiles (%s with stored moments), %s pixels",
        manifest["source"], record["n_tiles"], record["stored_moments"], record["pixels"],
    )  # fmt: skip


if __name__ == "__main__":
    main()
