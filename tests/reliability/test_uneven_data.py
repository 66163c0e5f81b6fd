"""Uneven data, as a property over random draws: 1-20 real tar shards of uneven sizes, read by
1-4 ranks with 0-2 loader workers. Training: every rank yields the same number of full batches
(as many as the rank with the fewest samples fills), each sample at most once, only its
remainder left out; fewer shards than ranks, or a rank without one full batch, is refused with
a clear message.
Evaluation: every sample is seen exactly once across ranks.

Each trial draws its case from its own seed (printed on failure); the first trials are the
corners (1 shard, 20 shards on 4 ranks, one huge shard among tiny ones, fewer shards than ranks).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from trials import pytest_generate_tests  # noqa: F401 - parametrizes `trial`

from emb.loading.batches import (
    LoaderError,
    LoaderSpec,
    eval_batches,
    train_batches,
    train_steps_per_epoch,
)
from emb.loading.shard_manifest import shards_for_rank
from emb.prep.shards import TarShard, encode_npy

pytestmark = pytest.mark.reliability

DIM, TILE = 2, 4
CORNERS = [  # (shard sizes, ranks, workers, batch size)
    ([1], 1, 0, 1),
    ([1], 1, 2, 3),
    ([3] * 19 + [1], 4, 2, 2),
    ([40, 1, 1, 1], 4, 1, 4),
    ([2, 5], 3, 0, 2),
]


def draw(trial: int) -> tuple[list[int], int, int, int]:
    if trial < len(CORNERS):
        return CORNERS[trial]
    rng = random.Random(trial)
    sizes = [rng.choice([1, 1, 2, 3, 5, 8, 13, 30]) for _ in range(rng.randint(1, 20))]
    return sizes, rng.randint(1, 4), rng.randint(0, 2), rng.randint(1, 5)


def write_shards(folder: Path, sizes: list[int]) -> tuple[list[str], dict[str, int]]:
    """Real WebDataset tars written by the project's shard writer; keys ``s{shard}_{i}``."""
    paths = []
    for n, size in enumerate(sizes):
        path = str(folder / f"train-{n:04d}.tar")
        sink = TarShard(path)
        for i in range(size):
            emb = np.stack([np.full((TILE, TILE), n, np.int8), np.full((TILE, TILE), i, np.int8)])
            label = np.full((TILE, TILE), i % 61, np.uint8)
            sink.write({"__key__": f"s{n}_{i}", "emb.npy": encode_npy(emb),
                        "label.npy": encode_npy(label), "meta.json": (b"{}",)})  # fmt: skip
        sink.close()
        paths.append(path)
    return paths, dict(zip(paths, sizes, strict=True))


@pytest.mark.check("uneven_data")
def test_uneven_shards_give_every_rank_the_same_nonempty_epoch(tmp_path: Path, trial: int):
    sizes, world, workers, batch = draw(trial)
    where = f"trial {trial}: shard sizes {sizes}, {world} ranks, {workers} workers, batch {batch}"
    shards, counts = write_shards(tmp_path, sizes)
    spec = LoaderSpec("aef", DIM, batch, workers, shuffle_buffer=4, seed=trial)
    total = sum(sizes)
    if len(shards) < world:
        with pytest.raises(LoaderError, match=f"{len(shards)} shards, fewer than the {world}"):
            next(iter(train_batches(shards, total, spec, 0, world, 0, shard_samples=counts)))
        return
    owns = [{f"s{shards.index(p)}_{i}" for p in shards_for_rank(shards, rank, world)
             for i in range(counts[p])} for rank in range(world)]  # fmt: skip
    fewest = min(len(own) for own in owns)
    if fewest < batch:
        with pytest.raises(LoaderError, match=f"reads {fewest} samples, fewer than one batch"):
            next(iter(train_batches(shards, total, spec, 0, world, 0, shard_samples=counts)))
        return
    expected = fewest // batch
    assert train_steps_per_epoch([len(own) for own in owns], batch) == expected, where
    for rank, own in enumerate(owns):
        batches = list(train_batches(shards, total, spec, rank, world, 0, shard_samples=counts))
        assert len(batches) == expected, f"{where}: rank {rank} yielded {len(batches)} batches"
        keys = [k for b in batches for k in b["__key__"]]
        assert all(b["emb"].shape[0] == batch for b in batches), f"{where}: a short batch"
        assert set(keys) <= own, f"{where}: rank {rank} read another rank's shard"
        assert len(keys) == len(set(keys)), f"{where}: rank {rank} read a sample twice"
    seen: Counter[tuple[int, int]] = Counter()
    for rank in range(world):
        for b in eval_batches(shards, spec, rank, world, shard_samples=counts):
            seen.update(map(tuple, b["emb"][:, :, 0, 0].tolist()))  # (shard, sample) ids
    everything = Counter((n, i) for n, size in enumerate(sizes) for i in range(size))
    assert seen == everything, f"{where}: evaluation did not see every sample exactly once"
