"""A shard whose ``emb.npy`` header claims an impossible tile (issue 32, item 7).

The shard is a real tar whose emb member really holds the 230 GB the header promises, as a
sparse file (a hole costs no disk), so the existing size checks pass and only a comparison
with the manifest's tile size and band count stops the reader from allocating it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from forged_shards import TILE, forged_shard

from emb.loading.batches import LoaderError, LoaderSpec, eval_batches
from emb.loading.shard_index import ShardError
from emb.loading.sidecar import MissingSidecarWarning
from emb.prep.channel_stats import channel_stats


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
    spec = LoaderSpec("aef", 64, 1, 0, shuffle_buffer=0, seed=0, tile_size=TILE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingSidecarWarning)
        with pytest.raises(LoaderError) as err:
            list(eval_batches([shard], spec))
    _assert_names_it(str(err.value), shard)
