"""Index sidecars: where every member of a tar shard lies, written by the build beside the tar.

``{shard}.tar.idx.json`` lists each member's name, payload offset and size, and for ``.npy``
members the dtype, shape and header length; the loader and the statistics take the arrays'
offsets from it instead of reading two small headers per member (``scan_shard``), the
slowest thing a loader does on Lustre. A sidecar that disagrees with its tar (size, sample
count, members outside it) is an error naming both files: it is never silently trusted.
numpy only, so the shard build can use it without importing torch.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tarfile
import warnings
from pathlib import Path

import numpy as np

from emb.io import json_text
from emb.loading.shard_index import (
    ArrayAt,
    SampleAt,
    ShardError,
    npy_header,
    scan_shard,
    shape_problem,
)

FORMAT = "emb-shard-index/1"
SUFFIX = ".idx.json"

# One member: [name, payload offset, payload size] and, for ``.npy``, [dtype, shape, header].
Member = list


def sidecar_path(url: str | Path) -> str:
    """The sidecar of the shard ``url``: ``train-0000.tar`` -> ``train-0000.tar.idx.json``."""
    return f"{url}{SUFFIX}"


def npy_member(name: str, offset: int, size: int, head: bytes) -> Member:
    """The record of a member whose payload starts with ``head`` (an ``.npy`` header when
    ``name`` ends with ``.npy``); raises ValueError for an array the loader could not read."""
    if not name.endswith(".npy"):
        return [name, offset, size]
    shape, fortran, dtype, header = npy_header(head)
    if fortran or dtype.hasobject or np.dtype(dtype.str) != dtype:
        raise ValueError(f"{name}: only C-ordered arrays of a plain dtype can be indexed")
    return [name, offset, size, dtype.str, list(shape), header]


def write_sidecar(url: str | Path, tar_bytes: int, members: list[Member]) -> None:
    """Write the sidecar of ``url`` (a tar of ``tar_bytes`` bytes holding ``members``)."""
    index = {
        "format": FORMAT,
        "tar_bytes": tar_bytes,
        "samples": len(_group(members)),
        "members": members,
    }
    Path(sidecar_path(url)).write_text(json_text(index, separators=(",", ":")))


class MissingSidecarWarning(UserWarning):
    """A shard without an index sidecar (built before sidecars existed): its headers are read."""


_WARNED: set[str] = set()  # folders already warned about


def index_shard(url: str) -> list[SampleAt]:
    """The samples of ``url``: from its sidecar, or scanned from the tar's headers when it has
    none (warned once per folder). Remembered while both files stay the same (inode, size,
    mtime): every epoch reads the same shards, and a rebuilt shard is a new file."""
    st = os.stat(url)
    try:
        side = os.stat(sidecar_path(url))
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(url))
        if folder not in _WARNED:
            _WARNED.add(folder)
            warnings.warn(
                f"{url}: no index sidecar {Path(sidecar_path(url)).name}; scanning tar headers "
                "instead (two small reads per member, slow on Lustre; said once per folder). "
                "Rebuild the shards to write sidecars.",
                MissingSidecarWarning,
                stacklevel=2,
            )
        return list(_scanned(url, st.st_ino, st.st_size, st.st_mtime_ns))
    tar = (st.st_ino, st.st_size, st.st_mtime_ns)
    return list(_indexed(url, *tar, side.st_ino, side.st_size, side.st_mtime_ns))


@functools.lru_cache(maxsize=4096)
def _scanned(url: str, ino: int, size: int, mtime_ns: int) -> tuple[SampleAt, ...]:
    return tuple(scan_shard(url))


@functools.lru_cache(maxsize=4096)
def _indexed(url: str, ino: int, size: int, *versions: int) -> tuple[SampleAt, ...]:
    return tuple(read_sidecar(url, size))


def read_sidecar(url: str, tar_bytes: int) -> list[SampleAt]:
    """The samples of ``url`` from its sidecar, as :func:`scan_shard` would find them.

    Raises FileNotFoundError when there is none, :class:`ShardError` naming both files when
    it is not an index of this tar: another size, members outside the tar or overlapping,
    ``.npy`` sizes that do not add up, or a sample count that differs from its own members.
    """
    path = sidecar_path(url)
    with open(path, "rb") as fh:
        text = fh.read()
    where = f"{path} (index of {url})"
    try:
        index = json.loads(text)
        fmt, indexed, members, count = (
            index[k] for k in ("format", "tar_bytes", "members", "samples")
        )
        if fmt != FORMAT:
            raise ValueError(f"format {fmt!r}, expected {FORMAT!r}")
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise ShardError(f"{where}: not a shard index ({err!r}); rebuild the shards") from err
    if indexed != tar_bytes:
        raise ShardError(
            f"{path} indexes {indexed} bytes, {url} has {tar_bytes}: the two disagree "
            "(shard truncated or replaced after the build); rebuild the shards"
        )
    try:
        samples = _samples(url, members, tar_bytes)
    except (ValueError, TypeError, IndexError) as err:
        raise ShardError(f"{where}: {err}; rebuild the shards") from err
    if len(samples) != count:
        raise ShardError(f"{where}: says {count} samples, its members make {len(samples)}")
    return samples


def _samples(url: str, members: list[Member], tar_bytes: int) -> list[SampleAt]:
    """SampleAt records of the ``.npy`` members, grouped by key as ``scan_shard`` groups them."""
    samples: list[SampleAt] = []
    end = 0  # where the previous member's padded payload ends
    for member in members:
        name, offset, size = member[0], int(member[1]), int(member[2])
        if offset < end + tarfile.BLOCKSIZE or size < 0 or offset + size > tar_bytes:
            raise ValueError(f"member {name} at {offset} (+{size}) is not where a member can be")
        end = offset + size + (-size % tarfile.BLOCKSIZE)
        key, _, suffix = name.rpartition("/")[2].partition(".")
        if not suffix.endswith(".npy"):
            continue
        descr, shape, header = member[3], tuple(int(n) for n in member[4]), int(member[5])
        if problem := shape_problem(shape):
            raise ValueError(f"member {name}: {problem}")
        array = ArrayAt(offset + header, _dtype(descr), shape)
        if header + math.prod(shape) * array.dtype.itemsize != size:
            raise ValueError(f"member {name}: {header} + {array.nbytes} bytes != size {size}")
        if not samples or samples[-1].key != key:
            samples.append(SampleAt(url, key, {}))
        samples[-1].arrays[suffix[:-4]] = array
    return samples


def _group(members: list[Member]) -> list[str]:
    """Sample keys in order: consecutive ``.npy`` members of one key form one sample."""
    keys: list[str] = []
    for member in members:
        key, _, suffix = member[0].rpartition("/")[2].partition(".")
        if suffix.endswith(".npy") and (not keys or keys[-1] != key):
            keys.append(key)
    return keys


@functools.lru_cache(maxsize=64)
def _dtype(descr: str) -> np.dtype:
    return np.dtype(descr)
