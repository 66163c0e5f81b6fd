"""Shard round trip: every shard sample equals its raster and label windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import TinyDemo
from rasterio.windows import Window
from shard_reader import iter_samples

from emb.classes import IGNORE
from emb.prep.manifest import merge_indexes
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec
from emb.rasters import dequantize_tessera
from emb.report.data_report import coverage_table


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
        # tiles past the raster's edge (CRS-anchored grid) read nodata there: NaN, label 255
        raw = emb_ds.read(window=win, boundless=True, fill_value=np.nan)
        restored = dequantize_tessera(sample["emb"], sample["scale"])
        ok = np.isfinite(raw).all(0)
        bound = np.abs(np.where(ok, raw, 0)).max(0) / 254 + 1e-6
        assert (np.abs(restored - np.nan_to_num(raw))[:, ok] <= bound[ok]).all()
        assert (sample["scale"][~ok] == 0).all()
        assert np.array_equal(
            sample["label"], lab_ds.read(1, window=win, boundless=True, fill_value=IGNORE)
        )
        assert sample["meta"]["block"].startswith("demo_a:")
        checked += 1
    keys = [s["__key__"] for s in iter_samples(part["shards"])]
    assert checked == sum(k.startswith("demo_a_") for k in keys) > 0


def crop(path: Path, win: Window, out: Path) -> Path:
    """A real GeoTIFF of ``win`` of ``path``, georeferenced where that window lies."""
    with rasterio.open(path) as src:
        profile = src.profile | {
            "width": win.width, "height": win.height,
            "transform": src.window_transform(win), "tiled": False,
        }  # fmt: skip
        profile.pop("blockxsize", None), profile.pop("blockysize", None)
        with rasterio.open(out, "w", **profile) as dst:
            dst.write(src.read(window=win))
    return out


@pytest.mark.parametrize("source", ["aef", "tessera"])
def test_a_small_off_grid_area_yields_tiles_padded_with_nodata(
    tiny_demo: TinyDemo, tmp_path: Path, source: str
) -> None:
    """An area of 45 x 27 px, 5 px off the block grid, with 32-px tiles: no refusal; its tiles
    reach past its edges, where the embedding is nodata and the label 255; the index records
    the share of labelled pixels in a kept tile and each sample names its block."""
    win = Window(5, 3, 45, 27)
    emb = crop(tiny_demo.rasters["demo_a"][source], win, tmp_path / "emb.tif")
    lab = crop(tiny_demo.labels[(source, "demo_a")], win, tmp_path / "lab.tif")
    spec = TileSpec(32, min_valid=0.1)
    index_path = tmp_path / "out" / "index.json"
    index = build_region(source, "small", emb, lab, tmp_path / "out", spec, SplitSpec(320.0),
                         index_path=index_path)  # fmt: skip
    coverage = index["label_coverage"]["all"]
    assert coverage["labelled"] > 0 and coverage["share"] >= 0.9
    table = coverage_table(merge_indexes([index], [index_path]))  # as the data report shows it
    row = table[(table.region == "small") & (table.split == "all")]
    assert row.share.item() == round(coverage["share"], 4) and len(table) == 4
    shards = [s["path"] for part in index["splits"].values() for s in part["shards"]]
    samples = list(iter_samples(shards))
    assert samples
    with rasterio.open(lab) as src:
        labels = src.read(1)
    for sample in samples:
        col, row, size, _ = sample["meta"]["window"]
        assert sample["meta"]["block"].startswith("small:")
        split = next(k for k, p in index["splits"].items() if sample["__key__"] in p["blocks"])
        assert index["splits"][split]["blocks"][sample["__key__"]] == sample["meta"]["block"]
        outside = np.ones((size, size), bool)
        r0, c0 = max(row, 0), max(col, 0)
        outside[r0 - row : 27 - row, c0 - col : 45 - col] = False
        assert outside.any()  # every tile of this area reaches past an edge
        assert (sample["label"][outside] == IGNORE).all()
        inside = sample["label"][~outside]
        assert np.array_equal(inside, labels[r0 : row + size, c0 : col + size].reshape(-1))
        if source == "aef":
            assert (sample["emb"][:, outside] == -128).all()
        else:
            assert (sample["scale"][..., outside] == 0).all()
