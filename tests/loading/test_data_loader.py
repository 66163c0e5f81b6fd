"""Loader batches: sample keys, training-only augmentation applied on the device, epochs."""

from __future__ import annotations

import torch
from conftest import TinyDemo

from emb.loading.batches import LoaderSpec, eval_batches, train_batches
from emb.loading.dequantize import Dequantize

SPEC = LoaderSpec("tessera", 128, batch_size=4, num_workers=0, shuffle_buffer=8, seed=1)


def train_part(tiny_demo: TinyDemo) -> dict:
    return tiny_demo.manifest("tessera")["splits"]["train"]


def test_a_training_epoch_carries_each_sample_key_once_but_the_remainder(tiny_demo) -> None:
    part = train_part(tiny_demo)
    batches = list(train_batches(part["shards"], part["samples"], SPEC, 0, 1, epoch=2))
    keys = [k for b in batches for k in b["__key__"]]
    assert all(len(b["__key__"]) == b["emb"].shape[0] == SPEC.batch_size for b in batches)
    everything = {k for ks in part["shard_keys"] for k in ks}
    assert len(keys) == len(set(keys)) and set(keys) <= everything
    assert len(everything) - len(keys) == part["samples"] % SPEC.batch_size


def test_only_training_batches_carry_augmentation_codes(tiny_demo: TinyDemo) -> None:
    part = train_part(tiny_demo)
    train = next(iter(train_batches(part["shards"], part["samples"], SPEC, 0, 1, epoch=0)))
    val = tiny_demo.manifest("tessera")["splits"]["val"]["shards"]
    evaluation = next(iter(eval_batches(val, SPEC)))
    assert train["aug"].dtype == torch.int64 and train["aug"].shape == (4,)
    assert "aug" not in evaluation and "__key__" not in evaluation


def test_dequantize_flips_and_rotates_inputs_and_labels_alike(tiny_demo: TinyDemo) -> None:
    part = train_part(tiny_demo)
    batch = next(iter(train_batches(part["shards"], part["samples"], SPEC, 0, 1, epoch=0)))
    codes = torch.tensor([0, 1, 6, 7])  # identity, rot90, flip + rot180, flip + rot270
    plain = {k: v for k, v in batch.items() if k != "aug"}
    x0, y0 = Dequantize("tessera")(plain)
    x, y = Dequantize("tessera")({**plain, "aug": codes})
    for i, code in enumerate(codes.tolist()):
        xi, yi = (x0[i].flip(-1), y0[i].flip(-1)) if code >= 4 else (x0[i], y0[i])
        assert torch.equal(x[i], xi.rot90(code % 4, (-2, -1)))
        assert torch.equal(y[i], yi.rot90(code % 4, (-2, -1)))
    assert not torch.equal(x[1], x0[1])
