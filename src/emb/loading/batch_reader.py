"""Batches read from shards straight into recycled buffers, ahead of time, by reader threads.

Why threads and not DataLoader worker processes: a worker process hands each batch over in
fresh shared memory, and faulting those pages in costs more than reading the data, while a
thread reads each array straight into its slot of a recycled batch buffer. File reads and
copies release the GIL, so readers overlap each other and the training step. Threads also
share the trainer's signal handling: a SIGUSR1 cannot kill a reader the way it killed worker
processes.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import BinaryIO, TypeVar

import numpy as np
import torch

from emb.loading.buffer_pool import SHARED_POOL, BufferPool
from emb.loading.shard_index import SampleAt, ShardError

T = TypeVar("T")


def pinned_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A numpy array in page-locked host memory: a copy from it to a GPU runs at the link's
    speed and asynchronously; one from pageable memory is staged and blocks the host."""
    like = torch.from_numpy(np.empty(0, dtype))
    return torch.empty(shape, dtype=like.dtype, pin_memory=True).numpy()


PINNED_POOL = BufferPool(allocate=pinned_array)


def batch_pool(spec: object) -> BufferPool:
    """The pool a loader reads into: pinned where its batches go to a GPU (``pin_memory``)."""
    return PINNED_POOL if getattr(spec, "pin_memory", False) else SHARED_POOL


class BatchReader:
    """Reads a list of samples into one compact batch; one reader per thread (open files)."""

    def __init__(
        self,
        in_dim: int,
        pool: BufferPool | None = None,
        arrays: Sequence[str] | None = None,
        tile_size: int | None = None,
    ) -> None:
        """``arrays``: the arrays to read, each required; by default a training sample's
        ``emb`` and ``label`` (required) and ``scale`` (where the shard has one).
        ``tile_size`` (the manifest's): headers claiming another tile shape or dtype are
        refused before any buffer is sized from them (a forged header cannot ask for GiBs)."""
        self.in_dim = in_dim
        self.tile_size = tile_size
        self.pool = SHARED_POOL if pool is None else pool
        self.arrays = arrays
        self._files: dict[str, BinaryIO] = {}

    def read(self, samples: Sequence[SampleAt]) -> dict[str, torch.Tensor]:
        """``{"emb": (B, D, T, T), "label": (B, T, T)[, "scale": ...]}`` in the shards' dtypes."""
        first = samples[0]
        required = ("emb", "label") if self.arrays is None else tuple(self.arrays)
        names = list(required)
        if self.arrays is None and "scale" in first.arrays:
            names.append("scale")
        for sample in samples:
            self._check(sample, first, names, required)
        out: dict[str, torch.Tensor] = {}
        for name in names:
            at = first.arrays[name]
            buffer = self.pool.take((len(samples), *at.shape), at.dtype)
            for slot, sample in zip(buffer, samples, strict=True):
                self._read_into(sample, name, slot)
            out[name] = torch.from_numpy(buffer)
        return out

    def _check(
        self, sample: SampleAt, first: SampleAt, names: list[str], required: Sequence[str]
    ) -> None:
        where = f"{sample.url}: sample {sample.key}"
        missing = [k for k in required if k not in sample.arrays]
        if missing:
            raise ShardError(f"{where}: missing {missing} (truncated shard?)")
        emb, scale = sample.arrays["emb"], sample.arrays.get("scale")
        if emb.shape[0] != self.in_dim:
            raise ShardError(
                f"{where}: emb.npy has in_dim {emb.shape[0]}, manifest says {self.in_dim}"
            )
        if self.tile_size is not None:
            check_tile_header(sample, self.in_dim, self.tile_size)
        if "scale" in names and scale is not None and scale.shape[-2:] != emb.shape[1:]:
            raise ShardError(
                f"{where}: scale.npy is {list(scale.shape)}, emb.npy {list(emb.shape)}: "
                f"expected a scale of {list(emb.shape[1:])} or {list(emb.shape)}"
            )
        for name in names:
            got, want = sample.arrays.get(name), first.arrays[name]
            if got is None or (got.shape, got.dtype) != (want.shape, want.dtype):
                found = "none" if got is None else f"{got.dtype}{list(got.shape)}"
                raise ShardError(
                    f"{where}: {name}.npy is {found}, the batch's first sample "
                    f"{first.key} ({first.url}) has {want.dtype}{list(want.shape)}"
                )

    def _read_into(self, sample: SampleAt, name: str, slot: np.ndarray) -> None:
        fh = self._files.get(sample.url)
        if fh is None:
            fh = self._files[sample.url] = open(sample.url, "rb", buffering=0)  # noqa: SIM115
        at = sample.arrays[name]
        fh.seek(at.offset)
        if fh.readinto(memoryview(slot).cast("B")) != at.nbytes:
            raise ShardError(
                f"{sample.url}: truncated shard ({sample.key}.{name}.npy ends early; "
                "the file changed since it was scanned)"
            )

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()


def check_tile_header(sample: SampleAt, in_dim: int, tile_size: int) -> None:
    """Refuse a sample whose ``emb``/``label`` headers are not the manifest's tile: compared
    before anything is allocated from the header's claim."""
    t = tile_size
    want = {"emb": ((in_dim, t, t), np.dtype(np.int8)), "label": ((t, t), np.dtype(np.uint8))}
    for name, (shape, dtype) in want.items():
        at = sample.arrays.get(name)
        if at is not None and (tuple(at.shape), at.dtype) != (shape, dtype):
            raise ShardError(
                f"{sample.url}: sample {sample.key}: {name}.npy header claims "
                f"{at.dtype}{list(at.shape)}, the manifest's tile is {dtype}{list(shape)} "
                "(a corrupt shard: rebuild it)"
            )


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def round_robin(workers: Sequence[Iterator[T]], first: int = 0, depth: int = 2) -> Iterator[T]:
    """Items of ``workers`` in turns ``first``, ``first + 1``, ...; each worker runs in its own
    thread up to ``depth`` items ahead. A worker that ends drops out of the turns; an
    exception in a worker is raised here, at its turn. Closing this generator stops and joins
    the threads."""
    stop = threading.Event()
    queues: list[queue.Queue] = [queue.Queue(depth) for _ in workers]
    threads = [
        threading.Thread(target=_run, args=(w, q, stop), name=f"emb-reader-{i}", daemon=True)
        for i, (w, q) in enumerate(zip(workers, queues, strict=True))
    ]
    for thread in threads:
        thread.start()
    turns = queues[first % len(queues) :] + queues[: first % len(queues)]
    try:
        while turns:
            for q in list(turns):
                item = q.get()
                if item is _END:
                    turns.remove(q)
                elif isinstance(item, _Failed):
                    raise item.error
                else:
                    yield item
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _run(worker: Iterator, out: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in itertools.chain(worker, [_END]):
            if not _put(out, item, stop):
                return
    except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
        _put(out, _Failed(err), stop)
    finally:
        close = getattr(worker, "close", None)
        if close is not None:
            close()


def _put(out: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put ``item`` unless the consumer stops first (then a full queue is never drained)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
