"""Where each sample's arrays lie inside a tar shard, read from the headers alone.

A loader that knows the offsets reads each array straight into its slot of a batch: one copy
from the page cache, no per-sample buffer, no stacking, which is why the order is decided on
offsets before any data is read. Scanning costs two small reads per member (the 512-byte tar
header and the ``.npy`` header); shards built with an index sidecar are not scanned
(:func:`emb.loading.sidecar.index_shard`).
"""

from __future__ import annotations

import functools
import math
import os
import tarfile
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np


class ShardError(ValueError):
    """A shard that is not the tar of ``.npy`` members the manifest promises."""


@dataclass(frozen=True)
class ArrayAt:
    """One ``.npy`` member's array: its first byte in the shard, dtype and shape."""

    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class SampleAt:
    """One sample of a shard: its key and its arrays by name (``emb``, ``label``, ...)."""

    url: str
    key: str
    arrays: dict[str, ArrayAt]


def scan_shard(url: str) -> list[SampleAt]:
    """The samples of ``url`` in file order; members are grouped by key as webdataset does.

    Raises :class:`ShardError` naming the shard on a corrupt header, a member cut short or a
    missing end-of-archive marker (a copy or a write that stopped early).
    """
    samples: list[SampleAt] = []
    with open(url, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        offset = 0
        while True:
            header = _pread(fh, offset, tarfile.BLOCKSIZE)
            if len(header) < tarfile.BLOCKSIZE:
                raise ShardError(f"{url}: truncated shard (no end-of-archive marker)")
            if not header.strip(b"\0"):
                break
            try:
                info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
            except tarfile.TarError as err:
                raise ShardError(f"{url}: corrupt shard ({err})") from err
            data = offset + tarfile.BLOCKSIZE
            if data + info.size > size:
                raise ShardError(f"{url}: truncated shard (member {info.name} is cut short)")
            offset = data + info.size + (-info.size % tarfile.BLOCKSIZE)
            key, _, suffix = info.name.rpartition("/")[2].partition(".")
            if not suffix.endswith(".npy"):
                continue  # .json metadata and anything else: not read by the loader
            if not info.isreg():  # a link's target is outside the shard; never followed
                raise ShardError(
                    f"{url}: member {info.name}: expected a regular file, found tar type "
                    f"{info.type!r}" + (f" (link to {info.linkname})" if info.linkname else "")
                )
            if not samples or samples[-1].key != key:
                samples.append(SampleAt(url, key, {}))
            samples[-1].arrays[suffix[:-4]] = _npy_array(fh, data, info, url)
    return samples


def _pread(fh: BinaryIO, offset: int, n: int) -> bytes:
    fh.seek(offset)
    return fh.read(n)


def _npy_array(fh: BinaryIO, data: int, info: tarfile.TarInfo, url: str) -> ArrayAt:
    """Parse the ``.npy`` header at ``data`` and check it against the member's size."""
    where = f"{url}: member {info.name}"
    head = _pread(fh, data, min(info.size, 4096))
    try:
        shape, fortran, dtype, data_start = npy_header(head)
    except ValueError as err:
        raise ShardError(f"{where}: corrupt .npy header ({err})") from err
    if fortran or dtype.hasobject:
        raise ShardError(f"{where}: only C-ordered, non-object .npy arrays are supported")
    if problem := shape_problem(shape):
        raise ShardError(f"{where}: {problem}")
    array = ArrayAt(data + data_start, dtype, tuple(shape))
    if data_start + array.nbytes != info.size:
        raise ShardError(
            f"{where}: .npy header promises {array.nbytes} bytes of data, "
            f"the member holds {info.size - data_start}"
        )
    return array


def shape_problem(shape: tuple[int, ...]) -> str | None:
    """Why a header's shape cannot be a shard array, or None. With the size check (the data
    the header promises is the data the member holds) this bounds every claim by the member's
    bytes: a zero dimension would let any other dimension claim anything for 0 bytes, and a
    reader sizing a buffer by it (the statistics' per-channel sums) would ask for terabytes."""
    if len(shape) == 0 or any(int(n) < 1 for n in shape):
        return f".npy header claims shape {list(shape)}, expected 1 or more in every dimension"
    return None


def npy_header(payload: bytes | memoryview) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran, dtype, data offset) of a ``.npy`` payload, read from its first bytes."""
    return _npy_header(bytes(payload[: _npy_header_length(bytes(payload[:12]))]))


def _npy_header_length(head: bytes) -> int:
    """Bytes up to the array data: magic, length field and header (format 1.0 or 2.0+)."""
    if head[6:7] == b"\x01":
        return 10 + int.from_bytes(head[8:10], "little")
    return 12 + int.from_bytes(head[8:12], "little")


@functools.lru_cache(maxsize=256)
def _npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran, dtype, data offset) of one ``.npy`` header. Cached: every sample of a
    shard repeats the same few headers, and numpy parses each with ``ast.literal_eval``."""
    reader = _BytesReader(header)
    version = np.lib.format.read_magic(reader)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(reader)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(reader)
    if reader.pos != len(header):
        raise ValueError(f"header length field says {len(header)} bytes, parsed {reader.pos}")
    return tuple(shape), fortran, dtype, reader.pos


class _BytesReader:
    """The minimal file-like object numpy's header readers need."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out
