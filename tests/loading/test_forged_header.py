"""A shard whose ``emb.npy`` header claims an impossible tile (issue 32, item 7).

The shard is a real tar whose emb member really holds the 230 GB the header promises, as a
sparse file (a hole costs no disk), so the existing size checks pass and only a comparison
with the manifest's tile size and band count stops the reader from allocating it.
"""

from __future__ import annotations

import io
import math
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from emb.loading.batches import LoaderError, LoaderSpec, eval_batches
from emb.loading.shard_index import ShardError
from emb.loading.sidecar import MissingSidecarWarning, npy_member, write_sidecar
from emb.prep.channel_stats import channel_stats

FORGED = (64, 60000, 60000)  # 230 GB of int8
TILE = 8


def _npy_head(shape: tuple[int, ...], descr: str) -> bytes:
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return head.getvalue()


def forged_shard(path: Path, sidecar: bool) -> Path:
    """``a.emb.npy`` claiming ``FORGED`` (payload a hole) then a true ``a.label.npy``."""
    emb_head = _npy_head(FORGED, "|i1")
    label = io.BytesIO()
    np.save(label, np.zeros((TILE, TILE), np.uint8))
    members = [("a.emb.npy", emb_head, len(emb_head) + math.prod(FORGED)),
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


@pytest.fixture(params=[True, False], ids=["sidecar", "scanned"])
def shard(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(forged_shard(tmp_path / "train-0000.tar", request.param))


def _assert_names_it(message: str, shard: str) -> None:
    assert shard in message and "sample a" in message and "emb.npy" in message
    assert "[64, 60000, 60000]" in message and f"[64, {TILE}, {TILE}]" in message


def test_channel_stats_refuses_a_forged_tile_header_before_allocating(shard: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingSidecarWarning)
        with pytest.raises(ShardError) as err:
            channel_stats("aef", [shard], "all", 0, in_dim=64, tile_size=TILE)
    _assert_names_it(str(err.value), shard)


def test_loader_refuses_a_forged_tile_header_before_allocating(shard: str) -> None:
    spec = LoaderSpec("aef", 64, batch_size=1, tile_size=TILE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingSidecarWarning)
        with pytest.raises(LoaderError) as err:
            list(eval_batches([shard], spec))
    _assert_names_it(str(err.value), shard)
