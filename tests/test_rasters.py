"""Rasters: de-quantization of AEF and TESSERA embeddings, and threaded quantization."""

from __future__ import annotations

import numpy as np
import rasterio
from conftest import TinyDemo

from emb.rasters import AEF_NODATA, dequantize_aef


def test_aef_dequantization_gives_unit_vectors(tiny_demo: TinyDemo) -> None:
    q = rasterio.open(tiny_demo.rasters["demo_a"]["aef"]).read()
    valid = q[0] != AEF_NODATA
    norms = np.linalg.norm(dequantize_aef(q)[:, valid], axis=0)
    assert valid.mean() > 0.8
    assert norms.min() > 0.98 and norms.max() < 1.02


def test_aef_nodata_dequantizes_to_zero() -> None:
    q = np.full((64, 2, 2), AEF_NODATA, np.int8)
    assert not dequantize_aef(q).any()


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


def test_an_earth_engine_aef_export_quantizes_back_within_one_int8_step() -> None:
    """EE's float AEF is the de-quantized int8: quantizing it gives the int8 back exactly, and
    any float in [-1, 1] round-trips within one quantization step."""
    from emb.rasters import quantize_aef, shard_arrays

    codes = np.arange(-127, 128).reshape(1, 15, 17)
    # every code in every band, no pixel all 0 (that is nodata: the next test)
    q = ((codes + 127 + np.arange(64)[:, None, None]) % 255 - 127).astype(np.int8)
    # the export, from the AEF documentation's de-quantization, not the package's own
    published = (q.astype(np.float64) / 127.5) ** 2 * np.sign(q)
    # hand-checked: 127 -> (127/127.5)^2 = 0.992172..., -64 -> -0.251965..., 1 -> 1/127.5^2
    for code, value in ((127, 0.99217224), (-64, -0.25196463), (1, 6.151e-05), (0, 0.0)):
        assert np.allclose(published[q == code], value, rtol=1e-4, atol=1e-9), code
    assert np.allclose(dequantize_aef(q), published, rtol=0, atol=1e-6)
    for dtype in (np.float32, np.float64):
        assert np.array_equal(quantize_aef(published.astype(dtype)), q)
    v = np.random.default_rng(0).uniform(-1, 1, (64, 40, 40))
    step = 2 * 127 / 127.5**2  # the widest step, between codes 126 and 127
    assert np.abs(dequantize_aef(quantize_aef(v)) - v).max() <= step
    block = published.astype(np.float32)
    block[:, 0, :3] = 0.0  # masked by Earth Engine: every band 0
    block[:, 1, 0] = np.nan
    stored = shard_arrays("aef", block, None)["emb"]
    assert (stored[:, 0, :3] == AEF_NODATA).all() and (stored[:, 1, 0] == AEF_NODATA).all()
    assert np.array_equal(stored[:, 2:], q[:, 2:])


def test_all_zero_vectors_are_nodata_for_both_sources() -> None:
    from emb.rasters import nodata_mask, shard_arrays, valid_pixels

    rng = np.random.default_rng(1)
    blocks = {"aef": rng.integers(-127, 128, (64, 4, 4)).astype(np.int8),
              "tessera": rng.normal(0, 3, (128, 4, 4)).astype(np.float32)}  # fmt: skip
    for source, block in blocks.items():
        block[:, 1, 2] = 0
        block[3, 0, 0] = 0  # one band 0 is a value
        assert nodata_mask(block, None).sum() == 1 and nodata_mask(block, None)[1, 2]
        valid = valid_pixels(source, shard_arrays(source, block.copy(), None))
        assert not valid[1, 2] and valid.sum() == 15, source


def test_values_beyond_a_products_range_are_named_with_file_and_band() -> None:
    import pytest

    from emb.rasters import EmbeddingValueError, shard_arrays

    aef = np.full((64, 4, 4), 0.5, np.float32)
    aef[7, 2, 2] = 1.5
    with pytest.raises(EmbeddingValueError, match=r"x\.tif: band 8 holds aef values up to"):
        shard_arrays("aef", aef, None, name="x.tif")
    tessera = np.full((128, 4, 4), 2.0, np.float32)
    tessera[:, 3, 1] = -1.6e5  # the broken scale reported against the distribution
    with pytest.raises(EmbeddingValueError, match=r"t\.tif: holds tessera values up to"):
        shard_arrays("tessera", tessera, None, name="t.tif")
    shard_arrays("tessera", np.full((128, 4, 4), 50.0, np.float32), None)  # within range


def test_a_declared_float_nodata_marks_a_pixel_only_where_every_band_holds_it() -> None:
    """A TESSERA warp tagged -dstnodata 0: single 0.0 components are values (an int8 0 times
    its scale), only all-0 pixels are nodata; AEF's int8 -128 marks a pixel in any band."""
    from emb.rasters import nodata_mask, shard_arrays, valid_pixels

    block = np.random.default_rng(2).normal(0, 3, (128, 4, 4)).astype(np.float32)
    block[:40, 0, 0] = 0.0  # a valid pixel with some zero components
    block[:, 3, 3] = 0.0
    assert nodata_mask(block, 0.0).sum() == 1 and nodata_mask(block, 0.0)[3, 3]
    valid = valid_pixels("tessera", shard_arrays("tessera", block.copy(), 0.0))
    assert valid[0, 0] and not valid[3, 3] and valid.sum() == 15
    aef = np.ones((64, 2, 2), np.int8)
    aef[5, 1, 1] = -128
    assert nodata_mask(aef, -128).tolist() == [[False, False], [False, True]]
