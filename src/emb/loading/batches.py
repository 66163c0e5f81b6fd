"""Loader: WebDataset shards -> compact batches (:mod:`emb.loading.dequantize` makes them inputs).

Batches stay in the shards' compact dtypes all the way to the device (docs/design.md):
``{"emb": (B, D, T, T) int8, "label": (B, T, T) uint8}`` plus ``"scale": (B, T, T) float32``
for TESSERA; training batches add ``"__key__"`` (the B sample keys, list of str) and ``"aug"``
((B,) int64 flip/rot90 codes). :class:`Dequantize` (an ``nn.Module``, run on the device) applies
the augmentation and turns a batch into ``x`` (B, D, T, T) float32 (de-quantized, normalized
for TESSERA, nodata 0) and ``y`` (B, T, T) int64 L3 ids, 255 = ignore.

Every rank reads a disjoint set of shards; a training epoch is a fixed number of batches on
every rank (so DDP never waits on a rank that ran out of data), and its order is a pure
function of (seed, epoch, rank), so a resumed run can continue an epoch at any batch.
The order is decided on shard offsets (:mod:`emb.loading.sidecar`, which falls back to
:mod:`emb.loading.shard_index` scans); reader threads then read each array straight into its
batch (:mod:`emb.loading.batch_reader`).
"""

from __future__ import annotations

import itertools
import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import webdataset as wds

from emb.loading.batch_reader import BatchReader, round_robin
from emb.loading.dequantize import AUG_CODES
from emb.loading.shard_index import SampleAt, ShardError
from emb.loading.sidecar import index_shard, sidecar_path

LoaderError = ShardError  # one error for every shard that is not what the manifest promises


def shards_for_rank(shards: list[str], rank: int, world: int) -> list[str]:
    """Round-robin: disjoint subsets that together cover ``shards``."""
    return shards[rank::world]


@dataclass(frozen=True)
class LoaderSpec:
    source: str
    in_dim: int
    batch_size: int
    num_workers: int = 0
    shuffle_buffer: int = 256
    seed: int = 0
    tile_size: int | None = None  # the manifest's: bounds what shard headers may claim


class _ShardIndex:
    """Indexes shards on first use (in the reader threads; from their sidecars, else by
    scanning) and checks their sample counts against the manifest's."""

    def __init__(self, shard_samples: dict[str, int] | None) -> None:
        self.shard_samples = shard_samples or {}
        self._scanned: dict[str, list[SampleAt]] = {}

    def __call__(self, url: str) -> list[SampleAt]:
        if url not in self._scanned:
            samples = index_shard(url)
            expected = self.shard_samples.get(url)
            if expected is not None and len(samples) != expected:
                side = sidecar_path(url)
                source = f" from its index {side}" if os.path.exists(side) else ""
                raise LoaderError(
                    f"{url}: read {len(samples)} samples{source}, the manifest lists "
                    f"{expected} (truncated or replaced shard)"
                )
            self._scanned[url] = samples
        return self._scanned[url]


def _sample_order(
    shards: list[str], spec: LoaderSpec, seed: int, worker: int, workers: int, train: bool,
    index: _ShardIndex,
) -> Iterator[tuple[SampleAt, int]]:  # fmt: skip
    """(sample, augmentation code) of one worker, in order; training cycles without end.

    Per cycle the shards are shuffled (seeded), split by worker as ``wds.split_by_worker``
    does, and the samples pass webdataset's seeded shuffle buffer. Only offsets are
    shuffled: the bytes are read later, straight into their batch.
    """
    codes = random.Random(f"{seed}-worker{worker}")
    for cycle in itertools.count():
        order = list(shards)
        if train:
            random.Random(f"{seed}-{cycle}-shards").shuffle(order)
        stream: Iterator[SampleAt] = (s for url in order[worker::workers] for s in index(url))
        if train and spec.shuffle_buffer > 1:
            rng = random.Random(f"{seed}-{cycle}-buffer")
            stream = wds.shuffle(spec.shuffle_buffer, rng=rng)(stream)
        for sample in stream:
            yield sample, codes.randrange(AUG_CODES) if train else 0
        if not train:
            return


def _worker_batches(
    order: Iterator[tuple[SampleAt, int]], spec: LoaderSpec, train: bool, skip: int = 0
) -> Iterator[dict]:
    """Batches of one worker; the first ``skip`` are drawn (order, codes) but never read."""
    reader = BatchReader(spec.in_dim, tile_size=spec.tile_size)
    try:
        while chunk := list(itertools.islice(order, spec.batch_size)):
            if skip:
                skip -= 1
                continue
            batch: dict = reader.read([sample for sample, _ in chunk])
            if train:
                batch["__key__"] = [sample.key for sample, _ in chunk]
                batch["aug"] = torch.tensor([code for _, code in chunk], dtype=torch.int64)
            yield batch
    finally:
        reader.close()


def train_steps_per_epoch(samples: int, batch_size: int, world: int) -> int:
    """Batches every rank yields per epoch: all samples seen once, the last batch padded."""
    return max(1, math.ceil(samples / (batch_size * world)))


def train_batches(
    shards: list[str], samples: int, spec: LoaderSpec, rank: int, world: int, epoch: int,
    start_batch: int = 0, shard_samples: dict[str, int] | None = None,
) -> Iterator[dict]:  # fmt: skip
    """Batches ``start_batch`` .. ``train_steps_per_epoch`` of this rank's ``epoch``.

    ``spec.num_workers`` reader threads each batch their own shards; batch i comes from
    worker i % workers (as from a DataLoader). The sequence depends only on (seed, epoch,
    rank, world, workers): resuming at ``start_batch`` yields exactly the batches an
    uninterrupted epoch would have yielded, without reading the ones it skips.
    """
    if len(shards) < world:
        raise LoaderError(
            f"train split has {len(shards)} shards, fewer than the {world} ranks: "
            "lower shards.max_samples so that every rank reads its own shards"
        )
    mine = shards_for_rank(shards, rank, world)
    threads = min(spec.num_workers, len(mine))  # never more workers than shards
    n = max(threads, 1)
    seed = spec.seed * 1_000_003 + epoch * 7919 + rank
    index = _ShardIndex(shard_samples)
    workers = [
        _worker_batches(
            _sample_order(mine, spec, seed, w, n, True, index), spec, True,
            skip=len(range(w, start_batch, n)),
        )
        for w in range(n)
    ]  # fmt: skip
    batches = round_robin(workers, first=start_batch) if threads else workers[0]
    steps = train_steps_per_epoch(samples, spec.batch_size, world)
    try:
        yield from itertools.islice(batches, max(steps - start_batch, 0))
    finally:
        batches.close()


def eval_batches(
    shards: list[str], spec: LoaderSpec, rank: int = 0, world: int = 1,
    shard_samples: dict[str, int] | None = None,
) -> Iterator[dict]:  # fmt: skip
    """One pass over this rank's share of ``shards``: every sample exactly once across ranks.

    With ``spec.num_workers`` > 0 one reader thread reads ahead of the consumer.
    """
    mine = shards_for_rank(shards, rank, world)
    if not mine:
        return
    order = _sample_order(mine, spec, spec.seed, 0, 1, False, _ShardIndex(shard_samples))
    batches = _worker_batches(order, spec, False)
    if spec.num_workers:
        batches = round_robin([batches])
    try:
        yield from batches
    finally:
        batches.close()


def shard_sample_counts(split: dict) -> dict[str, int]:
    """{shard path: sample count} of one manifest split."""
    return dict(zip(split["shards"], split["shard_samples"], strict=True))
