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
