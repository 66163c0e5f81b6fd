"""Shard round trip: every shard sample equals its raster and label windows."""

from __future__ import annotations

import numpy as np
import rasterio
from conftest import TinyDemo
from shard_reader import iter_samples

from emb.rasters import dequantize_tessera


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
