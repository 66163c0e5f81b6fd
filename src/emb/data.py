"""Loader: WebDataset shards -> compact batches; :class:`Dequantize` makes them model inputs.

Batches stay in the shards' compact dtypes all the way to the device (DESIGN.md section 8):
``{"emb": (B, D, T, T) int8, "label": (B, T, T) uint8}`` plus ``"scale": (B, T, T) float32``
for TESSERA; training batches add ``"__key__"`` (the B sample keys, list of str) and ``"aug"``
((B,) int64 flip/rot90 codes). :class:`Dequantize` (an ``nn.Module``, run on the device) applies
the augmentation and turns a batch into ``x`` (B, D, T, T) float32 (de-quantized, normalized
for TESSERA, nodata 0) and ``y`` (B, T, T) int64 L3 ids, 255 = ignore.

Every rank reads a disjoint set of shards; a training epoch is a fixed number of batches on
every rank (so DDP never waits on a rank that ran out of data), and its order is a pure
function of (seed, epoch, rank), so a resumed run can continue an epoch at any batch.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import tarfile
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import webdataset as wds
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from emb.rasters import AEF_NODATA


class LoaderError(ValueError):
    """Shards that cannot be read as promised by the manifest."""


def decode_npy(data: bytes | np.ndarray) -> np.ndarray:
    """``.npy`` payload -> array viewing the same memory (no copy; read-only for ``bytes``)."""
    buf = memoryview(data)
    version = np.lib.format.read_magic(_Reader(buf))
    reader = _Reader(buf, 8)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(reader)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(reader)
    if fortran or dtype.hasobject:
        raise ValueError("only C-ordered, non-object .npy arrays are supported")
    count = math.prod(shape)
    return np.frombuffer(buf, dtype=dtype, count=count, offset=reader.pos).reshape(shape)


class _Reader:
    """The minimal file-like object numpy's header readers need, over a memoryview."""

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def read(self, n: int) -> bytes:
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += len(out)
        return out


def tar_samples(url: str) -> Iterator[dict]:
    """Samples of one tar shard, read sequentially with one ``readinto`` per member.

    Members are grouped by key (the name up to its first dot), as webdataset does. Payloads
    land in fresh writable buffers that the decoded arrays then view without a copy.
    Python's stream-mode tarfile (webdataset's reader) reached 0.05-0.3 of a raw read here.
    """
    sample: dict = {}
    with open(url, "rb") as fh:
        while True:
            header = fh.read(tarfile.BLOCKSIZE)
            if not header.strip(b"\0"):
                if len(header) < tarfile.BLOCKSIZE and not sample:
                    raise LoaderError(f"{url}: truncated shard (no end-of-archive marker)")
                break
            try:
                info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
            except tarfile.TarError as err:
                raise LoaderError(f"{url}: corrupt shard ({err})") from err
            payload = np.empty(info.size, np.uint8)  # uninitialized: readinto fills it
            if fh.readinto(memoryview(payload)) < info.size:
                raise LoaderError(f"{url}: truncated shard (member {info.name} is cut short)")
            fh.seek(-info.size % tarfile.BLOCKSIZE, 1)
            if not info.isreg():
                continue
            key, _, suffix = info.name.rpartition("/")[2].partition(".")
            if sample and sample["__key__"] != key:
                yield sample
                sample = {}
            sample.setdefault("__key__", key)
            sample["__url__"] = url
            sample[suffix] = payload
    if sample:
        yield sample


def decode_sample(sample: dict) -> dict:
    """Raw WebDataset sample -> arrays (``.npy``) and dicts (``.json``), key and url kept."""
    out: dict = {"__key__": sample["__key__"], "__url__": sample.get("__url__", "")}
    for name, value in sample.items():
        if name.endswith(".npy"):
            out[name[:-4]] = decode_npy(value)
        elif name.endswith(".json"):
            out[name[:-5]] = json.loads(bytes(value))
    return out


def iter_samples(shards: list[str]) -> Iterator[dict]:
    """Every sample of ``shards`` in order, decoded, in this process."""
    for url in shards:
        yield from map(decode_sample, tar_samples(url))


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


def _compact(sample: dict, spec: LoaderSpec) -> dict[str, torch.Tensor]:
    """A decoded sample as compact tensors; checks it against the manifest's promises."""
    where = f"{sample['__url__']}: sample {sample['__key__']}"
    missing = [k for k in ("emb", "label") if k not in sample]
    if missing:
        raise LoaderError(f"{where}: missing {missing} (truncated shard?)")
    emb = sample["emb"]
    if emb.shape[0] != spec.in_dim:
        raise LoaderError(
            f"{where}: emb.npy has in_dim {emb.shape[0]}, manifest says {spec.in_dim}"
        )
    names = ("emb", "label", "scale") if "scale" in sample else ("emb", "label")
    return {name: _as_tensor(sample[name]) for name in names}


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing the (read-only) decoded buffer; nothing here writes to it in place."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


AUG_CODES = 8  # code = k + 4 * flip: rot90 by k quarter turns after an optional W flip


def augment_batch(batch: dict, codes: torch.Tensor) -> dict:
    """Each sample's flip/rot90 ``codes[i]`` applied to every (B, ..., T, T) tensor of ``batch``.

    Run on the device by :class:`Dequantize`: a transposing int8 copy in a loader worker cost
    1.3 ms per 4 MB tile here, more than reading it; on a GPU it is negligible.
    """
    out = dict(batch)
    present = codes.tolist()
    for name, t in batch.items():
        if name == "aug" or not isinstance(t, torch.Tensor) or t.dim() < 3:
            continue
        moved = t.clone()
        for code in set(present):
            if code == 0:
                continue
            idx = torch.tensor([i for i, c in enumerate(present) if c == code], device=t.device)
            part = t.index_select(0, idx)
            part = part.flip(-1) if code >= 4 else part
            moved.index_copy_(0, idx, part.rot90(code % 4, (-2, -1)))
        out[name] = moved
    return out


class _Tiles(IterableDataset):
    """Compact samples of some shards; in training, cycled and shuffled for fixed-length epochs.

    When a full pass ends, the samples read per shard are checked against ``shard_samples``
    (the manifest), so a shard truncated between members cannot silently shrink an epoch.
    """

    def __init__(
        self, shards: list[str], spec: LoaderSpec, train: bool, seed: int,
        shard_samples: dict[str, int] | None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.shards, self.spec, self.train, self.seed = shards, spec, train, seed
        self.shard_samples = shard_samples

    def _pass(self, shards: list[str], cycle: int) -> Iterator[dict]:
        mine = list(wds.split_by_worker(shards))
        stream = (sample for url in mine for sample in tar_samples(url))
        if self.train and self.spec.shuffle_buffer > 1:
            rng = random.Random(f"{self.seed}-{cycle}-buffer")
            stream = wds.shuffle(self.spec.shuffle_buffer, rng=rng)(stream)
        seen: Counter[str] = Counter()
        for sample in stream:
            seen[sample["__url__"]] += 1
            out: dict = _compact(decode_sample(sample), self.spec)
            if self.train:
                out["__key__"] = sample["__key__"]
            yield out
        for url in mine:
            expected = (self.shard_samples or {}).get(url)
            if expected is not None and seen[url] != expected:
                raise LoaderError(
                    f"{url}: read {seen[url]} samples, the manifest lists {expected} "
                    "(truncated or replaced shard)"
                )

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        rng = random.Random(f"{self.seed}-worker{info.id if info else 0}")
        for cycle in itertools.count():
            shards = list(self.shards)
            if self.train:
                random.Random(f"{self.seed}-{cycle}-shards").shuffle(shards)
            for sample in self._pass(shards, cycle):
                if self.train:
                    sample["aug"] = rng.randrange(AUG_CODES)
                yield sample
            if not self.train:
                return


def _private_generator(seed: int) -> torch.Generator:
    """A DataLoader draws a base seed when an iterator starts; from torch's global generator
    that draw would shift drop-path masks, and a resumed run would not be bitwise equal."""
    return torch.Generator().manual_seed(seed)


def train_steps_per_epoch(samples: int, batch_size: int, world: int) -> int:
    """Batches every rank yields per epoch: all samples seen once, the last batch padded."""
    return max(1, math.ceil(samples / (batch_size * world)))


def train_batches(
    shards: list[str], samples: int, spec: LoaderSpec, rank: int, world: int, epoch: int,
    start_batch: int = 0, shard_samples: dict[str, int] | None = None,
) -> Iterator[dict]:  # fmt: skip
    """Batches ``start_batch`` .. ``train_steps_per_epoch`` of this rank's ``epoch``.

    The sequence depends only on (seed, epoch, rank, world, workers): resuming at
    ``start_batch`` yields exactly the batches an uninterrupted epoch would have yielded.
    """
    if len(shards) < world:
        raise LoaderError(
            f"train split has {len(shards)} shards, fewer than the {world} ranks: "
            "lower shards.max_samples so that every rank reads its own shards"
        )
    mine = shards_for_rank(shards, rank, world)
    # Never more workers than shards: webdataset gives each worker its own shards.
    workers = min(spec.num_workers, len(mine))
    seed = spec.seed * 1_000_003 + epoch * 7919 + rank
    dataset = _Tiles(mine, spec, True, seed, shard_samples)
    loader = DataLoader(
        dataset, batch_size=spec.batch_size, num_workers=workers, generator=_private_generator(seed)
    )
    steps = train_steps_per_epoch(samples, spec.batch_size, world)
    yield from itertools.islice(loader, start_batch, steps)


def eval_batches(
    shards: list[str], spec: LoaderSpec, rank: int = 0, world: int = 1,
    shard_samples: dict[str, int] | None = None,
) -> Iterator[dict]:  # fmt: skip
    """One pass over this rank's share of ``shards``: every sample exactly once across ranks."""
    mine = shards_for_rank(shards, rank, world)
    if not mine:
        return
    dataset = _Tiles(mine, spec, False, spec.seed, shard_samples)
    generator = _private_generator(spec.seed)
    yield from DataLoader(dataset, batch_size=spec.batch_size, num_workers=0, generator=generator)


def shard_sample_counts(split: dict) -> dict[str, int]:
    """{shard path: sample count} of one manifest split."""
    return dict(zip(split["shards"], split["shard_samples"], strict=True))


class Dequantize(nn.Module):
    """Compact batch -> (x (B, D, T, T) float32, y (B, T, T) int64), on the batch's device.

    A training batch's ``"aug"`` codes are applied first (:func:`augment_batch`).
    AEF: ``sign(q) * (q / 127.5) ** 2``. TESSERA: ``q * scale``, then ``(x - mean) / std``
    when statistics are given. Nodata pixels (AEF -128, TESSERA scale 0) become 0.
    """

    def __init__(self, source: str, mean: np.ndarray | None = None, std: np.ndarray | None = None):
        super().__init__()
        self.source = source
        self.normalize = mean is not None
        if mean is not None:
            self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32)[:, None, None])
            self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32)[:, None, None])

    @classmethod
    def from_stats(cls, source: str, stats_dir: Path | None) -> Dequantize:
        if stats_dir is None:
            return cls(source)
        return cls(
            source, np.load(stats_dir / "channel_mean.npy"), np.load(stats_dir / "channel_std.npy")
        )

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if "aug" in batch:
            batch = augment_batch(batch, batch["aug"])
        q = batch["emb"]
        if self.source == "aef":
            x = q.float() / 127.5
            x = torch.sign(x) * x * x
            valid = (q[:, 0] != AEF_NODATA)[:, None]
        else:
            scale = batch["scale"].float()
            scale = scale[:, None] if scale.dim() == 3 else scale
            x = q.float() * scale
            valid = (scale > 0).any(1, keepdim=True) if scale.shape[1] > 1 else scale > 0
        if self.normalize:
            x = (x - self.mean) / self.std
        x = torch.where(valid, x, torch.zeros((), device=x.device))
        return x, batch["label"].long()
