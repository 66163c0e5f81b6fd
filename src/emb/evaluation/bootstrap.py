"""Intervals from spatial blocks: a bootstrap over the unit the test split was drawn by.

Tiles of one spatial block are not independent (neighbouring fields, one acquisition), so the
test figures are resampled by block: draw blocks with replacement, sum their integer confusion
matrices, recompute the figures from the sum (the definitions of :mod:`emb.metrics`). The model
never runs again, and one matrix product gives every resample at once.

Intervals are percentile intervals. BCa needs a jackknife acceleration over blocks, which is
unstable exactly where intervals matter most (a handful of blocks); the percentile interval is
the same procedure for a figure and for a paired difference, and its coverage is measured by
``tests/evaluation/test_bootstrap.py`` rather than assumed.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

MIN_BLOCKS = 10
HEADLINE = ("oa", "miou", "f1")


@dataclass(frozen=True)
class BootstrapSettings:
    """What provenance records: resamples, seed, confidence level, the reliability floor."""

    resamples: int = 1000
    seed: int = 0
    level: float = 0.95
    min_blocks: int = MIN_BLOCKS
    method: str = "percentile"

    def record(self) -> dict:
        return asdict(self)


def resample_counts(n_blocks: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n_blocks) float64: how often each block is drawn in each resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_blocks, np.full(n_blocks, 1.0 / n_blocks), size=resamples).astype(
        np.float64
    )


def stacked_figures(cms: np.ndarray) -> dict[str, np.ndarray]:
    """OA, mIoU, macro F1 (R,) and per-class IoU (R, n) of a stack of matrices (R, n, n).

    Same definitions as :func:`emb.metrics.scores_from_confusion`: macro averages over the
    classes present in each matrix's reference.
    """
    cms = np.asarray(cms, dtype=np.float64)
    tp = np.diagonal(cms, axis1=1, axis2=2)
    support, predicted = cms.sum(2), cms.sum(1)
    fp, fn = predicted - tp, support - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = tp / (tp + fp + fn)
        f1 = 2 * tp / (2 * tp + fp + fn)
        present = support > 0
        n_present = present.sum(1)
        total = cms.sum((1, 2))
        return {
            "oa": tp.sum(1) / total,
            "miou": np.where(present, iou, 0.0).sum(1) / n_present,
            "f1": np.where(present, f1, 0.0).sum(1) / n_present,
            "iou": np.where(present, iou, np.nan),
        }


def _resampled(block_cms: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(R, n, n): each resample's matrix, the count-weighted sum of the block matrices."""
    b, n, _ = block_cms.shape
    return (counts @ block_cms.reshape(b, n * n).astype(np.float64)).reshape(-1, n, n)


def _bounds(values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    tail = 100 * (1 - level) / 2
    with warnings.catch_warnings():  # a class absent from every resample: NaN bounds
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(values, [tail, 100 - tail], axis=0)
    return lo, hi


def block_intervals(block_cms: np.ndarray, settings: BootstrapSettings | None = None) -> dict:
    """Intervals of every figure of one level from its per-block matrices (B, n, n).

    Returns {"blocks", "reliable", "oa_lo", "oa_hi", ..., "iou_lo" (n,), "iou_hi" (n,)}; a
    class absent from every resample's reference has NaN bounds.
    """
    s = settings or BootstrapSettings()
    block_cms = np.asarray(block_cms)
    counts = resample_counts(len(block_cms), s.resamples, s.seed)
    figs = stacked_figures(_resampled(block_cms, counts))
    out: dict = {"blocks": len(block_cms), "reliable": len(block_cms) >= s.min_blocks}
    for name, values in figs.items():
        out[f"{name}_lo"], out[f"{name}_hi"] = _bounds(values, s.level)
    return out


def paired_difference(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], settings: BootstrapSettings | None = None
) -> dict | None:
    """b - a of each headline figure over the blocks both runs were scored on, one draw of
    blocks for both ({block id: (n, n) matrix} each). None when they share no block."""
    s = settings or BootstrapSettings()
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    ca = np.stack([a[k] for k in shared])
    cb = np.stack([b[k] for k in shared])
    counts = resample_counts(len(shared), s.resamples, s.seed)
    fa, fb = stacked_figures(_resampled(ca, counts)), stacked_figures(_resampled(cb, counts))
    pa, pb = stacked_figures(ca.sum(0)[None]), stacked_figures(cb.sum(0)[None])
    out: dict = {"blocks": len(shared), "reliable": len(shared) >= s.min_blocks}
    for name in HEADLINE:
        lo, hi = _bounds(fb[name] - fa[name], s.level)
        out[name] = float(pb[name][0] - pa[name][0])
        out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
    return out


def verdict(label: str, figure: str, diff: dict) -> str:
    """One plain sentence: "TESSERA - AEF mIoU L3: -0.05 [-0.12, +0.02]: not distinguishable
    on this test split"."""
    d, lo, hi = diff[figure], diff[f"{figure}_lo"], diff[f"{figure}_hi"]
    if lo > 0 or hi < 0:
        words = "distinguishable on this test split"
    else:
        words = "not distinguishable on this test split"
    if not diff["reliable"]:
        words += f" (only {diff['blocks']} shared blocks: the interval is unreliable)"
    return f"{label}: {d:+.2f} [{lo:+.2f}, {hi:+.2f}]: {words}"


def tile_blocks(shards: list[str]) -> dict[str, str]:
    """{sample key: block id} from each sample's ``meta.json`` ``block`` field; a sample
    without one is its own block (older shards: the tile is the unit)."""
    import json
    import tarfile

    blocks: dict[str, str] = {}
    for url in shards:
        with tarfile.open(url) as tar:
            for info in tar:
                if not info.name.endswith(".meta.json"):
                    continue
                key = info.name[: -len(".meta.json")]
                fh = tar.extractfile(info)
                meta = json.loads(fh.read()) if fh is not None else {}
                block = meta.get("block")
                blocks[key] = str(block) if block not in (None, "") else key
    return blocks
