"""Embedding-raster facts: band counts, nodata, (de-)quantization, the products' value ranges.

AEF GeoTIFFs (the public COGs) are int8 with nodata -128 and de-quantize as
``sign(q) * (q / 127.5) ** 2``; Earth Engine exports of the same product are float32/float64,
already de-quantized (in [-1, 1]), and are quantized back on ingest (:func:`quantize_aef`, the
exact inverse). TESSERA GeoTIFF exports are float32 (non-finite = nodata); in shards they are
stored as int8 with a per-pixel float32 scale, TESSERA's own quantization, so shards stay 4x
smaller. For both sources an all-zero vector is nodata: Earth Engine masks to 0 and geotessera's
GeoTIFFs carry no nodata tag, so 0 is the only mark a masked pixel has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

# ``map`` or a thread pool's ``map``: how a block's row chunks are run.
ChunkMap = Callable[[Callable[[slice], None], Iterable[slice]], Iterable[None]]

SOURCES = ("aef", "tessera")
BANDS = {"aef": 64, "tessera": 128}
# What each regions-table column's raster holds. AEF comes as int8 (the public COGs) or as
# float (Earth Engine exports, de-quantized: quantized back on ingest, :func:`shard_arrays`).
DTYPES = {
    "aef": ("int8", "float32", "float64"),
    "tessera": ("float32", "float64"),
    "cdl": ("uint8", "uint16"),
}
AEF_NODATA = -128
# Beyond these a value is not the product's: AEF is unit-length (|x| <= 1, with float slack for
# an export's rounding); TESSERA's dequantized values stay within tens, and a broken tile's scale
# (a fault reported against the distribution) gives values near -1.6e5.
VALUE_LIMIT = {"aef": 1.0 + 1e-3, "tessera": 1e3}


# Tags that carry a product's year (geotessera writes TESSERA_YEAR).
YEAR_TAGS = ("TESSERA_YEAR", "AEF_YEAR", "YEAR")


def product_tags(tags: dict[str, str]) -> dict[str, str]:
    """A raster's own version and year tags: the provenance of what a model was trained on."""
    return {k: v for k, v in tags.items() if "VERSION" in k.upper() or k.upper() in YEAR_TAGS}


class EmbeddingValueError(ValueError):
    """Embedding values outside the product's range: a broken file, never a model input."""


def check_value_range(source: str, block: np.ndarray, valid: np.ndarray, name: str) -> None:
    """Raise naming ``name`` and the band when a valid pixel of a float ``block`` (D, H, W)
    lies beyond the product's range (:data:`VALUE_LIMIT`); int8 AEF is in range by design."""
    if not np.issubdtype(block.dtype, np.floating) or not valid.any():
        return
    limit = VALUE_LIMIT[source]
    peak = np.where(valid, np.abs(block), 0).max(axis=(1, 2))
    bad = np.flatnonzero(peak > limit)
    if bad.size:
        band = int(bad[0])
        raise EmbeddingValueError(
            f"{name}: band {band + 1} holds {source} values up to |x| = {float(peak[band]):.4g}, "
            f"expected |x| <= {limit:g} ({_RANGE_HINT[source]})"
        )


_RANGE_HINT = {
    "aef": "a float AEF holds the de-quantized values in [-1, 1], as Earth Engine exports "
    "them; int8 codes stored as float, or a rescaled export, are not: use the int8 COG",
    "tessera": "TESSERA values stay within tens; this looks like a tile with a broken scale: "
    "download it again or leave it out",
}


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
    return _quantize_tessera_inplace(np.array(x, np.float32))


def _quantize_tessera_inplace(
    x: np.ndarray, q: np.ndarray | None = None, map_chunks: ChunkMap = map
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_tessera` that overwrites the (D, H, W) float32 ``x`` (its scratch space),
    writing into ``q`` when given.

    Per pixel ``scale = max|x| / 127`` and ``q = rint(x * 127 / max|x|)``; a pixel with a
    non-finite band (the max/min reductions propagate it) gets scale 0 and q 0. The block is
    done in row chunks of about 4 MB, so that each chunk stays in cache across the five
    passes; ``map_chunks`` may run them in threads (numpy's loops release the GIL).
    """
    q = np.empty(x.shape, np.int8) if q is None else q
    scale = np.empty(x.shape[1:], np.float32)
    rows = max(1, (4 << 20) // max(x.shape[0] * x.shape[2] * x.itemsize, 1))
    chunks = [slice(r, r + rows) for r in range(0, x.shape[1], rows)]
    for _ in map_chunks(lambda c: _quantize_rows(x[:, c], q[:, c], scale[c]), chunks):
        pass
    return q, scale


def _quantize_rows(x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> None:
    amax = np.maximum(x.max(axis=0), -x.min(axis=0))
    valid = np.isfinite(amax)
    scale[...] = np.where(valid, amax / np.float32(127.0), np.float32(0.0))
    inv = np.zeros_like(amax)
    np.divide(np.float32(127.0), amax, out=inv, where=valid & (amax > 0))
    if not valid.all():
        x[:, ~valid] = 0.0
    np.multiply(x, inv, out=x)
    np.rint(x, out=q, casting="unsafe")


def dequantize_tessera(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(D, H, W) int8 and (H, W) or (D, H, W) float32 scale -> (D, H, W) float32."""
    s = scale if scale.ndim == q.ndim else scale[None]
    return q.astype(np.float32) * s


def embedding_nodata(dtype: str | np.dtype, declared: float | None) -> float | None:
    """The nodata value of an embedding raster: the file's tag, else -128 for int8 (AEF's
    convention, which exports do not always tag); float rasters use NaN/Inf (and, as every
    embedding raster, all-zero vectors: :func:`nodata_mask`)."""
    if declared is not None:
        return declared
    return AEF_NODATA if np.dtype(dtype) == np.int8 else None


def nodata_mask(block: np.ndarray, nodata: float | None) -> np.ndarray:
    """(D, H, W) raster block -> (H, W) bool, True where any band is nodata or non-finite, or
    where every band is 0 (the products' masked pixels: see the module docstring)."""
    mask = ~block.any(axis=0)
    if nodata is not None and not np.isnan(nodata):
        mask |= declared_nodata(block, nodata)
    if np.issubdtype(block.dtype, np.floating):
        mask |= ~np.isfinite(block).all(axis=0)
    return mask


def declared_nodata(block: np.ndarray, nodata: float) -> np.ndarray:
    """(H, W) pixels holding the file's declared nodata value: in any band for integer
    rasters (AEF's -128 lies outside its codes), in every band for float ones, where a value
    such as 0 is also a valid embedding component (a warp tagged -dstnodata 0)."""
    hit = block == np.asarray(nodata, block.dtype)
    return hit.all(axis=0) if np.issubdtype(block.dtype, np.floating) else hit.any(axis=0)


def shard_arrays(
    source: str, block: np.ndarray, nodata: float | None,
    q: np.ndarray | None = None, map_chunks: ChunkMap = map, name: str = "embedding raster",
) -> dict[str, np.ndarray]:  # fmt: skip
    """The compact arrays a shard stores for one tile of ``source`` (see docs/design.md, "Shards").

    ``block`` is the tile as read; TESSERA's float block is used as scratch space, ``q`` (when
    given) receives its int8 values and ``map_chunks`` runs its row chunks. Every nodata pixel
    (:func:`nodata_mask`) leaves as the shard's own mark: AEF -128, TESSERA scale 0. Values
    beyond the product's range raise :class:`EmbeddingValueError` (naming ``name``).
    """
    if source == "aef":
        missing = nodata_mask(block, nodata)
        if np.issubdtype(block.dtype, np.floating):  # an Earth Engine export: quantize back
            check_value_range(source, block, ~missing, name)
            q = quantize_aef(np.where(missing, 0, block))
        elif missing.any() or block.dtype != np.int8:
            q = np.array(block, np.int8)
        else:
            q = block
        if missing.any():
            q[:, missing] = AEF_NODATA
        return {"emb": np.ascontiguousarray(q)}
    # TESSERA: non-finite and all-zero pixels get scale 0 in the quantization itself (max|x| is
    # NaN or 0 there), so only a declared nodata value needs a pass of its own.
    data = block.astype(np.float32, copy=False)
    if nodata is not None and not np.isnan(nodata):
        data[:, declared_nodata(block, nodata)] = np.nan
    q, scale = _quantize_tessera_inplace(data, q, map_chunks)
    _check_tessera_scale(scale, name)
    return {"emb": q, "scale": scale}


def _check_tessera_scale(scale: np.ndarray, name: str) -> None:
    """TESSERA's range check from the per-pixel scale (``max|x| / 127``), which the
    quantization computes anyway: no extra pass over the float block."""
    peak = float(scale.max(initial=0.0)) * 127.0
    if peak > VALUE_LIMIT["tessera"]:
        row, col = np.unravel_index(int(np.argmax(scale)), scale.shape)
        raise EmbeddingValueError(
            f"{name}: holds tessera values up to |x| = {peak:.4g} (at tile pixel row {row}, "
            f"column {col}), expected |x| <= {VALUE_LIMIT['tessera']:g} "
            f"({_RANGE_HINT['tessera']})"
        )


def valid_pixels(source: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """(H, W) bool: pixels whose embedding is present, from a shard sample's arrays."""
    if source == "aef":
        return arrays["emb"][0] != AEF_NODATA
    return arrays["scale"] > 0 if arrays["scale"].ndim == 2 else arrays["scale"].max(0) > 0
