"""Shards whose ``emb.npy`` header claims an impossible tile, for the readers' tests.

The emb member really holds the 230 GB the header promises, as a sparse file (a hole costs no
disk), so the existing size checks pass and only a comparison with the manifest's tile size
and band count stops a reader from allocating it.
"""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path

import numpy as np

from emb.loading.sidecar import npy_member, write_sidecar

FORGED = (64, 60000, 60000)  # 230 GB of int8
TILE = 8  # the true label's size


def _npy_head(shape: tuple[int, ...], descr: str) -> bytes:
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return head.getvalue()


def forged_shard(
    path: Path, sidecar: bool, tile: int = TILE, claim: tuple[int, ...] = FORGED
) -> Path:
    """``a.emb.npy`` claiming ``claim`` (payload a hole) then a true ``a.label.npy`` of
    ``tile`` px: a shard of one sample."""
    emb_head = _npy_head(claim, "|i1")
    label = io.BytesIO()
    np.save(label, np.zeros((tile, tile), np.uint8))
    members = [("a.emb.npy", emb_head, len(emb_head) + math.prod(claim)),
               ("a.label.npy", label.getvalue(), label.tell())]  # fmt: skip
    records = []
    with open(path, "wb") as fh:
        for name, head, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            fh.write(info.tobuf(tarfile.GNU_FORMAT))  # base-256 size field past 8 GiB
            offset = fh.tell()
            fh.write(head)
            fh.seek(offset + size + (-size % tarfile.BLOCKSIZE))  # the rest: a sparse hole
            records.append(npy_member(name, offset, size, head))
        fh.write(b"\0" * 2 * tarfile.BLOCKSIZE)
        tar_bytes = fh.tell()
    if sidecar:
        write_sidecar(path, tar_bytes, records)
    return path
