"""Intervals from spatial blocks: a bootstrap over the unit the test split was drawn by.

Tiles of one spatial block are not independent (neighbouring fields, one acquisition), so the
test figures are resampled by block: draw blocks with replacement, sum their integer confusion
matrices, recompute the figures from the sum (the definitions of :mod:`emb.metrics`). The model
never runs again, and one matrix product gives every resample at once.

Intervals are percentile intervals. BCa needs a jackknife acceleration over blocks, which is
unstable exactly where intervals matter most (a handful of blocks); the percentile interval is
the same procedure for a figure and for a paired difference, and its coverage is measured by
``tests/evaluation/test_bootstrap.py`` rather than assumed.

Below ``MIN_BLOCKS`` blocks no interval and no verdict is given at all (the bounds are None,
``null`` in JSON, empty in CSV): a bootstrap can only recombine the blocks it has, and with few
of them its spread is far narrower than the truth's. Measured on a simulated population
(``tests/evaluation/test_intervals_threshold.py``), a nominal 95% interval covers the true
figure in 48% of 2-block test splits, 80% with 4, 88% with 8 and 91% with 10. This module is
the one place that decides it (:func:`enough_blocks`, :func:`too_few_blocks`): evaluate's
``metrics.json``, ``summary.csv`` and ``pairs.csv`` all ask it.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

MIN_BLOCKS = 10
HEADLINE = ("oa", "miou", "f1")
DIGITS = 3  # figures, bounds and differences are reported to 3 decimals
DISTINGUISHABLE = "distinguishable"
NOT_DISTINGUISHABLE = "not distinguishable"
NO_VERDICT = "no verdict"


class BootstrapError(ValueError):
    """Bootstrap settings that cannot give an interval (resamples < 1, a level outside (0, 1))."""


@dataclass(frozen=True)
class BootstrapSettings:
    """What provenance records: resamples, seed, confidence level, the reliability floor."""

    resamples: int = 1000
    seed: int = 0
    level: float = 0.95
    min_blocks: int = MIN_BLOCKS
    method: str = "percentile"

    def __post_init__(self) -> None:
        checks = (
            ("resamples", self.resamples >= 1, "an integer >= 1"),
            ("seed", self.seed >= 0, "an integer >= 0"),
            ("level", 0 < self.level < 1, "a confidence level between 0 and 1, e.g. 0.95"),
            ("min_blocks", self.min_blocks >= 2, "an integer >= 2"),
        )
        for name, ok, expected in checks:
            if not ok:
                found = getattr(self, name)
                raise BootstrapError(f"bootstrap {name}: expected {expected}, found {found!r}")

    def record(self) -> dict:
        return asdict(self)


def enough_blocks(n_blocks: int, settings: BootstrapSettings | None = None) -> bool:
    """Whether ``n_blocks`` spatial blocks support an interval and a verdict (the one rule)."""
    return n_blocks >= (settings or BootstrapSettings()).min_blocks


FEW_BLOCKS_WHY = (
    "a bootstrap over so few blocks can only recombine them, so its interval is far narrower "
    "than the real uncertainty (a nominal 95% interval covered the truth in 80% of simulated "
    "4-block test splits and 91% of 10-block ones)"
)


def too_few_blocks(
    n_blocks: int, settings: BootstrapSettings | None = None, what: str = "test blocks"
) -> str | None:
    """Why ``n_blocks`` give no interval and no verdict, in words; None when they are enough."""
    s = settings or BootstrapSettings()
    if enough_blocks(n_blocks, s):
        return None
    return (
        f"only {n_blocks} {what} (fewer than {s.min_blocks}): no interval and no verdict, "
        f"because {FEW_BLOCKS_WHY}"
    )


def support_record(n_blocks: int, settings: BootstrapSettings | None = None) -> dict:
    """metrics.json ``bootstrap``: the settings, the blocks, whether they are enough, and why."""
    s = settings or BootstrapSettings()
    why = too_few_blocks(n_blocks, s)
    return {
        **s.record(),
        "unit": "spatial block (meta.json 'block'; the tile where a sample has none)",
        "blocks": n_blocks,
        "reliable": why is None,
        "note": why or f"{n_blocks} test blocks: {s.level:.0%} intervals resample blocks",
    }


def distinguishable(lo: float | None, hi: float | None) -> bool | None:
    """Whether an interval of a difference excludes 0 as reported (to ``DIGITS`` decimals);
    None without an interval. An interval that touches 0, even by rounding, does not."""
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    return round(lo, DIGITS) > 0 or round(hi, DIGITS) < 0


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
    class absent from every resample's reference has NaN bounds. Below the block floor
    (:func:`enough_blocks`) every bound is None: there is no interval.
    """
    s = settings or BootstrapSettings()
    block_cms = np.asarray(block_cms)
    n_blocks = len(block_cms)
    out: dict = {"blocks": n_blocks, "reliable": enough_blocks(n_blocks, s)}
    if not out["reliable"]:
        n = block_cms.shape[-1]
        for name in (*HEADLINE, "iou"):
            bound = [None] * n if name == "iou" else None
            out[f"{name}_lo"], out[f"{name}_hi"] = bound, bound
        return out
    counts = resample_counts(n_blocks, s.resamples, s.seed)
    figs = stacked_figures(_resampled(block_cms, counts))
    for name, values in figs.items():
        out[f"{name}_lo"], out[f"{name}_hi"] = _bounds(values, s.level)
    return out


def paired_difference(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], settings: BootstrapSettings | None = None
) -> dict | None:
    """b - a of each headline figure over the blocks both runs were scored on, one draw of
    blocks for both ({block id: (n, n) matrix} each). None when they share no block; the
    bounds are None below the block floor (the difference itself is still given)."""
    s = settings or BootstrapSettings()
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    ca = np.stack([a[k] for k in shared])
    cb = np.stack([b[k] for k in shared])
    pa, pb = stacked_figures(ca.sum(0)[None]), stacked_figures(cb.sum(0)[None])
    out: dict = {"blocks": len(shared), "reliable": enough_blocks(len(shared), s)}
    if out["reliable"]:
        counts = resample_counts(len(shared), s.resamples, s.seed)
        fa, fb = stacked_figures(_resampled(ca, counts)), stacked_figures(_resampled(cb, counts))
    for name in HEADLINE:
        out[name] = float(pb[name][0] - pa[name][0])
        out[f"{name}_lo"] = out[f"{name}_hi"] = None
        if out["reliable"]:
            lo, hi = _bounds(fb[name] - fa[name], s.level)
            out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
    return out


def verdict_of(diff: dict, figure: str) -> str:
    """``distinguishable``, ``not distinguishable`` or ``no verdict`` (too few blocks)."""
    seen = distinguishable(diff[f"{figure}_lo"], diff[f"{figure}_hi"])
    if seen is None:
        return NO_VERDICT
    return DISTINGUISHABLE if seen else NOT_DISTINGUISHABLE


def verdict(label: str, figure: str, diff: dict, settings: BootstrapSettings | None = None) -> str:
    """One plain sentence: "TESSERA - AEF mIoU L3: -0.050 [-0.120, +0.020]: not
    distinguishable on this test split", or the difference alone and why there is no verdict."""
    d, lo, hi = diff[figure], diff[f"{figure}_lo"], diff[f"{figure}_hi"]
    word = verdict_of(diff, figure)
    if word == NO_VERDICT:
        why = too_few_blocks(diff["blocks"], settings, "shared test blocks") or "no interval"
        return f"{label}: {d:+.{DIGITS}f}: {why}"
    return (
        f"{label}: {d:+.{DIGITS}f} [{lo:+.{DIGITS}f}, {hi:+.{DIGITS}f}]: {word} on this test split"
    )


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
