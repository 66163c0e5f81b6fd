"""Recycled array buffers: reading into memory that is already mapped costs one copy.

numpy only (no torch), so the shard build can use it without importing torch.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import numpy as np


class BufferPool:
    """Batch buffers handed out again once nothing references them any more.

    Reading into memory that is already mapped costs one copy; a fresh buffer of a batch's
    size comes from ``mmap`` and is faulted in and zeroed page by page first, so recycling
    buffers keeps that cost out of every batch. A buffer still referenced anywhere (a batch
    the trainer holds, a tensor view of it, a queue) is never handed out. The pool grows to the most
    buffers in use at once (readers x queue depth, plus what the consumer holds), keeps at
    most ``keep`` per shape, and is shared by a process's readers so that every epoch
    starts with mapped buffers.
    """

    def __init__(
        self, keep: int = 32, allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.empty
    ) -> None:
        """``allocate(shape, dtype)`` makes a new buffer (page-locked ones for a GPU's
        batches: :func:`emb.loading.batch_reader.pinned_array`)."""
        self.keep = keep
        self.allocate = allocate
        self._buffers: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            buffers = self._buffers.setdefault((shape, np.dtype(dtype).str), [])
            for i in range(len(buffers)):
                if _unreferenced(buffers, i):
                    return buffers[i]
            buffer = self.allocate(shape, np.dtype(dtype))
            if len(buffers) < self.keep:
                buffers.append(buffer)
            return buffer


SHARED_POOL = BufferPool()


def _unreferenced(buffers: list[np.ndarray], i: int) -> bool:
    """True when only ``buffers`` holds ``buffers[i]``: tensors made by ``torch.from_numpy``
    and numpy views hold a reference to the array, so any live batch counts."""
    return sys.getrefcount(buffers[i]) == 2  # the list and getrefcount's own argument
