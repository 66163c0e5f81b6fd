"""WebDataset tar shards written member by member, each with its index sidecar.

webdataset's TarWriter goes through tarfile's copy loop over a BytesIO; writing the USTAR
headers ourselves lets the arrays' memory go to the file without any copy, and knowing every
member's offset as it is written gives the index sidecar (:mod:`emb.loading.sidecar`) for
free. The result is a plain tar: webdataset and tarfile read it as usual.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from emb import stage_runner
from emb.loading.sidecar import Member, npy_member, sidecar_path, write_sidecar
from emb.prep.region_index import write_index

Payload = tuple[bytes | memoryview, ...]  # a tar member's bytes, as buffers written in turn
NPY_HEAD = 4096  # bytes of a payload that hold its .npy header (as scan_shard reads them)


def encode_npy(array: np.ndarray) -> Payload:
    """``.npy`` bytes as (header, the array's own memory): written without a copy."""
    array = np.ascontiguousarray(array)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    return header.getvalue(), memoryview(array).cast("B")


def payload_size(payload: Payload) -> int:
    return sum(memoryview(part).nbytes for part in payload)


def _head(payload: Payload) -> bytes:
    """The first bytes of a payload, across its parts (an ``.npy`` header is in them)."""
    head = b""
    for part in payload:
        head += bytes(memoryview(part)[: NPY_HEAD - len(head)])
        if len(head) >= NPY_HEAD:
            break
    return head


class TarShard:
    """A tar written sample by sample; :meth:`close` ends it and writes its index sidecar."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fh = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.members: list[Member] = []

    def write(self, sample: dict[str, str | Payload]) -> None:
        try:
            self._write(sample)
        except OSError as err:  # a write() knows no file name: name the shard
            if err.filename is None:
                raise OSError(err.errno, err.strerror, self.path) from err
            raise

    def _write(self, sample: dict[str, str | Payload]) -> None:
        key = sample["__key__"]
        for name, payload in sample.items():
            if name == "__key__":
                continue
            size = payload_size(payload)
            info = tarfile.TarInfo(f"{key}.{name}")
            info.size, info.mode, info.mtime = size, 0o644, 0
            self.fh.write(info.tobuf(tarfile.USTAR_FORMAT))
            head = _head(payload) if name.endswith(".npy") else b""
            self.members.append(npy_member(info.name, self.fh.tell(), size, head))
            for part in payload:
                self.fh.write(part)
            self.fh.write(b"\0" * (-size % tarfile.BLOCKSIZE))

    def abandon(self) -> None:
        """Close the file of a failed build; a flush failing on a full disk is ignored (the
        file is closed all the same, and its staging folder is removed)."""
        with contextlib.suppress(OSError):
            self.fh.close()

    def close(self) -> None:
        self.fh.write(b"\0" * (2 * tarfile.BLOCKSIZE))  # end-of-archive marker
        size = self.fh.tell()
        self.fh.close()
        write_sidecar(self.path, size, self.members)


def write_shards(
    samples: Iterator[dict], pattern: str, max_samples: int, max_bytes: int
) -> list[dict]:
    """Stream samples into ``pattern % n`` shards, each closed at ``max_samples`` samples or
    ``max_bytes`` bytes; returns [{path, samples, bytes, keys}] per shard. Memory holds one
    sample."""
    shards: list[dict] = []
    sink: TarShard | None = None
    count = size = 0
    keys: list[str] = []

    def close() -> None:
        nonlocal sink
        assert sink is not None
        sink.close()
        path = Path(pattern % len(shards))
        shards.append(
            {"path": str(path), "samples": count, "bytes": path.stat().st_size, "keys": keys[:]}
        )
        sink = None

    try:
        for sample in samples:
            if sink is None:
                sink, count, size = TarShard(pattern % len(shards)), 0, 0
                keys.clear()
            sink.write(sample)
            keys.append(sample["__key__"])
            count += 1
            size += sum(payload_size(v) for k, v in sample.items() if k != "__key__")
            if count >= max_samples or size >= max_bytes:
                close()
        if sink is not None:
            close()
    except BaseException:
        if sink is not None:
            sink.abandon()
        raise
    return shards


def publish_shards(staging: Path, out_dir: Path, index: dict, index_path: Path | None) -> None:
    """Move the staged shards and sidecars under their final names, then the region index,
    then drop shards of an older build.

    Everything that can fail for want of space is written before the first rename, and
    signals wait until the renames are done: neither a full disk nor a SIGTERM leaves half
    the new shards beside half the old ones.
    """
    moves = []
    for part in index["splits"].values():
        for shard in part["shards"]:
            staged = shard["path"]
            shard["path"] = str(out_dir / Path(staged).name)
            moves.append((staged, shard["path"]))
    if index_path is not None:
        write_index(staging / "index.json", index)
    with stage_runner.signals_deferred():
        for staged, final in moves:
            # The tar first: a crash in between leaves the old sidecar (or none) beside the
            # new tar, which the loader refuses (size) or scans; never a sidecar without its tar.
            os.replace(staged, final)
            os.replace(sidecar_path(staged), sidecar_path(final))
        if index_path is not None:
            os.replace(staging / "index.json", index_path)
    keep = {Path(final).name for _, final in moves}
    for old in out_dir.glob("*-[0-9][0-9][0-9][0-9].tar"):
        if old.name not in keep:
            Path(sidecar_path(old)).unlink(missing_ok=True)
            old.unlink()
