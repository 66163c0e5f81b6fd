"""The figures of error matrices as per-stratum counts, and the intervals compared against the
chosen one (``emb.estimation.intervals``): Wald (the papers'), Wald on the Jeffreys variance
(a pseudo-count floor), Korn & Graubard 1998, and for one stratum's binomial Wilson and
Clopper-Pearson. The comparison that chose between them: ``python
tests/estimation/compare_intervals.py`` (docs/intervals.md); the coverage test uses Wald.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy import stats

from emb.estimation import intervals

KINDS = ("area", "users", "producers", "overall")


class Figure(NamedTuple):
    """One figure kind of a set of error matrices as ratio counts (module ``intervals.ratio``):
    arrays (D, F, H) for D matrices, F figures (classes, or 1 for overall), H strata."""

    units: np.ndarray
    a: np.ndarray
    b: np.ndarray
    a_can: np.ndarray  # (F, H)
    b_can: np.ndarray
    rest_can: np.ndarray


def figure(kind: str, matrices: np.ndarray) -> Figure:
    """Counts of ``kind`` from (D, K, K) error matrices (rows: strata = map classes)."""
    d, k, _ = matrices.shape
    units = np.broadcast_to(matrices.sum(2)[:, None, :], (d, k, k))  # (D, class, stratum)
    by_class = matrices.transpose(0, 2, 1)  # [d, class j, stratum h] = n_hj
    eye = np.eye(k, dtype=bool)
    diagonal = by_class * eye  # right: only in the class's own stratum
    yes, no = np.ones((k, k), bool), np.zeros((k, k), bool)
    if kind == "area":
        return Figure(units, by_class, units - by_class, yes, yes, no)
    if kind == "users":
        return Figure(units, diagonal, (units - by_class) * eye, eye, eye, ~eye)
    if kind == "producers":
        return Figure(units, diagonal, by_class * ~eye, eye, ~eye, yes)
    if kind == "overall":
        agree = np.diagonal(matrices, axis1=1, axis2=2)[:, None, :]
        units1 = matrices.sum(2)[:, None, :]
        one, zero = np.ones((1, k), bool), np.zeros((1, k), bool)
        return Figure(units1, agree, units1 - agree, one, one, zero)
    raise ValueError(kind)


def truth(kind: str, joint: np.ndarray) -> np.ndarray:
    """(F,) the population's figure."""
    if kind == "area":
        return joint.sum(0) / joint.sum()
    if kind == "users":
        return np.diagonal(joint) / joint.sum(1)
    if kind == "producers":
        return np.diagonal(joint) / joint.sum(0)
    return np.array([np.trace(joint) / joint.sum()])


Method = Callable[[np.ndarray, Figure, float], intervals.Bounds]


def chosen(kind: str) -> Method:
    """The chosen interval of a figure kind (``emb.estimation.intervals``)."""

    def bounds(strata_px: np.ndarray, f: Figure, confidence: float) -> intervals.Bounds:
        got = intervals.smoothed(strata_px, f.units, f.a, f.b, f.a_can, f.b_can, f.rest_can)
        if kind == "producers":
            return intervals.fieller(got, confidence)
        return intervals.adjusted_wald(got, confidence)

    return bounds


def wald_moments(strata_px: np.ndarray, f: Figure) -> tuple[np.ndarray, np.ndarray]:
    """The papers' estimate and variance: V(R) = sum_h W_h^2 s2_dh / n_h / X^2, d = y - R x
    (Stehman 2014; Olofsson et al. 2014's where the strata are the map's classes); NaN where a
    stratum of 1 unit enters, 0 from a census stratum."""
    big_n = np.asarray(strata_px, float)
    w = big_n / big_n.sum()
    n, a, b = (np.asarray(v, float) for v in (f.units, f.a, f.b))
    qa = np.divide(a, n, out=np.zeros_like(a), where=n > 0)
    qb = np.divide(b, n, out=np.zeros_like(b), where=n > 0)
    big_x = (w * (qa + qb)).sum(-1)
    r = np.divide((w * qa).sum(-1), big_x, out=np.full_like(big_x, np.nan), where=big_x > 0)
    rr = r[..., None]
    mean_d = qa * (1 - rr) - qb * rr
    ss = a * (1 - rr) ** 2 + b * rr**2 - n * mean_d**2
    s2 = np.divide(ss, n - 1, out=np.zeros_like(ss), where=n > 1)
    var_h = np.where(n >= big_n, 0.0, np.divide(s2, n, out=np.zeros_like(s2), where=n > 0))
    var = (w**2 * var_h).sum(-1) / big_x**2
    lone = ((n == 1) & (big_n > 1)).any(-1)
    return r, np.where(lone, np.nan, var)


def wald(strata_px: np.ndarray, f: Figure, confidence: float) -> intervals.Bounds:
    """estimate +/- z SE; no interval where the SE is 0 (as the area check counts it)."""
    r, var = wald_moments(strata_px, f)
    z = stats.norm.ppf(0.5 + confidence / 2)
    half = np.where(var > 0, z * np.sqrt(var), np.nan)
    return intervals.Bounds(r - half, r + half)


def floor_wald(strata_px: np.ndarray, f: Figure, confidence: float) -> intervals.Bounds:
    """The estimate +/- z times the Jeffreys posterior's SD (a pseudo-count variance floor),
    clipped to [0, 1]."""
    got = intervals.smoothed(strata_px, f.units, f.a, f.b, f.a_can, f.b_can, f.rest_can)
    z = stats.norm.ppf(0.5 + confidence / 2)
    half = z * np.sqrt(intervals.ratio_var(got))
    lo, hi = np.clip(got.estimate - half, 0, 1), np.clip(got.estimate + half, 0, 1)
    return intervals.Bounds(np.where(got.none, np.nan, lo), np.where(got.none, np.nan, hi))


def korn_graubard(strata_px: np.ndarray, f: Figure, confidence: float) -> intervals.Bounds:
    """Clopper-Pearson on the effective sample size n* = R (1 - R) / V(R) (n where V = 0),
    with the df adjustment (t quantiles, df = n - H): the R survey package's
    svyciprop(method = "beta"), Korn & Graubard 1998."""
    r, var = wald_moments(strata_px, f)
    n = np.asarray(f.units, float).sum(-1)
    df = n - len(strata_px)
    tail = (1 - confidence) / 2
    n_eff = np.divide(r * (1 - r), var, out=n.copy(), where=var > 0)
    n_eff = n_eff * (stats.t.ppf(tail, n - 1) / stats.t.ppf(tail, df)) ** 2
    x = r * n_eff
    with np.errstate(invalid="ignore"):
        lo = np.where(x <= 0, 0.0, stats.beta.ppf(tail, x, n_eff - x + 1))
        hi = np.where(x >= n_eff, 1.0, stats.beta.ppf(1 - tail, x + 1, n_eff - x))
    return intervals.Bounds(lo, hi)


def _one_stratum(f: Figure) -> tuple[np.ndarray, np.ndarray]:
    """(successes, trials) of a figure that is one stratum's binomial (user's, Olofsson)."""
    return np.asarray(f.a, float).sum(-1), np.asarray(f.a + f.b, float).sum(-1)


def wilson(strata_px: np.ndarray, f: Figure, confidence: float) -> intervals.Bounds:
    """Wilson's score interval (Wilson 1927) of one stratum's binomial share."""
    x, n = _one_stratum(f)
    z = stats.norm.ppf(0.5 + confidence / 2)
    p = x / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / (1 + z**2 / n)
    return intervals.Bounds(centre - half, centre + half)


def clopper_pearson(strata_px: np.ndarray, f: Figure, confidence: float) -> intervals.Bounds:
    """The exact (Clopper-Pearson 1934) interval of one stratum's binomial share."""
    x, n = _one_stratum(f)
    tail = (1 - confidence) / 2
    with np.errstate(invalid="ignore"):
        lo = np.where(x <= 0, 0.0, stats.beta.ppf(tail, x, n - x + 1))
        hi = np.where(x >= n, 1.0, stats.beta.ppf(1 - tail, x + 1, n - x))
    return intervals.Bounds(lo, hi)


def coverage(bounds: intervals.Bounds, true: np.ndarray) -> np.ndarray:
    """(F,) share of draws whose interval holds the truth; no interval is a miss."""
    with np.errstate(invalid="ignore"):
        hit = (bounds.lo <= true) & (true <= bounds.hi)
    return hit.mean(0)


def width(bounds: intervals.Bounds) -> np.ndarray:
    """(F,) mean width over the draws that have an interval."""
    return np.nanmean(bounds.hi - bounds.lo, axis=0)
