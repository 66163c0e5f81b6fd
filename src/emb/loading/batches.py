"""Loader: WebDataset shards -> compact batches (:mod:`emb.loading.dequantize` makes them inputs).

Batches stay in the shards' compact dtypes all the way to the device (docs/design.md):
``{"emb": (B, D, T, T) int8, "label": (B, T, T) uint8}`` plus ``"scale": (B, T, T) float32``
for TESSERA; training batches add ``"__key__"`` (the B sample keys, list of str) and ``"aug"``
((B,) int64 flip/rot90 codes). :class:`Dequantize` (an ``nn.Module``, run on the device) applies
the augmentation and turns a batch into ``x`` (B, D, T, T) float32 (de-quantized, normalized
for TESSERA, nodata 0) and ``y`` (B, T, T) int64 L3 ids, 255 = ignore.

Every rank reads a disjoint set of shards; a training epoch is a fixed number of full batches
on every rank (so DDP never waits on a rank that ran out of data): each of the rank's samples
at most once, the remainder past the last full batch dropped (``drop_last``, as the seeds'
recipes do). Its order is a pure function of (seed, epoch, rank), whatever the number of
reader threads, so a resumed run can continue an epoch at any batch.
The order is decided on shard offsets (:mod:`emb.loading.sidecar`, which falls back to
:mod:`emb.loading.shard_index` scans); reader threads then read each array straight into its
batch (:mod:`emb.loading.batch_reader`).
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import webdataset as wds

from emb.loading.batch_reader import BatchReader, batch_pool, round_robin
from emb.loading.dequantize import AUG_CODES
from emb.loading.shard_index import SampleAt, ShardError
from emb.loading.shard_manifest import shards_for_rank
from emb.loading.sidecar import index_shard, sidecar_path

LoaderError = ShardError  # one error for every shard that is not what the manifest promises


@dataclass(frozen=True)
class LoaderSpec:
    source: str
    in_dim: int
    batch_size: int
    # the loader order's settings, required: their defaults are the training schema's
    # (train.num_workers, train.shuffle_buffer, train.seed); evaluation reads in file order
    num_workers: int
    shuffle_buffer: int
    seed: int
    tile_size: int | None = None  # the manifest's: bounds what shard headers may claim
    pin_memory: bool = False  # read into page-locked buffers (a CUDA/ROCm run's batches)


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
    shards: list[str], spec: LoaderSpec, seed: int, train: bool, index: _ShardIndex
) -> Iterator[SampleAt]:
    """This rank's samples, each once, in the order of one pass.

    Training shuffles the shards (seeded) and passes the samples through webdataset's seeded
    shuffle buffer; evaluation reads them in order. Only offsets are shuffled: the bytes are
    read later, straight into their batch.
    """
    order = list(shards)
    if train:
        random.Random(f"{seed}-shards").shuffle(order)
    stream: Iterator[SampleAt] = (s for url in order for s in index(url))
    if train and spec.shuffle_buffer > 1:
        stream = wds.shuffle(spec.shuffle_buffer, rng=random.Random(f"{seed}-buffer"))(stream)
    return stream


def _read_batches(
    chunks: Iterator[list[tuple[SampleAt, int]]], spec: LoaderSpec, train: bool
) -> Iterator[dict]:
    """Batches of (sample, augmentation code) lists, read by one reader (its open files)."""
    reader = BatchReader(spec.in_dim, pool=batch_pool(spec), tile_size=spec.tile_size)
    try:
        for chunk in chunks:
            batch: dict = reader.read([sample for sample, _ in chunk])
            if train:
                batch["__key__"] = [sample.key for sample, _ in chunk]
                batch["aug"] = torch.tensor([code for _, code in chunk], dtype=torch.int64)
            yield batch
    finally:
        reader.close()


def rank_samples(shard_samples: dict[str, int], shards: list[str], world: int) -> list[int]:
    """Training samples each rank reads (the shards of :func:`shards_for_rank`)."""
    return [sum(shard_samples[s] for s in shards_for_rank(shards, r, world)) for r in range(world)]


def train_steps_per_epoch(per_rank: list[int], batch_size: int) -> int:
    """Batches every rank yields per epoch: full batches only, as many as the rank with the
    fewest samples fills (``drop_last``, as in the seeds' recipes). Each rank's epoch is the
    first ``steps * batch_size`` samples of its shuffled order; the rest is its dropped
    remainder, never a repeat of a sample it already read."""
    steps = min(n // batch_size for n in per_rank)
    if steps < 1:
        rank = min(range(len(per_rank)), key=per_rank.__getitem__)
        raise LoaderError(
            f"train split: rank {rank} of {len(per_rank)} reads {per_rank[rank]} samples, "
            f"fewer than one batch of train.batch_size {batch_size}: lower train.batch_size or "
            "launch.nproc_per_node, or shards.max_samples so that the shards spread evenly"
        )
    return steps


def train_batches(
    shards: list[str], samples: int, spec: LoaderSpec, rank: int, world: int, epoch: int,
    start_batch: int = 0, shard_samples: dict[str, int] | None = None,
) -> Iterator[dict]:  # fmt: skip
    """Batches ``start_batch`` .. ``train_steps_per_epoch`` of this rank's ``epoch``.

    Each of this rank's samples appears at most once per epoch (the remainder past the last
    full batch is dropped). The batches are cut from the epoch's order first, then shared
    out over ``spec.num_workers`` reader threads in turns; the sequence depends only on (seed,
    epoch, rank, world), not on the threads: resuming at
    ``start_batch`` yields exactly the batches an uninterrupted epoch would have yielded,
    without reading the ones it skips. ``samples`` is the split's total (the manifest's).
    """
    if len(shards) < world:
        raise LoaderError(
            f"train split has {len(shards)} shards, fewer than the {world} ranks: "
            "lower shards.max_samples so that every rank reads its own shards"
        )
    index = _ShardIndex(shard_samples)
    counts = shard_samples or {url: len(index(url)) for url in shards}
    steps = train_steps_per_epoch(rank_samples(counts, shards, world), spec.batch_size)
    mine = shards_for_rank(shards, rank, world)
    seed = spec.seed * 1_000_003 + epoch * 7919 + rank
    codes = random.Random(f"{seed}-aug")
    order = ((s, codes.randrange(AUG_CODES)) for s in _sample_order(mine, spec, seed, True, index))
    chunks = [list(itertools.islice(order, spec.batch_size)) for _ in range(steps)]
    todo = chunks[start_batch:]
    threads = min(spec.num_workers, len(todo))
    if not threads:
        batches = _read_batches(iter(todo), spec, True)
    else:
        batches = round_robin([_read_batches(iter(todo[w::threads]), spec, True)
                               for w in range(threads)])  # fmt: skip
    try:
        yield from batches
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
    samples = _sample_order(mine, spec, spec.seed, False, _ShardIndex(shard_samples))
    order = ((sample, 0) for sample in samples)
    batches = _read_batches(_chunks(order, spec.batch_size), spec, False)
    if spec.num_workers:
        batches = round_robin([batches])
    try:
        yield from batches
    finally:
        batches.close()


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk
