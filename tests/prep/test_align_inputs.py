"""Odd but valid inputs to the alignment: a uint16 CDL, an AEF raster without a nodata tag."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import rasterio
from conftest import TinyDemo

from emb.classes import IGNORE, ClassMap
from emb.evaluation.windows import fill_value
from emb.prep.align_labels import align_labels
from emb.rasters import AEF_NODATA, shard_arrays


def rewrite(src_path: Path, dest: Path, data: np.ndarray | None = None, **profile) -> Path:
    with rasterio.open(src_path) as src:
        meta, values = src.profile, src.read()
    meta.update(profile)
    values = values if data is None else data
    with rasterio.open(dest, "w", **meta) as dst:
        dst.write(values.astype(meta["dtype"]))
    return dest


def labels_of(path: Path) -> np.ndarray:
    with rasterio.open(path) as src:
        return src.read(1)


def test_a_uint16_cdl_keeps_codes_above_255_unmapped_instead_of_wrapping(
    tiny_demo: TinyDemo, class_map: ClassMap, tmp_path: Path
) -> None:
    emb, cdl = tiny_demo.rasters["demo_a"]["aef"], tiny_demo.rasters["demo_a"]["cdl"]
    with rasterio.open(cdl) as src:
        codes = src.read().astype(np.uint16)
    wrapped = int(codes[0, 0, 0]) + 256  # as uint8 it would read as the code beside it
    codes[:, : codes.shape[1] // 2] = wrapped
    wide = rewrite(cdl, tmp_path / "cdl16.tif", codes, dtype="uint16")
    report = align_labels(emb, wide, class_map, tmp_path / "labels16.tif")
    reference = align_labels(emb, cdl, class_map, tmp_path / "labels8.tif")
    assert str(wrapped) in report["unmapped_codes"]
    assert report["counts"]["cdl_unmapped"] > reference["counts"]["cdl_unmapped"]
    got, want = labels_of(tmp_path / "labels16.tif"), labels_of(tmp_path / "labels8.tif")
    changed = got != want
    assert changed.any() and (got[changed] == IGNORE).all()  # never another class


def test_an_untagged_aef_raster_treats_minus_128_as_nodata(
    tiny_demo: TinyDemo, class_map: ClassMap, tmp_path: Path
) -> None:
    emb, cdl = tiny_demo.rasters["demo_a"]["aef"], tiny_demo.rasters["demo_a"]["cdl"]
    with rasterio.open(emb) as src:
        data = src.read()
    data[:, 10:20, 10:30] = AEF_NODATA
    tagged = rewrite(emb, tmp_path / "tagged.tif", data, nodata=AEF_NODATA)
    untagged = rewrite(emb, tmp_path / "untagged.tif", data, nodata=None)
    a = align_labels(tagged, cdl, class_map, tmp_path / "a.tif")
    b = align_labels(untagged, cdl, class_map, tmp_path / "b.tif")
    assert b["counts"]["emb_nodata"] >= 200 and a["counts"] == b["counts"]
    assert np.array_equal(labels_of(tmp_path / "a.tif"), labels_of(tmp_path / "b.tif"))
    with rasterio.open(untagged) as src:
        assert fill_value(src) == AEF_NODATA
    json.dumps(b)  # the sidecar stays plain JSON


def test_an_aef_raster_tagged_with_another_nodata_value_stores_it_as_minus_128() -> None:
    block = np.arange(1, 65, dtype=np.int8).reshape(64, 1, 1).repeat(3, axis=2)
    block[:, 0, 1] = 0  # every band 0 at pixel (0, 1): the file's nodata
    block[5, 0, 0] = 0  # one band 0 at pixel (0, 0): nodata too (any band)
    stored = shard_arrays("aef", block.copy(), 0)["emb"]
    assert (stored[:, 0, :2] == AEF_NODATA).all()
    assert np.array_equal(stored[:, 0, 2], block[:, 0, 2])  # a valid pixel keeps its values
    untagged = shard_arrays("aef", block.copy(), None)["emb"]
    assert np.array_equal(untagged[:, 0, ::2], block[:, 0, ::2])  # one band 0 is a value
    assert (untagged[:, 0, 1] == AEF_NODATA).all()  # every band 0 is nodata, tagged or not
