"""Core units of the skeleton: de-quantization, tiling and splits, shard round trip, loss."""

from __future__ import annotations

import numpy as np
import rasterio
import torch
import torch.nn.functional as F
from affine import Affine
from conftest import TinyDemo

from emb.data import iter_samples
from emb.loss import HierarchyTargets, MultiHeadLoss
from emb.rasters import AEF_NODATA, dequantize_aef, dequantize_tessera
from emb.tiles import SplitSpec, TileSpec, blocks_of, plan_tiles


def test_aef_dequantization_gives_unit_vectors(tiny_demo: TinyDemo) -> None:
    q = rasterio.open(tiny_demo.rasters["demo_a"]["aef"]).read()
    valid = q[0] != AEF_NODATA
    norms = np.linalg.norm(dequantize_aef(q)[:, valid], axis=0)
    assert valid.mean() > 0.8
    assert norms.min() > 0.98 and norms.max() < 1.02


def test_aef_nodata_dequantizes_to_zero() -> None:
    q = np.full((64, 2, 2), AEF_NODATA, np.int8)
    assert not dequantize_aef(q).any()


def test_tiles_of_different_splits_never_share_a_block(tiny_demo: TinyDemo) -> None:
    with rasterio.open(tiny_demo.labels[("tessera", "demo_b")]) as src:
        labels, transform = src.read(1), src.transform
    spec = SplitSpec(block_m=320.0, seed=3)
    tiles, _ = plan_tiles(labels, transform, "demo_b", TileSpec(16), spec)
    owner: dict = {}
    for tile in tiles:
        for block in blocks_of(tile.window, transform, spec.block_m):
            assert owner.setdefault(block, tile.split) == tile.split
    assert {t.split for t in tiles} == {"train", "val", "test"}


def test_bottom_up_raster_tiles_and_splits_like_top_down() -> None:
    labels = np.zeros((64, 64), np.uint8)
    top_down = Affine(10, 0, 0, 0, -10, 640)
    bottom_up = Affine(10, 0, 0, 0, 10, 0)
    spec = SplitSpec(block_m=160.0)
    a, _ = plan_tiles(labels, top_down, "r", TileSpec(16), spec)
    b, _ = plan_tiles(labels[::-1], bottom_up, "r", TileSpec(16), spec)
    # the same ground block holds the same split in both orientations
    split_a = {blocks_of(t.window, top_down, 160.0)[0]: t.split for t in a}
    split_b = {blocks_of(t.window, bottom_up, 160.0)[0]: t.split for t in b}
    assert split_a == split_b and len(split_a) == 16


def test_shard_samples_equal_the_raster_windows(tiny_demo: TinyDemo) -> None:
    part = tiny_demo.manifest("tessera")["splits"]["val"]
    emb_ds = rasterio.open(tiny_demo.rasters["demo_a"]["tessera"])
    lab_ds = rasterio.open(tiny_demo.labels[("tessera", "demo_a")])
    checked = 0
    for sample in iter_samples(part["shards"]):
        region, row, col = sample["__key__"].rsplit("_", 2)
        if region != "demo_a":
            continue
        win = rasterio.windows.Window(int(col), int(row), 32, 32)
        raw = emb_ds.read(window=win)
        restored = dequantize_tessera(sample["emb"], sample["scale"])
        ok = np.isfinite(raw).all(0)
        bound = np.abs(np.where(ok, raw, 0)).max(0) / 254 + 1e-6
        assert (np.abs(restored - np.nan_to_num(raw))[:, ok] <= bound[ok]).all()
        assert (sample["scale"][~ok] == 0).all()
        assert np.array_equal(sample["label"], lab_ds.read(1, window=win))
        checked += 1
    keys = [s["__key__"] for s in iter_samples(part["shards"])]
    assert checked == sum(k.startswith("demo_a_") for k in keys) > 0


def test_loss_is_the_weighted_sum_of_per_level_cross_entropies(class_map) -> None:
    torch.manual_seed(0)
    y3 = torch.randint(0, 61, (2, 8, 8))
    y3[0, :2] = 255
    logits = {k: torch.randn(2, n, 8, 8) for k, n in (("l1", 2), ("l2", 7), ("l3", 61))}
    targets = HierarchyTargets(class_map)(y3)
    weights = {"l1": 0.1, "l2": 0.3, "l3": 1.0}
    total, _ = MultiHeadLoss(weights, 0.05)(logits, targets)
    expected = sum(
        w * F.cross_entropy(logits[k], targets[k], ignore_index=255, label_smoothing=0.05)
        for k, w in weights.items()
    )
    assert torch.allclose(total, expected, atol=1e-6)
    assert (targets["l2"][0, :2] == 255).all() and (targets["l1"][0, :2] == 255).all()


def test_loss_of_a_batch_without_labels_is_zero_not_nan() -> None:
    logits = {
        k: torch.randn(1, n, 4, 4, requires_grad=True)
        for k, n in (("l1", 2), ("l2", 7), ("l3", 61))
    }
    targets = {k: torch.full((1, 4, 4), 255) for k in logits}
    total, _ = MultiHeadLoss({"l1": 0.1, "l2": 0.3, "l3": 1.0})(logits, targets)
    total.backward()
    assert total.item() == 0.0 and torch.isfinite(logits["l3"].grad).all()


def test_tessera_quantization_in_threaded_row_chunks_equals_the_whole_block_formula() -> None:
    """A 300 x 300 tile is quantized in a dozen ~4 MB row chunks, run in two threads."""
    from concurrent.futures import ThreadPoolExecutor

    from emb.rasters import shard_arrays

    rng = np.random.default_rng(3)
    block = (rng.standard_normal((128, 300, 300)) * 7 - 2).astype(np.float32)
    block[5, 17, 290] = np.nan
    block[:, 299, 0] = np.inf
    block[:, 150, 150] = 0.0  # a pixel with max|x| = 0: scale 0, q 0
    x = block.astype(np.float64)
    valid = np.isfinite(x).all(0)
    amax = np.abs(np.where(valid, x, 0)).max(0).astype(np.float32)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    q_ref = np.rint(np.where(valid, block, 0) * inv).astype(np.int8)
    with ThreadPoolExecutor(2) as pool:
        out = shard_arrays("tessera", block.copy(), None, map_chunks=pool.map)
    assert np.array_equal(out["emb"], q_ref)
    assert np.array_equal(out["scale"], np.where(valid, amax / np.float32(127), 0))
    assert out["scale"][17, 290] == 0 and out["scale"][299, 0] == 0
