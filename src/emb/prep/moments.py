"""Per-channel moments of a tile's valid pixels: computed once by the shard build, merged by
the statistics stage instead of re-reading every tile.

A tile's moments are a (3, D) float64 array (``{key}.moments.npy`` in a shard): row 0 the
count of valid pixels (the same in every channel), row 1 their mean, row 2 M2, their sum of
squares shifted by that mean, ``sum((x - mean)**2)``. Shifting by the tile's own mean keeps
the sum of squares from cancelling however large the mean, and tiles merge exactly
(:func:`merge_moments`). Values are the de-quantized ones the loader makes (AEF
``sign(q) * (q / 127.5)**2``, TESSERA ``q * scale``), of valid pixels only. numpy only: the
shard build does not import torch.
"""

from __future__ import annotations

import numpy as np

from emb.rasters import AEF_NODATA, valid_pixels

CHUNK = 2048  # pixels converted to float64 at a time: 2 MB at 128 channels, stays in cache
AEF_STEP = 127.5**2  # x = sign(q) q**2 / AEF_STEP
AEF_EXACT_PIXELS = 2**53 // 127**4  # sum(q**4) stays an exact float64 integer (5800 px square)
# A tile's unshifted float64 sums are kept only where (sum of squares) / M2 <= this, i.e.
# mean**2 / var < 1e4: their relative error (at most pixels * 2**-53, 7e-12 for a 256-px
# tile) then grows to at most 1.5e-7 in M2. A channel nearly constant within the tile (the
# large-mean test) takes the shifted path instead.
MAX_CANCELLATION = 1e4


def stores_moments(source: str) -> bool:
    """Whether the shard build stores the moments of ``source``'s training tiles: float sources
    (TESSERA) do. AEF does not: its exact sums cost as much as the build's read of its compact
    int8 tiles (bench/data.py), so its statistics read the tiles, as they did before."""
    return source != "aef"


def tile_moments(source: str, sample: dict[str, np.ndarray]) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, mean, M2) per channel of one shard sample's valid pixels, in float64.

    AEF sums are exact (integers in float64); TESSERA tiles with a per-pixel scale take two
    matrix-vector products (``Q @ s`` and ``(Q * Q) @ s**2``; pixels without data have scale
    0 and drop out by themselves), and shifted sums where those would cancel or where the
    scale is per channel.
    """
    if source == "aef":
        return _aef_moments(sample["emb"])
    scale = sample["scale"]
    if scale.ndim == 2:
        fast = _matvec_moments(sample["emb"], scale)
        if fast is not None:
            return fast
    return _shifted_moments(source, sample)


def moments_array(n: int, mean: np.ndarray, m2: np.ndarray) -> np.ndarray:
    """The (3, D) float64 array a shard stores for one tile."""
    return np.stack([np.full(mean.shape, float(n)), mean, np.maximum(m2, 0.0)])


def merge_moments(parts: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, mean, M2) of the union of the tiles whose (N, 3, D) moments are ``parts``.

    ``mean = sum(n_i mean_i) / n`` and ``M2 = sum(M2_i) + sum(n_i (mean_i - mean)**2)``: every
    term of M2 is non-negative, so nothing cancels (Chan et al.'s update, all tiles at once).
    """
    counts = parts[:, 0]
    n = counts.sum(axis=0)
    total = int(n.max()) if n.size else 0
    mean = (counts * parts[:, 1]).sum(axis=0) / np.maximum(n, 1)
    m2 = parts[:, 2].sum(axis=0) + (counts * (parts[:, 1] - mean) ** 2).sum(axis=0)
    return total, mean, m2


def check_moments(parts: np.ndarray, pixels: np.ndarray) -> tuple[int, str] | None:
    """The first of the tiles' stored (N, 3, D) moments that cannot be those of a tile of
    ``pixels`` (N,) pixels, and why; None when all can: counts equal across channels, whole
    and within the tile; finite means and M2, M2 >= 0; an empty tile all zeros. All tiles
    at once: the stats stage checks every tile it merges, up to tens of thousands."""
    counts, mean, m2 = parts[:, 0], parts[:, 1], parts[:, 2]
    n = counts[:, 0]
    whole = (counts == n[:, None]).all(axis=1) & (n == np.floor(n)) & (n >= 0) & (n <= pixels)
    finite = np.isfinite(mean).all(axis=1) & np.isfinite(m2).all(axis=1) & (m2 >= 0).all(axis=1)
    empty_ok = (n > 0) | ~(mean.any(axis=1) | m2.any(axis=1))
    for i in np.flatnonzero(~(whole & finite & empty_ok))[:1]:
        if not whole[i]:
            limit = f"0..{pixels[i]:.0f}"
            why = f"pixel counts {_some(counts[i])}, expected one whole number in {limit}"
        elif not finite[i]:
            why = f"means {_some(mean[i])} and M2 {_some(m2[i])}, expected finite, M2 >= 0"
        else:
            why = f"no valid pixel but means {_some(mean[i])}, M2 {_some(m2[i])}, expected 0"
        return int(i), why
    return None


def _some(values: np.ndarray) -> str:
    return np.array2string(values[:4], precision=6) + (" ..." if values.size > 4 else "")


def _aef_moments(emb: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Exact: ``sum(sign(q) q**2)`` and ``sum(q**4)`` are integers below 2**53 in float64,
    whatever the order they are added in; M2 comes from them in integer arithmetic, so the
    only roundings are the final divisions."""
    q = emb.reshape(emb.shape[0], -1)
    valid = q[0] != AEF_NODATA
    if not valid.all():
        q = q[:, valid]
    dim, n = q.shape
    if n == 0:
        return 0, np.zeros(dim), np.zeros(dim)
    if n > AEF_EXACT_PIXELS:
        raise ValueError(f"an AEF tile of {n} pixels: exact sums need <= {AEF_EXACT_PIXELS}")
    s1, s2 = np.zeros(dim), np.zeros(dim)
    buf, mag = np.empty((dim, min(CHUNK, n))), np.empty((dim, min(CHUNK, n)))
    ones = np.ones(min(CHUNK, n))
    for start in range(0, n, CHUNK):
        width = min(CHUNK, n - start)
        x, a = buf[:, :width], mag[:, :width]
        np.copyto(x, q[:, start : start + width], casting="unsafe")
        np.abs(x, out=a)
        np.multiply(x, a, out=x)  # sign(q) q**2
        s1 += x @ ones[:width]
        np.square(x, out=x)  # q**4
        s2 += x @ ones[:width]
    m2 = [(n * int(b) - int(a) ** 2) / n for a, b in zip(s1, s2, strict=True)]
    return n, s1 / n / AEF_STEP, np.array(m2) / AEF_STEP**2


def _matvec_moments(
    emb: np.ndarray, scale: np.ndarray
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """Unshifted float64 sums of ``emb * scale`` and its square, or None where they cancel.

    Products of int8 codes and float32 scales are exact in float64. Pixels are converted
    ``CHUNK`` at a time into a float64 buffer small enough to stay in cache.
    """
    q = emb.reshape(emb.shape[0], -1)
    s = scale.reshape(-1).astype(np.float64)
    n = int(np.count_nonzero(s > 0))
    dim, pixels = q.shape
    if n == 0:
        return 0, np.zeros(dim), np.zeros(dim)
    w = s * s
    buf = np.empty((dim, min(CHUNK, pixels)))
    s1, s2 = np.zeros(dim), np.zeros(dim)
    for start in range(0, pixels, CHUNK):
        x = buf[:, : min(CHUNK, pixels - start)]
        np.copyto(x, q[:, start : start + CHUNK], casting="unsafe")
        s1 += x @ s[start : start + CHUNK]
        np.square(x, out=x)
        s2 += x @ w[start : start + CHUNK]
    mean = s1 / n
    m2 = s2 - s1 * mean
    if not bool((m2 * MAX_CANCELLATION >= s2).all()):
        return None
    return n, mean, m2


def _shifted_moments(
    source: str, sample: dict[str, np.ndarray]
) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, mean, M2) from sums shifted by the first chunk's mean, so squares do not cancel."""
    dim = sample["emb"].shape[0]
    valid = valid_pixels(source, sample).reshape(-1)
    q = sample["emb"].reshape(dim, -1)[:, valid]
    scale = sample["scale"].astype(np.float64)
    s = scale.reshape(-1)[valid] if scale.ndim == 2 else scale.reshape(dim, -1)[:, valid]
    n = q.shape[1]
    if n == 0:
        return 0, np.zeros(dim), np.zeros(dim)
    s1, s2 = np.zeros(dim), np.zeros(dim)
    shift: np.ndarray | None = None
    for start in range(0, n, CHUNK):
        x = q[:, start : start + CHUNK] * s[..., start : start + CHUNK]
        if shift is None:
            shift = x.mean(axis=1, keepdims=True)
        x -= shift
        s1 += x.sum(axis=1)
        s2 += np.square(x, out=x).sum(axis=1)
    assert shift is not None
    return n, shift[:, 0] + s1 / n, s2 - s1 * s1 / n
