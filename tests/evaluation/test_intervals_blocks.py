"""Intervals resample spatial blocks, not tiles, through the real evaluate stage.

The test split here is built so that the grouping is visible: 16 spatial blocks of 2 x 2 tiles,
and the 4 tiles of a block are copies of each other (its embedding and its labels), the
extreme of what neighbouring tiles are: correlated. A bootstrap over blocks then sees 16
independent units; one that treated each tile as its own unit would see 64 and give an
interval about half as wide.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import CLASSES_CSV, TinyDemo
from rasterio.windows import Window
from shard_reader import iter_samples
from tiny_runs import fit, resolved_config, write_run

from emb.classes import IGNORE, load_class_map
from emb.evaluation.block_scores import interval_record
from emb.evaluation.bootstrap import BootstrapSettings, block_intervals
from emb.evaluation.evaluate import main as evaluate_main
from emb.metrics import scores_from_confusion
from emb.prep.align_labels import align_labels
from emb.prep.demo_region import DEMO_REGIONS, write_region
from emb.prep.manifest import merge_indexes
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec

TILE, BLOCK_M, BLOCKS_PER_SIDE = 32, 640.0, 4  # 10 m pixels: a block is 2 x 2 tiles
LEVELS = ("l1", "l2", "l3")


def block_copies(src: Path, dst: Path, side: int) -> None:
    """``src`` cut to ``side`` x ``side`` px starting on a block edge, each block's 4 tiles
    a copy of its top-left tile (all bands)."""
    block_px = 2 * TILE
    with rasterio.open(src) as raster:
        t = raster.transform
        col0 = round((math.ceil(t.c / BLOCK_M) * BLOCK_M - t.c) / t.a)
        row0 = round((t.f - math.floor(t.f / BLOCK_M) * BLOCK_M) / -t.e)
        window = Window(col0, row0, side, side)
        data = raster.read(window=window)
        profile = {**raster.profile, "width": side, "height": side,
                   "transform": raster.window_transform(window)}  # fmt: skip
    for r in range(0, side, block_px):
        for c in range(0, side, block_px):
            first = data[:, r : r + TILE, c : c + TILE].copy()
            for dr, dc in ((0, TILE), (TILE, 0), (TILE, TILE)):
                data[:, r + dr : r + dr + TILE, c + dc : c + dc + TILE] = first
    dst.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(dst, "w", **profile) as out:
        out.write(data)


@pytest.fixture(scope="module")
def correlated(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run evaluated by the real CLI on a test split of correlated blocks."""
    root = tmp_path_factory.mktemp("correlated")
    region = next(r for r in DEMO_REGIONS if not r.bottom_up)
    side = BLOCKS_PER_SIDE * 2 * TILE
    files = write_region(region, side + 2 * TILE * 2, root / "demo", CLASSES_CSV, seed=3)
    label = root / "label.tif"
    align_labels(files["aef"], files["cdl"], load_class_map(CLASSES_CSV), label)
    emb, copied_label = root / "dup" / "aef.tif", root / "dup" / "label.tif"
    block_copies(files["aef"], emb, side)
    block_copies(label, copied_label, side)
    only_test = SplitSpec(BLOCK_M, fractions={"train": 0.0, "val": 0.0, "test": 1.0})
    out_dir = root / "shards" / "dup"
    index = build_region("aef", "dup", emb, copied_label, out_dir, TileSpec(TILE, min_valid=0.0),
                         only_test, max_samples=16)  # fmt: skip
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps(merge_indexes([index], [out_dir / "index.json"])))

    config = resolved_config(tiny_demo, root, "aef", "segformer")
    final, _ = fit(config, 40)  # trained on the tiny demo, scored on the copies
    config["data"]["manifest"] = str(manifest)
    run_dir = write_run(root / "runs" / "dup", config, final)
    out = root / "eval"
    evaluate_main(["--run-dir", str(run_dir), "--classes", str(CLASSES_CSV),
                   "--out-dir", str(out), "--threads=1", "--resamples", "2000"])  # fmt: skip
    shards = json.loads(manifest.read_text())["splits"]["test"]["shards"]
    samples = list(iter_samples(shards))
    return {"metrics": json.loads((out / "metrics.json").read_text()),
            "blocks": out / "blocks.npz", "metas": [s["meta"] for s in samples],
            "samples": samples}  # fmt: skip


def test_metrics_json_counts_blocks_not_tiles(correlated: dict) -> None:
    """Every block holds 4 tiles; metrics.json's ``bootstrap.blocks`` and blocks.npz's ids are
    the blocks of the shards' meta.json, not the tiles."""
    tiles_of: dict[str, int] = {}
    for meta in correlated["metas"]:
        tiles_of[meta["block"]] = tiles_of.get(meta["block"], 0) + 1
    assert len(correlated["metas"]) == 4 * BLOCKS_PER_SIDE**2
    assert set(tiles_of.values()) == {4} and len(tiles_of) == BLOCKS_PER_SIDE**2
    m = correlated["metrics"]
    assert m["bootstrap"]["blocks"] == len(tiles_of) and m["bootstrap"]["reliable"]
    with np.load(correlated["blocks"]) as z:
        assert sorted(z["block_ids"].tolist()) == sorted(tiles_of)


def test_correlated_blocks_give_a_wider_interval_than_resampling_tiles(correlated: dict) -> None:
    """A block's 4 identical tiles each hold a quarter of its matrix: resampling those 64
    tiles as if independent narrows the interval by about 2; metrics.json's must not be."""
    m = correlated["metrics"]
    settings = BootstrapSettings(resamples=2000)
    tiles_of: dict[str, int] = {}
    for meta in correlated["metas"]:
        tiles_of[meta["block"]] = tiles_of.get(meta["block"], 0) + 1
    with np.load(correlated["blocks"]) as z:
        ids = z["block_ids"].tolist()
        k = np.array([tiles_of.get(b, 1) for b in ids])  # a stored id that is no block: 1 tile
        for lv in LEVELS:
            cms = z[f"{m['weights']}_{lv}"]
            assert (cms % k[:, None, None] == 0).all(), "the tiles of a block are copies"
            tiles = np.repeat(cms // k[:, None, None], k, axis=0)  # each tile's own matrix
            assert len(tiles) == len(correlated["metas"])
            per_tile = block_intervals(tiles, settings)
            for fig in ("oa", "miou"):
                width = m[f"{fig}_{lv}_hi"] - m[f"{fig}_{lv}_lo"]
                tile_width = per_tile[f"{fig}_hi"] - per_tile[f"{fig}_lo"]
                assert width > 1.5 * tile_width > 0, (lv, fig, width, tile_width)


def test_block_matrices_sum_to_the_test_matrix_and_bound_every_figure(correlated: dict) -> None:
    """blocks.npz splits the exact counts by spatial block: each block's matrix holds the
    labelled pixels of its 4 tiles (read from the shards), the blocks sum to metrics.json's
    matrices, and every figure sits inside its interval."""
    m = correlated["metrics"]
    labelled: dict[str, int] = {}
    for meta, sample in zip(correlated["metas"], correlated["samples"], strict=True):
        labelled[meta["block"]] = labelled.get(meta["block"], 0) + int(
            (sample["label"] != IGNORE).sum()
        )
    with np.load(correlated["blocks"]) as z:
        ids = z["block_ids"].tolist()
        for weights in m["weight_sets"]:
            for lv in LEVELS:
                cms = z[f"{weights}_{lv}"]
                assert [int(cm.sum()) for cm in cms] == [labelled[b] for b in ids], lv
                np.testing.assert_array_equal(cms.sum(0), np.array(m[weights][lv]["confusion"]))
    for lv in LEVELS:
        for fig in ("oa", "miou", "f1"):
            assert m[f"{fig}_{lv}_lo"] <= m[f"{fig}_{lv}"] <= m[f"{fig}_{lv}_hi"], (lv, fig)
        iv = m["intervals"][m["weights"]][lv]
        per_class = scores_from_confusion(np.array(m[m["weights"]][lv]["confusion"]))["per_class"]
        rows = zip(per_class["iou"], per_class["support"], iv["iou_lo"], iv["iou_hi"], strict=True)
        for value, support, lo, hi in rows:
            if support > 0:  # a class present in the test reference: bounded
                assert lo <= value + 1e-12 and value <= hi + 1e-12
            else:  # absent from every resample: no bound (null in metrics.json)
                assert lo is None and hi is None


def test_no_interval_below_ten_blocks(correlated: dict) -> None:
    """The documented floor: 10 of the 16 blocks give intervals, 9 give none (null bounds,
    every level and class), and metrics.json's note says why."""
    m = correlated["metrics"]
    settings = BootstrapSettings(resamples=200)
    with np.load(correlated["blocks"]) as z:
        stacks = {m["weights"]: {lv: z[f"{m['weights']}_{lv}"] for lv in LEVELS}}
    for n, enough in ((10, True), (9, False), (2, False)):
        cut = {w: {lv: cms[:n] for lv, cms in levels.items()} for w, levels in stacks.items()}
        record = interval_record(cut, m["weights"], settings)
        boot = record["bootstrap"]
        assert boot["blocks"] == n and boot["reliable"] is enough
        bounds = [record[f"{f}_{lv}_{e}"] for f in ("oa", "miou", "f1") for lv in LEVELS
                  for e in ("lo", "hi")]  # fmt: skip
        per_class = [b for lv in LEVELS for e in ("iou_lo", "iou_hi")
                     for b in record["per_weights"][m["weights"]][lv][e]]  # fmt: skip
        if enough:
            assert all(isinstance(b, float) for b in bounds)
        else:
            assert bounds == [None] * len(bounds) and per_class == [None] * len(per_class)
            assert f"only {n} test blocks" in boot["note"] and "fewer than 10" in boot["note"]
