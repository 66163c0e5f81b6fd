"""Loader: WebDataset shards -> (x, y) batches for training and evaluation.

``x``: (B, D, T, T) float32, de-quantized (AEF) or de-quantized and normalized (TESSERA),
nodata pixels 0. ``y``: (B, T, T) int64 L3 ids, 255 = ignore (L2/L1 come from lookup tables
on the device). Every rank reads a disjoint set of shards; a training epoch is a fixed number
of batches on every rank, so DDP never waits on a rank that ran out of data.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from emb.rasters import to_float, valid_pixels


class LoaderError(ValueError):
    """Shards that cannot feed the requested ranks."""


def decode_sample(sample: dict) -> dict:
    """Raw WebDataset sample -> arrays (``.npy``) and dicts (``.json``); others dropped."""
    out: dict = {"__key__": sample["__key__"]}
    for name, value in sample.items():
        if name.endswith(".npy"):
            out[name[:-4]] = np.load(io.BytesIO(value), allow_pickle=False)
        elif name.endswith(".json"):
            out[name[:-5]] = json.loads(value)
    return out


def iter_samples(shards: list[str]) -> Iterator[dict]:
    """Every sample of ``shards`` in order, decoded, in this process."""
    dataset = wds.WebDataset(shards, shardshuffle=False, nodesplitter=None, empty_check=False)
    yield from map(decode_sample, dataset)


def shards_for_rank(shards: list[str], rank: int, world: int) -> list[str]:
    """Round-robin: disjoint subsets that together cover ``shards``."""
    return shards[rank::world]


@dataclass(frozen=True)
class Normalization:
    """Per-channel (D,) mean and std applied after de-quantization (TESSERA), or none (AEF)."""

    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    @classmethod
    def from_files(cls, mean_path: Path, std_path: Path) -> Normalization:
        return cls(np.load(mean_path).astype(np.float32), np.load(std_path).astype(np.float32))


def to_tensors(sample: dict, source: str, norm: Normalization) -> tuple[torch.Tensor, torch.Tensor]:
    x = to_float(source, sample)
    if norm.mean is not None:
        valid = valid_pixels(source, sample)
        x = (x - norm.mean[:, None, None]) / norm.std[:, None, None]
        x[:, ~valid] = 0.0
    return torch.from_numpy(x), torch.from_numpy(sample["label"].astype(np.int64))


def augment(pair: tuple[torch.Tensor, torch.Tensor], rng: random.Random) -> tuple:
    """Random flip and rot90, applied identically to x (D, H, W) and y (H, W)."""
    x, y = pair
    k = rng.randrange(4)
    if rng.random() < 0.5:
        x, y = x.flip(-1), y.flip(-1)
    return x.rot90(k, (-2, -1)).contiguous(), y.rot90(k, (-2, -1)).contiguous()


class _Tiles(IterableDataset):
    """Samples of some shards as tensors; ``repeat`` cycles them for fixed-length epochs."""

    def __init__(
        self,
        shards: list[str],
        source: str,
        norm: Normalization,
        train: bool,
        seed: int,
        shuffle_buffer: int,
    ) -> None:
        super().__init__()
        self.shards, self.source, self.norm = shards, source, norm
        self.train, self.seed, self.shuffle_buffer = train, seed, shuffle_buffer

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker = info.id if info else 0
        rng = random.Random(self.seed * 1000 + worker)
        shards = list(self.shards)
        pipeline: Callable[[list[str]], wds.WebDataset] = lambda urls: wds.WebDataset(  # noqa: E731
            urls, shardshuffle=False, nodesplitter=None, empty_check=False
        )
        for cycle in itertools.count():
            if self.train:
                random.Random(self.seed + cycle).shuffle(shards)
            ds = pipeline(shards)
            if self.train:
                ds = ds.shuffle(self.shuffle_buffer, rng=random.Random(self.seed + cycle + 7))
            for sample in ds.map(decode_sample):
                pair = to_tensors(sample, self.source, self.norm)
                yield augment(pair, rng) if self.train else pair
            if not self.train:
                return


@dataclass(frozen=True)
class LoaderSpec:
    source: str
    batch_size: int
    num_workers: int = 0
    shuffle_buffer: int = 256
    seed: int = 0


def train_steps_per_epoch(samples: int, batch_size: int, world: int) -> int:
    """Batches every rank yields per epoch: all samples seen once, the last batch padded."""
    return max(1, math.ceil(samples / (batch_size * world)))


def train_batches(
    shards: list[str],
    samples: int,
    spec: LoaderSpec,
    norm: Normalization,
    rank: int,
    world: int,
    epoch: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Exactly ``train_steps_per_epoch`` batches of this rank's shards for ``epoch``."""
    if len(shards) < world:
        raise LoaderError(
            f"train split has {len(shards)} shards, fewer than the {world} ranks: "
            "lower shards.max_samples so that every rank reads its own shards"
        )
    mine = shards_for_rank(shards, rank, world)
    # Each worker gets its own shards (webdataset splits by worker); never more workers than
    # shards, or an idle worker would cycle an empty list for ever.
    workers = min(spec.num_workers, len(mine))
    seed = spec.seed + 1_000_003 * epoch + 7919 * rank
    dataset = _Tiles(mine, spec.source, norm, True, seed, spec.shuffle_buffer)
    loader = DataLoader(dataset, batch_size=spec.batch_size, num_workers=workers)
    steps = train_steps_per_epoch(samples, spec.batch_size, world)
    yield from itertools.islice(loader, steps)


def eval_batches(
    shards: list[str], spec: LoaderSpec, norm: Normalization, rank: int = 0, world: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One pass over this rank's share of ``shards``: every sample exactly once across ranks."""
    mine = shards_for_rank(shards, rank, world)
    if not mine:
        return
    dataset = _Tiles(mine, spec.source, norm, False, spec.seed, 0)
    yield from DataLoader(dataset, batch_size=spec.batch_size, num_workers=0)
