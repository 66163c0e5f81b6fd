"""Embedding-raster facts: band counts, nodata, (de-)quantization.

AEF GeoTIFFs are int8 with nodata -128 and de-quantize as ``sign(q) * (q / 127.5) ** 2``.
TESSERA GeoTIFF exports are float32 (non-finite = nodata); in shards they are stored as int8
with a per-pixel float32 scale, TESSERA's own quantization, so shards stay 4x smaller.
"""

from __future__ import annotations

import numpy as np

SOURCES = ("aef", "tessera")
BANDS = {"aef": 64, "tessera": 128}
AEF_NODATA = -128


def dequantize_aef(q: np.ndarray) -> np.ndarray:
    """(D, ...) int8 -> float32 unit vectors; nodata (-128) becomes 0."""
    x = q.astype(np.float32) / 127.5
    out = np.sign(x) * x * x
    out[q == AEF_NODATA] = 0.0
    return out


def quantize_aef(v: np.ndarray) -> np.ndarray:
    """Inverse of :func:`dequantize_aef` for float vectors in [-1, 1] -> int8 in [-127, 127]."""
    q = np.sign(v) * np.sqrt(np.abs(v)) * 127.5
    return np.clip(np.rint(q), -127, 127).astype(np.int8)


def quantize_tessera(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(D, H, W) float -> ((D, H, W) int8, (H, W) float32 scale); invalid pixels get scale 0."""
    valid = np.isfinite(x).all(axis=0)
    safe = np.where(valid[None], x, 0.0).astype(np.float32)
    scale = (np.abs(safe).max(axis=0) / 127.0).astype(np.float32)
    divisor = np.where(scale > 0, scale, 1.0)
    q = np.clip(np.rint(safe / divisor[None]), -127, 127).astype(np.int8)
    scale[~valid] = 0.0
    return q, scale


def dequantize_tessera(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(D, H, W) int8 and (H, W) or (D, H, W) float32 scale -> (D, H, W) float32."""
    s = scale if scale.ndim == q.ndim else scale[None]
    return q.astype(np.float32) * s


def nodata_mask(block: np.ndarray, nodata: float | None) -> np.ndarray:
    """(D, H, W) raster block -> (H, W) bool, True where any band is nodata or non-finite."""
    mask = np.zeros(block.shape[1:], bool)
    if nodata is not None and not np.isnan(nodata):
        mask |= (block == np.asarray(nodata, block.dtype)).any(axis=0)
    if np.issubdtype(block.dtype, np.floating):
        mask |= ~np.isfinite(block).all(axis=0)
    return mask


def shard_arrays(source: str, block: np.ndarray, nodata: float | None) -> dict[str, np.ndarray]:
    """The compact arrays a shard stores for one tile of ``source`` (see DESIGN.md section 5)."""
    if source == "aef":
        q = block.astype(np.int8, copy=False)
        return {"emb": np.ascontiguousarray(q)}
    data = block.astype(np.float32)
    data[:, nodata_mask(block, nodata)] = np.nan
    q, scale = quantize_tessera(data)
    return {"emb": q, "scale": scale}


def valid_pixels(source: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """(H, W) bool: pixels whose embedding is present, from a shard sample's arrays."""
    if source == "aef":
        return arrays["emb"][0] != AEF_NODATA
    return arrays["scale"] > 0 if arrays["scale"].ndim == 2 else arrays["scale"].max(0) > 0


def to_float(source: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """De-quantized (D, H, W) float32 embedding of a shard sample; invalid pixels are 0."""
    if source == "aef":
        return dequantize_aef(arrays["emb"])
    return dequantize_tessera(arrays["emb"], arrays["scale"])
