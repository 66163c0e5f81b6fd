"""Training bounds what a shard's headers may claim by the manifest's tile size: a train shard
whose ``emb.npy`` header claims another tile is refused by the training loop (``build_loop``'s
loader), naming the shard and the manifest's tile, before any batch is built from the claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TinyDemo
from forged_shards import forged_shard
from training_runs import resolve_config, train_here

from emb.loading.shard_index import ShardError


def test_training_refuses_a_train_shard_whose_header_claims_another_tile(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    manifest = tiny_demo.manifest("aef")
    tile = manifest["tile_size"]
    # a claim twice the tile: small enough that a loader without the bound reads it (and
    # fails elsewhere, or trains on it) instead of allocating what a huge claim would ask
    claim = (64, 2 * tile, 2 * tile)
    shard = forged_shard(tmp_path / "train-0000.tar", sidecar=True, tile=tile, claim=claim)
    manifest["splits"]["train"].update(
        shards=[str(shard)], shard_samples=[1], shard_keys=[["a"]], samples=1, tiles=1
    )
    forged = tmp_path / "manifest.json"
    forged.write_text(json.dumps(manifest))
    config = resolve_config(
        tiny_demo,
        tmp_path / "run",
        f"data.manifest={forged}",
        "train.batch_size=1",
        "train.val_min_batch=1",
    )

    with pytest.raises(ShardError) as err:
        train_here(config)

    message = str(err.value)
    assert f"{shard}: sample a: emb.npy header claims int8{list(claim)}" in message, message
    assert f"the manifest's tile is int8[64, {tile}, {tile}]" in message, message
