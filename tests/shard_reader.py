"""A reference tar-shard reader for tests: independent of the loader's offset scans.

Reads every member sequentially (tarfile headers, one ``readinto`` per payload) and decodes
``.npy``/``.json`` members, so tests can check the loader and the stats against a second reader.
"""

from __future__ import annotations

import json
import math
import tarfile
from collections.abc import Iterator

import numpy as np

from emb.loading.shard_index import ShardError, npy_header
from emb.rasters import dequantize_aef, dequantize_tessera

LoaderError = ShardError


def decode_npy(data: bytes | np.ndarray) -> np.ndarray:
    """``.npy`` payload -> array viewing the same memory (no copy; read-only for ``bytes``)."""
    buf = memoryview(data)
    shape, fortran, dtype, start = npy_header(buf)
    if fortran or dtype.hasobject:
        raise ValueError("only C-ordered, non-object .npy arrays are supported")
    return np.frombuffer(buf, dtype=dtype, count=math.prod(shape), offset=start).reshape(shape)


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


def to_float(source: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """De-quantized (D, H, W) float32 embedding of a shard sample; invalid pixels are 0."""
    if source == "aef":
        return dequantize_aef(arrays["emb"])
    return dequantize_tessera(arrays["emb"], arrays["scale"])
