"""Each class's area, with a standard error, from a stratified random sample of reference labels.

A map's pixel count of a class is a biased estimate of its area: omission and commission errors
need not cancel. The "good practice" estimator counts the area from the reference labels of a
probability sample instead, weighted by the sampling design, and gives each figure a standard
error:

- :func:`olofsson`: the strata are the map's classes; the input is the error matrix of sample
  counts. Olofsson, Foody, Herold, Stehman, Woodcock, Wulder 2014, "Good practices for
  estimating area and assessing accuracy of land change", Remote Sensing of Environment
  148:42-57 (and Olofsson et al. 2013, RSE 129:122-131), with
  W_i = N_i / N, p_ij = W_i n_ij / n_i.:

  - area proportion p_.j = sum_i W_i n_ij / n_i.,
    V = sum_i W_i^2 (n_ij / n_i.)(1 - n_ij / n_i.) / (n_i. - 1);
  - user's accuracy U_i = n_ii / n_i., V = U_i (1 - U_i) / (n_i. - 1);
  - producer's accuracy P_j = p_jj / p_.j, V = (1 / N_.j^2) [N_j.^2 (1 - P_j)^2 U_j (1 - U_j)
    / (n_j. - 1) + P_j^2 sum_{i != j} N_i.^2 (n_ij / n_i.)(1 - n_ij / n_i.) / (n_i. - 1)],
    N_.j = sum_i N_i. n_ij / n_i. (the estimated pixels of class j);
  - overall accuracy O = sum_j p_jj, V = sum_i W_i^2 U_i (1 - U_i) / (n_i. - 1).

- :func:`stehman`: the strata differ from the map's classes (a sample stratified by another
  map, by finer classes than those assessed, or one stratum: a simple random sample). Stehman
  2014, "Estimating area and map accuracy for stratified random sampling when the strata are
  different from the map classes", Int. J. Remote Sensing 35:4923-4939: an indicator y_u (and
  x_u) per sample unit, totals Y = sum_h N_h ybar_h, proportions Y / N with
  V = sum_h N_h^2 s2_yh / n_h / N^2, ratios R = Y / X with V = (1 / X^2) sum_h N_h^2
  (s2_yh + R^2 s2_xh - 2 R s_xyh) / n_h (computed as the within-stratum variance of
  d_u = y_u - R x_u, the same sum). Area of class k: y = [reference = k]; overall:
  y = [map = reference]; user's: y = [map = reference = k], x = [map = k]; producer's:
  y = [map = reference = k], x = [reference = k]. As y and x are indicators of a unit's (map,
  reference) class, every sum follows from the units per stratum and class
  (:func:`strata_counts`, which the intervals take too), no per-unit rows: a stratum's squared
  deviations are summed over its pairs of units that differ, exactly 0 where its units agree.

Both return :class:`AreaEstimates`; where the strata are the map's classes the two agree to
float precision (``tests/estimation/test_estimators.py``). :func:`olofsson_shares` and
:func:`stehman_shares` give the area shares of many samples at once (the draws of the test
split's check, ``emb.estimation.holdout_check``), each sample's bit for bit as its estimates'.

No finite-population correction, as in the papers (they assume n_h << N_h), with one departure:
a stratum sampled whole (n_h = N_h, a census, e.g. a class of 3 pixels in a small test area) is
known exactly and contributes no variance (its factor 1 - n_h / N_h is 0).

What the sample cannot give is said, never guessed:

- a stratum with pixels and no sample unit biases every estimate: :class:`AreaEstimateError`;
- a stratum with 1 unit (and more than 1 pixel) has no variance estimate: every standard error
  it enters is None, with ``why`` naming it (area and overall SEs draw on every stratum,
  producer's on every stratum, a user's accuracy under :func:`olofsson` on its own stratum
  only, under :func:`stehman` on every stratum that may hold pixels mapped as the class: all
  of them, unless ``strata_mapped_px`` says which);
- a user's accuracy with no unit mapped as the class, or a producer's accuracy of a class with
  estimated area 0, is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emb.estimation import intervals
from emb.estimation.intervals import Bounds
from emb.estimation.intervals import z_of as z_of  # the level's quantile, beside the estimators


class AreaEstimateError(ValueError):
    """A sample or its strata that cannot give the estimates (an unsampled stratum, bad counts)."""


@dataclass(frozen=True)
class Estimate:
    """A number with its standard error; se None when it cannot be estimated, `why` says why.
    ``lo``, ``hi``: the interval that holds (:mod:`emb.estimation.intervals`) at the level the
    estimator was asked for; None where no level was asked or no method can bound it."""

    value: float
    se: float | None
    why: str = ""
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self) -> None:
        if (self.se is None) != bool(self.why):
            raise ValueError(
                f"Estimate: a reason exactly when se is None, found se={self.se!r}, "
                f"why={self.why!r}"
            )
        bad_se = self.se is not None and not (np.isfinite(self.se) and self.se >= 0)
        if not np.isfinite(self.value) or bad_se:
            raise ValueError(
                f"Estimate: expected a finite value and se >= 0, found "
                f"value={self.value!r}, se={self.se!r}"
            )
        if (self.lo is None) != (self.hi is None) or (
            self.lo is not None and not self.lo <= self.value <= self.hi
        ):
            raise ValueError(
                f"Estimate: expected lo <= value <= hi or neither, found lo={self.lo!r}, "
                f"value={self.value!r}, hi={self.hi!r}"
            )

    def interval(self, z: float) -> tuple[float, float] | None:
        """The Wald interval, value -/+ z * se (not clipped to [0, 1]; what other tools give);
        None when there is no se."""
        if self.se is None:
            return None
        return self.value - z * self.se, self.value + z * self.se

    @property
    def bounds(self) -> tuple[float, float] | None:
        """(lo, hi) of the interval that holds; None where there is none."""
        return None if self.lo is None or self.hi is None else (self.lo, self.hi)


@dataclass(frozen=True)
class ClassEstimate:
    """One class: its map pixels, sample units, area share and accuracies."""

    cls: int  # class id (0..K-1 at the level)
    mapped_px: int  # pixels the map gives this class (N_j.)
    units_mapped: int  # sample units whose map class is cls
    units_reference: int  # sample units whose reference class is cls
    proportion: Estimate  # estimated share of the area (x total_px x pixel area = area)
    users: Estimate | None  # None when no unit is mapped as cls
    producers: Estimate | None  # None when the estimated area of cls is 0


@dataclass(frozen=True)
class AreaEstimates:
    """The estimates of one map: every class in the map or the sample, ascending."""

    total_px: int  # N
    classes: tuple[ClassEstimate, ...]
    overall: Estimate  # overall accuracy


@dataclass(frozen=True)
class AreaShares:
    """Each class's area share in many samples at once, arrays (B, K) (B samples, e.g. the
    draws of a check): what tallying many draws needs, without an :class:`AreaEstimates` per
    draw. Sample b's entries are its estimates' ``proportion`` figures, bit for bit."""

    value: np.ndarray  # the estimated share
    se: np.ndarray  # its standard error; NaN where the estimates give none (se None)
    lo: np.ndarray  # the interval that holds; NaN where there is none (lo None)
    hi: np.ndarray
    listed: np.ndarray  # bool: the class is among the estimates' classes
    units_reference: np.ndarray  # int64 units whose reference is the class


def olofsson(
    strata_px: np.ndarray, error_matrix: np.ndarray, confidence: float | None = None
) -> AreaEstimates:
    """Olofsson et al. 2014: strata = the map's classes.

    strata_px: (K,) int, pixels the map gives each class (N_i.); error_matrix: (K, K) int sample
    counts n_ij, i = map class (the stratum), j = reference class; ``confidence``: the level of
    every figure's ``lo``/``hi`` (none without one).
    """
    big_n = _strata_px(strata_px)
    k = len(big_n)
    matrix = _counts("error_matrix", error_matrix, (k, k), "a row and a column per stratum")
    n_i, figures, counts = _olofsson(big_n, matrix)
    bounds = None if confidence is None else counts.bounds(big_n, n_i, confidence)
    return _result(big_n, n_i, big_n, n_i, matrix.sum(0), figures, counts.holds, bounds)


def olofsson_shares(
    strata_px: np.ndarray, error_matrices: np.ndarray, confidence: float | None = None
) -> AreaShares:
    """:func:`olofsson`'s area shares of B samples at once: error_matrices (B, K, K)."""
    big_n = _strata_px(strata_px)
    k = len(big_n)
    matrices = _counts("error_matrices", error_matrices, (None, k, k),
                       "an error matrix per sample")  # fmt: skip
    n_i, figures, counts = _olofsson(big_n, matrices)
    n_ref = matrices.sum(-2)
    listed = _listed(big_n, n_i, n_ref)
    bounds = _area_bounds(big_n, n_i, counts.hits, confidence, listed.any(0))
    return _shares(big_n, n_i, listed, n_ref, figures, bounds)


def _olofsson(
    big_n: np.ndarray, matrix: np.ndarray
) -> tuple[np.ndarray, _Figures, intervals.StrataCounts]:
    """n_i., the figures and the counts the intervals need of error matrices (..., K, K)."""
    k = len(big_n)
    n_i = matrix.sum(-1)
    _check_strata(big_n, n_i)

    w = big_n / big_n.sum()
    cols = n_i[..., :, None]
    p = np.divide(matrix, cols, out=np.zeros(matrix.shape), where=cols > 0)  # n_ij / n_i.
    # a_ij = (n_ij/n_i.)(1 - n_ij/n_i.)/(n_i. - 1); 0 in a census stratum, and in a stratum of
    # 1 unit, whose every use is flagged by _result
    inv = np.divide(1.0, n_i - 1.0, out=np.zeros(n_i.shape), where=n_i > 1)
    a = p * (1 - p) * (inv * _not_census(big_n, n_i))[..., :, None]
    users = np.diagonal(p, axis1=-2, axis2=-1)
    users_var = np.diagonal(a, axis1=-2, axis2=-1)
    proportion = w @ p
    producers = np.divide(w * users, proportion, out=np.zeros(proportion.shape),
                          where=proportion > 0)  # fmt: skip
    others = (w**2) @ a - w**2 * users_var  # sum over i != j of W_i^2 a_ij
    figures = _Figures(
        proportion=proportion,
        proportion_var=(w**2) @ a,
        users=users,
        users_var=users_var,
        producers=producers,
        producers_var=np.divide(
            w**2 * (1 - producers) ** 2 * users_var + producers**2 * others,
            proportion**2,
            out=np.zeros(proportion.shape),
            where=proportion > 0,
        ),
        overall=_dot(w, users),
        overall_var=_dot(w**2, users_var),
    )
    # a user's accuracy draws on its own stratum only: the others hold no pixel mapped as it
    own = np.eye(k, dtype=bool)
    by_class = np.swapaxes(matrix, -1, -2)  # (..., reference class, stratum)
    counts = intervals.StrataCounts(
        hits=by_class, right=by_class * own, wrong=(n_i[..., None, :] - by_class) * own,
        omitted=by_class * ~own, agree=np.diagonal(matrix, axis1=-2, axis2=-1), holds=own,
        only=own,
    )  # fmt: skip
    return n_i, figures, counts


def _dot(w: np.ndarray, v: np.ndarray) -> np.ndarray:
    """w . v over the last axis of v (..., K), each row as ``w @ row`` would give it (a stack
    of 1 x K products: the same rounding as one sample's dot product, whatever the stack)."""
    return np.matmul(v[..., None, :], w[:, None])[..., 0, 0]


def stehman(
    strata_px: np.ndarray,
    stratum: np.ndarray,
    mapped: np.ndarray,
    reference: np.ndarray,
    mapped_px: np.ndarray,
    strata_mapped_px: np.ndarray | None = None,
    confidence: float | None = None,
) -> AreaEstimates:
    """Stehman 2014: strata that differ from the assessed map's classes.

    strata_px: (H,) int N_h; stratum, mapped, reference: (n,) int per sample unit (stratum
    0..H-1, map class 0..K-1, reference class 0..K-1); mapped_px: (K,) int, the assessed map's
    pixels per class (reported as ``mapped_px``; the estimates come from the sample; its total
    may differ from the strata's when the assessed map covers other pixels than the design's,
    e.g. another source's map with nodata elsewhere, whose "no data" is then a class).
    strata_mapped_px: optional (H, K) int, the assessed map's pixels per stratum and class. A
    stratum of 1 unit that holds no pixel mapped as k then leaves the SE of k's user's accuracy
    alone; without it, such a stratum may hold pixels mapped as k and so enters every SE.
    ``confidence``: the level of every figure's ``lo``/``hi`` (none without one).
    """
    big_n = _strata_px(strata_px)
    mapped_px = _counts("mapped_px", mapped_px, (None,), "one entry per class")
    h, k = len(big_n), len(mapped_px)
    units = _units(stratum, mapped, reference, h, k)
    stratum, mapped, reference = units
    n_mapped, n_ref = np.bincount(mapped, minlength=k), np.bincount(reference, minlength=k)
    if strata_mapped_px is not None and mapped_px.sum() != big_n.sum():
        raise ValueError(
            f"mapped_px: expected the area of strata_px ({big_n.sum()} px), "
            f"found {mapped_px.sum()} px"
        )
    empty = np.flatnonzero((mapped_px == 0) & (n_mapped > 0))
    if strata_mapped_px is not None and len(empty):
        u = int(np.flatnonzero(mapped == empty[0])[0])
        raise AreaEstimateError(
            f"unit {u} is mapped as class {empty[0]}, but mapped_px gives class {empty[0]} no pixel"
        )
    holds = _strata_mapped(strata_mapped_px, big_n, mapped_px, units)
    counts = strata_counts(stratum, mapped, reference, h, k, holds=holds,
                           only=_only(strata_mapped_px, big_n))  # fmt: skip
    n_h = np.bincount(stratum, minlength=h)
    _check_strata(big_n, n_h)
    figures = _stehman(big_n, n_h, counts)
    bounds = None if confidence is None else counts.bounds(big_n, n_h, confidence)
    return _result(big_n, n_h, mapped_px, n_mapped, n_ref, figures, holds, bounds)


def stehman_shares(
    strata_px: np.ndarray, counts: intervals.StrataCounts, mapped_px: np.ndarray,
    confidence: float | None = None,
) -> AreaShares:  # fmt: skip
    """:func:`stehman`'s area shares of B samples at once, from their :func:`strata_counts`
    ((B, K, H) arrays; ``holds``/``only`` of the map's pixels per stratum and class, as
    :func:`stehman` derives them from ``strata_mapped_px``)."""
    big_n = _strata_px(strata_px)
    mapped_px = _counts("mapped_px", mapped_px, (None,), "one entry per class")
    want = (len(mapped_px), len(big_n))
    if np.shape(counts.hits)[-2:] != want or np.ndim(counts.hits) != 3:
        raise ValueError(
            f"counts: expected (B, K, H) = (B, {want[0]}, {want[1]}) units per sample, class "
            f"and stratum, found {np.shape(counts.hits)}"
        )
    n_h = counts.hits.sum(-2)
    _check_strata(big_n, n_h)
    figures = _stehman(big_n, n_h, counts)
    n_ref = counts.hits.sum(-1)
    listed = _listed(mapped_px, (counts.right + counts.wrong).sum(-1), n_ref)
    bounds = _area_bounds(big_n, n_h, counts.hits, confidence, listed.any(0))
    return _shares(big_n, n_h, listed, n_ref, figures, bounds)


def strata_counts(
    stratum: np.ndarray, mapped: np.ndarray, reference: np.ndarray, h: int, k: int,
    units: np.ndarray | None = None, holds: np.ndarray | None = None,
    only: np.ndarray | None = None,
) -> intervals.StrataCounts:  # fmt: skip
    """The units per class and stratum (:class:`emb.estimation.intervals.StrataCounts`, (K, H)
    arrays) of units in ``stratum`` (0..h-1) mapped as ``mapped``, of reference ``reference``
    (0..k-1), (n,) each: all Stehman's estimator and the intervals need (a unit's y and x are
    indicators of its (map, reference) class). ``units``: (B, n) how many units each entry
    stands for in each of B samples (e.g. cells of a population), giving (B, K, H) arrays;
    holds, only: (H, K) bool, the map's pixels per stratum (default: every stratum may hold
    every class, none only one)."""
    agree = mapped == reference
    # (..., H, K) in memory, handed over as (..., K, H) views: the intervals' sums over the
    # strata then round as they always have (a layout of its own would move their last bits)
    hits = _per_key(stratum * k + reference, h * k, units)
    mapped_units = _per_key(stratum * k + mapped, h * k, units)
    right = _per_key(np.where(agree, stratum * k + mapped, h * k), h * k, units)
    shape = hits.shape[:-1] + (h, k)
    hits, mapped_units, right = (np.swapaxes(a.reshape(shape), -1, -2)
                                 for a in (hits, mapped_units, right))  # fmt: skip
    return intervals.StrataCounts(
        hits=hits, right=right, wrong=mapped_units - right, omitted=hits - right,
        agree=right.sum(-2), holds=(np.ones((h, k), bool) if holds is None else holds).T,
        only=(np.zeros((h, k), bool) if only is None else only).T,
    )  # fmt: skip


def unit_matrix(
    mapped: np.ndarray, reference: np.ndarray, k: int, units: np.ndarray | None = None
) -> np.ndarray:
    """(K, K) int64 units per (map class, reference class) of units with classes ``mapped`` and
    ``reference`` (n,) in 0..k-1: the error matrix :func:`olofsson` takes; (B, K, K) with
    ``units`` (B, n) how many units each entry stands for in each of B samples."""
    got = _per_key(np.asarray(mapped) * k + np.asarray(reference), k * k, units)
    return got.reshape(got.shape[:-1] + (k, k))


def _per_key(keys: np.ndarray, size: int, units: np.ndarray | None) -> np.ndarray:
    """(size,) int64 entries per key 0..size-1 (a key of ``size`` left out), or (B, size) with
    ``units`` (B, n) the entries each key stands for per sample."""
    if units is None:
        return np.bincount(keys, minlength=size + 1)[:size].astype(np.int64)
    b = len(units)
    flat = (np.arange(b)[:, None] * (size + 1) + keys).ravel()
    got = np.bincount(flat, weights=np.asarray(units, float).ravel(), minlength=b * (size + 1))
    return got.reshape(b, size + 1)[:, :size].astype(np.int64)


def _only(table: np.ndarray | None, big_n: np.ndarray) -> np.ndarray | None:
    """(H, K) bool whether stratum h holds only pixels mapped k (None: unknown)."""
    return None if table is None else np.asarray(table) == big_n[:, None]


def _stehman(big_n: np.ndarray, n_h: np.ndarray, c: intervals.StrataCounts) -> _Figures:
    """Stehman's figures of the units per class and stratum (arrays (..., K, H), n_h (..., H)):
    area of k, y = [reference = k]; overall, y = [map = reference]; user's, y = [map =
    reference = k], x = [map = k]; producer's, the same y, x = [reference = k]."""
    design = _StratifiedTotals(big_n, n_h)
    hits, right, wrong, omitted = (
        np.ascontiguousarray(np.swapaxes(a, -1, -2)) for a in (c.hits, c.right, c.wrong, c.omitted)
    )  # (..., H, K)
    big_ref, ref_var = design.total(hits)
    correct, correct_var = design.total(c.agree[..., :, None])
    users, users_var = design.ratio(right, wrong)
    producers, producers_var = design.ratio(right, omitted)
    return _Figures(
        proportion=big_ref / design.n,
        proportion_var=ref_var / design.n**2,
        users=users,
        users_var=users_var,
        producers=producers,
        producers_var=producers_var,
        overall=correct[..., 0] / design.n,
        overall_var=correct_var[..., 0] / design.n**2,
    )


@dataclass(frozen=True)
class _Figures:
    """Every estimate and its variance; (..., K) arrays, 0 where a figure is undefined; the
    overall accuracy (...,)."""

    proportion: np.ndarray
    proportion_var: np.ndarray
    users: np.ndarray
    users_var: np.ndarray
    producers: np.ndarray
    producers_var: np.ndarray
    overall: np.ndarray
    overall_var: np.ndarray


def _listed(mapped_px: np.ndarray, n_mapped: np.ndarray, n_ref: np.ndarray) -> np.ndarray:
    """Whether a class is among a sample's estimates: in the map or in the sample."""
    return (mapped_px > 0) | (n_mapped > 0) | (n_ref > 0)


def _area_bounds(
    big_n: np.ndarray, n_h: np.ndarray, hits: np.ndarray, confidence: float | None,
    classes: np.ndarray,
) -> Bounds | None:  # fmt: skip
    """The area shares' intervals (as :meth:`~emb.estimation.intervals.StrataCounts.bounds`
    gives them) of B samples, hits (B, K, H): of ``classes`` (K,) bool only (NaN the others,
    never read), over the strata with pixels only (a stratum without adds exact zeros to the
    sums over the strata, taken one stratum after another in this layout: the same bits).
    None without a ``confidence``."""
    if confidence is None:
        return None
    if classes.sum() < 2:  # one row would be summed in another order: keep every class
        classes = np.ones(len(classes), bool)
    strata = big_n > 0
    # (B, H', K') in memory, handed over as (B, K', H') as strata_counts does
    by_stratum = np.ascontiguousarray(np.swapaxes(hits, -1, -2)[:, strata][:, :, classes])
    units = np.asarray(n_h)[:, None, strata]
    got = intervals.area(big_n[strata], units, np.swapaxes(by_stratum, -1, -2), confidence)
    lo, hi = (np.full(hits.shape[:-1], np.nan) for _ in range(2))
    lo[:, classes], hi[:, classes] = got
    return Bounds(lo, hi)


def _shares(
    big_n: np.ndarray,
    n_h: np.ndarray,
    listed: np.ndarray,
    n_ref: np.ndarray,
    f: _Figures,
    bounds: Bounds | None,
) -> AreaShares:
    """The area shares of a stack of samples as :func:`_result` makes each one's
    ``proportion``: an SE withheld where a stratum of 1 unit (of more than 1 pixel) enters,
    an interval only where the SE exists, widened to hold the value."""
    withheld = ((n_h == 1) & (big_n > 1)).any(-1)[..., None]
    value = f.proportion
    se = np.where(withheld, np.nan, np.sqrt(f.proportion_var))
    lo = hi = np.full(value.shape, np.nan)
    if bounds is not None:
        none = withheld | np.isnan(bounds.lo) | np.isnan(bounds.hi)
        lo = np.where(none, np.nan, np.fmin(bounds.lo, value))
        hi = np.where(none, np.nan, np.fmax(bounds.hi, value))
    return AreaShares(value, se, lo, hi, listed, np.asarray(n_ref, np.int64))


def _result(
    big_n: np.ndarray,
    n_h: np.ndarray,
    mapped_px: np.ndarray,
    n_mapped: np.ndarray,
    n_ref: np.ndarray,
    f: _Figures,
    users_strata: np.ndarray,
    bounds: dict | None = None,
) -> AreaEstimates:
    """The figures as estimates, each SE withheld where a stratum of 1 unit enters it, each with its
    interval from ``bounds`` (:meth:`emb.estimation.intervals.StrataCounts.bounds`) where one is
    given.

    users_strata: (H, K) bool, whether stratum h enters the SE of class k's user's accuracy
    (every stratum enters the areas', the producer's and the overall accuracy's).
    """
    lone = (n_h == 1) & (big_n > 1)  # 1 unit among more than 1 pixel: no variance estimate
    everywhere = _lone_why(lone, big_n)
    # every figure as Python numbers once (the same values), not a numpy scalar per class
    listed = np.flatnonzero((mapped_px > 0) | (n_mapped > 0) | (n_ref > 0))
    lists = {name: np.asarray(getattr(f, name))[listed].tolist()
             for name in ("users", "users_var", "producers", "producers_var", "proportion",
                          "proportion_var")}  # fmt: skip
    ranges = {} if bounds is None else {
        name: tuple(np.asarray(v)[listed].tolist() for v in bounds[name])
        for name in ("users", "producers", "proportion")
    }  # fmt: skip

    def at(figure: str, i: int) -> tuple[float, float] | None:
        if bounds is None:
            return None
        lo, hi = (v[i] for v in ranges[figure])
        return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)

    classes = []
    counts = zip(mapped_px[listed].tolist(), n_mapped[listed].tolist(), n_ref[listed].tolist(),
                 strict=True)  # fmt: skip
    for i, (c, (px, mapped, ref)) in enumerate(zip(listed.tolist(), counts, strict=True)):
        users_why = _lone_why(lone & users_strata[:, c], big_n) if everywhere else ""
        users = _estimate(lists["users"][i], lists["users_var"][i], users_why, at("users", i))
        producers = _estimate(lists["producers"][i], lists["producers_var"][i], everywhere,
                              at("producers", i))  # fmt: skip
        proportion = _estimate(lists["proportion"][i], lists["proportion_var"][i], everywhere,
                               at("proportion", i))  # fmt: skip
        classes.append(
            ClassEstimate(
                cls=c,
                mapped_px=int(px),
                units_mapped=int(mapped),
                units_reference=int(ref),
                proportion=proportion,
                users=users if mapped > 0 else None,
                producers=producers if lists["proportion"][i] > 0 else None,
            )
        )
    overall_range = None
    if bounds is not None:
        lo, hi = (float(np.asarray(v)[()]) for v in bounds["overall"])
        overall_range = None if np.isnan(lo) or np.isnan(hi) else (lo, hi)
    overall = _estimate(f.overall, f.overall_var, everywhere, overall_range)
    return AreaEstimates(int(big_n.sum()), tuple(classes), overall)


class _StratifiedTotals:
    """A stratified random sample's totals and their variances, of per-unit values given as the
    units per stratum that hold each value (indicators: no per-unit rows). Arrays (..., H, M):
    M columns (e.g. classes), stacked samples in front; n_h (..., H)."""

    def __init__(self, big_n: np.ndarray, n_h: np.ndarray) -> None:
        self.big_n = big_n.astype(float)
        self.n = float(big_n.sum())
        self.n_h = np.asarray(n_h, float)[..., :, None]
        # N_h^2 / n_h per stratum; 0 in a census (known exactly) and where n_h < 2 (a stratum
        # of 1 unit has its SEs withheld by _result, one of none is refused before)
        n_h = np.asarray(n_h, float)
        weight = np.divide(self.big_n**2, n_h, out=np.zeros(n_h.shape), where=n_h > 1)
        self.var_weight = (weight * _not_census(big_n, n_h))[..., None, :]

    def total(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Y = sum_h N_h ybar_h and V(Y) = sum_h N_h^2 s2_yh / n_h of an indicator, per column;
        y: (..., H, M) the units per stratum whose value is 1 (0 the others)."""
        return self._total([(y, 1.0)])

    def ratio(self, y: np.ndarray, x_only: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """R = Y / X per column and V(R) = V(total of y - R x) / X^2, 0 where X = 0, of
        indicators y <= x: y the units per stratum with y = x = 1, x_only those with x = 1,
        y = 0 (..., H, M)."""
        big_y, _ = self.total(y)
        big_x, _ = self.total(y + x_only)
        r = np.divide(big_y, big_x, out=np.zeros(big_y.shape), where=big_x > 0)
        rows = r[..., None, :]
        _, var_d = self._total([(y, 1 - rows), (x_only, -rows)])
        return r, np.divide(var_d, big_x**2, out=np.zeros(big_y.shape), where=big_x > 0)

    def _total(
        self, groups: list[tuple[np.ndarray, np.ndarray | float]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Y and V(Y) of a value that the units of ``groups`` (units per stratum, value) take,
        0 the others'. A stratum's squared deviations from its mean are summed over pairs of
        groups, sum_{i<j} c_i c_j (v_i - v_j)^2 / n_h: exactly 0 where its units agree."""
        n_h = self.n_h
        sums = sum(c * v for c, v in groups)
        means = np.divide(sums, n_h, out=np.zeros(sums.shape), where=n_h > 0)
        every = [*groups, (n_h - sum(c for c, _ in groups), 0.0)]
        pairs = sum(ci * cj * np.square(vi - vj) for i, (ci, vi) in enumerate(every)
                    for cj, vj in every[i + 1 :])  # fmt: skip
        squares = np.divide(pairs, n_h, out=np.zeros(sums.shape), where=n_h > 0)
        s2 = np.divide(squares, n_h - 1.0, out=np.zeros(sums.shape), where=n_h > 1)
        return self.big_n @ np.ascontiguousarray(means), (self.var_weight @ s2)[..., 0, :]


def _not_census(big_n: np.ndarray, n_h: np.ndarray) -> np.ndarray:
    """1 per stratum, 0 where it was sampled whole (n_h = N_h: no sampling variance)."""
    return (n_h < big_n).astype(float)


def _lone_why(lone: np.ndarray, big_n: np.ndarray) -> str:
    """Why an SE that draws on the strata ``lone`` marks has no value; "" when none."""
    which = np.flatnonzero(lone)
    if len(which) == 0:
        return ""
    named = ", ".join(f"{s} (N={big_n[s]} px)" for s in which)
    if len(which) == 1:
        return f"stratum {named} has 1 sample unit, too few to estimate its variance"
    return f"strata {named} have 1 sample unit each, too few to estimate their variance"


def _estimate(
    value: float, var: float, why: str, bounds: tuple[float, float] | None = None
) -> Estimate:
    """An estimate; its interval only where its SE exists (a stratum of 1 unit bounds neither),
    widened by float rounding to hold the value itself."""
    if why:
        return Estimate(float(value), None, why)
    lo, hi = (None, None) if bounds is None else (min(bounds[0], value), max(bounds[1], value))
    return Estimate(float(value), float(np.sqrt(var)), lo=lo, hi=hi)


def _check_strata(big_n: np.ndarray, n_h: np.ndarray) -> None:
    """Every stratum with pixels has a unit, and none has more units than pixels (n_h (..., H):
    of every sample)."""
    bad = (n_h > big_n) | ((n_h == 0) & (big_n > 0))
    if not bad.any():
        return
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    s, units, size = at[-1], int(n_h[at]), int(big_n[at[-1]])
    if units > size:
        raise AreaEstimateError(
            f"stratum {s} has {units} sample units but {size} px: expected at most one "
            f"unit per pixel"
        )
    raise AreaEstimateError(
        f"stratum {s} (N={size} px) has no sample unit: the estimates would leave its pixels out"
    )


def _counts(
    name: str, values: np.ndarray, shape: tuple[int | None, ...], meaning: str
) -> np.ndarray:
    """``values`` as int64 after checking the shape (None: any length), type and sign."""
    a = np.asarray(values)
    if a.ndim != len(shape) or any(
        w is not None and w != g for w, g in zip(shape, a.shape, strict=True)
    ):
        expected = str(shape).replace("None", "n")
        raise ValueError(f"{name}: expected shape {expected} ({meaning}), found {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name}: expected {meaning}, found no entry")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name}: expected integer counts, found dtype {a.dtype}")
    if (a < 0).any():
        at = tuple(int(i) for i in np.argwhere(a < 0)[0])
        raise ValueError(f"{name}: expected counts >= 0, found {a[at]} at index {at}")
    return a.astype(np.int64)


def _strata_px(values: np.ndarray) -> np.ndarray:
    """N_h as int64: pixels per stratum, at least one pixel in all."""
    big_n = _counts("strata_px", values, (None,), "pixels per stratum")
    if big_n.sum() == 0:
        raise ValueError("strata_px: expected a map with pixels, found a total of 0 px")
    return big_n


def _units(
    stratum: np.ndarray, mapped: np.ndarray, reference: np.ndarray, h: int, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-unit arrays as int64 after checking their length, type and range."""
    n = np.asarray(stratum).shape[:1]
    checked = []
    for name, values, top, of in (
        ("stratum", stratum, h, "strata_px"),
        ("mapped", mapped, k, "mapped_px"),
        ("reference", reference, k, "mapped_px"),
    ):
        a = np.asarray(values)
        if a.ndim != 1 or a.shape != n:
            raise ValueError(
                f"{name}: expected shape {n} (one entry per sample unit, as stratum), "
                f"found {a.shape}"
            )
        if len(a) and not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name}: expected integer indices, found dtype {a.dtype}")
        bad = np.flatnonzero((a < 0) | (a >= top))
        if len(bad):
            raise ValueError(
                f"{name}: expected indices 0..{top - 1} (one per entry of {of}), "
                f"found {a[bad[0]]} at unit {bad[0]}"
            )
        checked.append(a.astype(np.int64))
    return checked[0], checked[1], checked[2]


def _strata_mapped(
    table: np.ndarray | None,
    big_n: np.ndarray,
    mapped_px: np.ndarray,
    units: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> np.ndarray:
    """(H, K) bool: whether stratum h may hold pixels mapped as k (all True when unknown)."""
    h, k = len(big_n), len(mapped_px)
    if table is None:
        return np.ones((h, k), bool)
    meaning = "pixels per stratum (row) and map class (column)"
    table = _counts("strata_mapped_px", table, (h, k), meaning)
    for axis, name, want in ((1, "strata_px", big_n), (0, "mapped_px", mapped_px)):
        got = table.sum(axis)
        if (got != want).any():
            i = int(np.flatnonzero(got != want)[0])
            raise ValueError(
                f"strata_mapped_px: expected its sums to equal {name} ({want[i]} px at {i}), "
                f"found {got[i]} px"
            )
    stratum, mapped, _ = units
    bad = np.flatnonzero(table[stratum, mapped] == 0)
    if len(bad):
        u = int(bad[0])
        raise AreaEstimateError(
            f"unit {u} in stratum {stratum[u]} is mapped as class {mapped[u]}, but "
            f"strata_mapped_px gives that stratum no pixel of class {mapped[u]}"
        )
    return table > 0
