"""Confidence intervals for the area estimators' figures that keep their coverage where the
normal (Wald) interval, estimate +/- z SE, does not: rare classes, accuracies near 0 or 1, and
strata whose sample shows no disagreement at all.

Why not Wald: its SE is a plug-in of the sample shares, so a stratum whose units all agree adds
a variance of 0. When no omission unit of a rare class falls into the big strata's sample (1
draw in 5 at n = 500 on the population of ``tests/estimation/area_population.py``), its area is
low and its SE too small; when every unit of a class agrees, the SE is 0 and the figure has no
interval. Wald's worst coverage there: 0.74 (area), 0.68 (user's), 0.23 (producer's).

What holds (chosen by measurement, docs/intervals.md), on one variance for every figure:

- Pseudo-count variances. Each stratum's shares are smoothed with the Jeffreys prior's 1/2 per
  category the stratum can hold, q~ = (count + 1/2) / (n_h + #categories / 2), and enter the
  papers' variance, V = sum_h W_h^2 q~ (1 - q~) / n_h (Olofsson et al. 2014; Stehman 2014's
  ratios by linearisation). A stratum without a hit thus adds the variance of half a hit, so
  no figure's variance is 0 while a stratum is sampled, not censused. A category a stratum
  cannot hold (no pixel mapped as k) gets no pseudo-count: it cannot be missed there. A
  stratum sampled whole (n_h = N_h) is known and adds nothing.
- Area, overall and user's accuracy: Agresti & Coull's (1998, American Statistician 52:119-126)
  adjusted Wald interval on Korn & Graubard's (1998, Survey Methodology 24:193-201) effective
  sample size n* = R~ (1 - R~) / V. With one stratum (a user's accuracy with the map's
  classes as strata) it is Agresti-Coull's interval itself, whose coverage stays near nominal
  at every n and p (Brown, Cai & DasGupta 2001, Statistical Science 16:101-133); Wilson's and
  Jeffreys', the same paper's other picks, dip to 0.93 and 0.91 for this population's user's
  accuracies (exact binomial coverage, docs/intervals.md).
- Producer's accuracy: Fieller's (1954, JRSS B 16:175-185) interval of the ratio A / X, the
  roots of (A - R X)^2 = z^2 V(A - R X). Its denominator, the class's estimated area, is
  itself uncertain and skewed where the class's omission hides in a few big-stratum units;
  Fieller follows that skew, an effective-n interval does not (0.90 for the rare class).

Every interval lies in [0, 1] and holds the papers' estimate. A figure has no interval (NaN
bounds) where a stratum it draws on holds 1 unit of more than 1 pixel (no variance can be
estimated, as the estimators' SE says), where a stratum with pixels has no unit, or where a
ratio's denominator is 0 (no unit mapped as the class; an estimated area of 0).

Every function is vectorised: counts of shape (..., H) (H strata) give bounds of shape (...).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

JEFFREYS = 0.5  # pseudo-count per category a stratum can hold (Jeffreys: Dirichlet(1/2, ...))


class Bounds(NamedTuple):
    """Lower and upper bounds, arrays of the figures' shape; NaN where no interval exists."""

    lo: np.ndarray
    hi: np.ndarray


@dataclass(frozen=True)
class StrataCounts:
    """A sample's units per class k and stratum h, (K, H) arrays: ``hits`` of reference k;
    ``right`` mapped and of reference k; ``wrong`` mapped k of another reference; ``omitted``
    of reference k mapped otherwise; ``agree`` (H,) map = reference; ``holds``/``only``: whether
    stratum h holds pixels mapped k / only such pixels. What the estimators hand over."""

    hits: np.ndarray
    right: np.ndarray
    wrong: np.ndarray
    omitted: np.ndarray
    agree: np.ndarray
    holds: np.ndarray
    only: np.ndarray

    def bounds(self, big_n: np.ndarray, n_h: np.ndarray, confidence: float) -> dict[str, Bounds]:
        """Every figure's interval that holds: (K,) lo and hi per figure, scalars for overall;
        of many samples at once where the counts have leading axes (``n_h`` (..., H), the
        counts (..., K, H): bounds (..., K) and (...,) for overall)."""
        n_h = np.asarray(n_h)
        units = n_h if n_h.ndim == 1 else n_h[..., None, :]  # a row of every class's counts
        return {
            "proportion": area(big_n, units, self.hits, confidence),
            "users": users(big_n, units, self.right, self.wrong, confidence,
                                     holds=self.holds, only=self.only),
            "producers": producers(big_n, units, self.right, self.omitted, confidence,
                                             holds=self.holds, only=self.only),
            "overall": overall(big_n, n_h, self.agree, confidence),
        }  # fmt: skip


def area(strata_px: np.ndarray, units: np.ndarray, hits: np.ndarray, confidence: float) -> Bounds:
    """A class's share of the area (Agresti-Coull on the effective n).

    strata_px: (H,) N_h; units: (..., H) n_h; hits: (..., H) units whose reference is the class.
    """
    return adjusted_wald(proportion(strata_px, units, hits), confidence)


def overall(
    strata_px: np.ndarray, units: np.ndarray, agree: np.ndarray, confidence: float
) -> Bounds:
    """The overall accuracy: ``agree`` units whose map class is their reference, per stratum."""
    return adjusted_wald(proportion(strata_px, units, agree), confidence)


def users(
    strata_px: np.ndarray,
    units: np.ndarray,
    right: np.ndarray,
    wrong: np.ndarray,
    confidence: float,
    holds: np.ndarray | None = None,
    only: np.ndarray | None = None,
) -> Bounds:
    """Class k's user's accuracy (Agresti-Coull on the effective n): right = units mapped k
    whose reference is k, wrong = units mapped k with another reference, per stratum (..., H).

    holds: (H,) bool, whether stratum h has pixels mapped as k (None: every stratum may);
    only: (H,) bool, whether all of them are (None: none is known to be). With the map's
    classes as strata (Olofsson), holds = only = [h == k]: Agresti & Coull's interval of
    stratum k's binomial share.
    """
    can, all_k = _structure(len(strata_px), holds, only)
    return adjusted_wald(smoothed(strata_px, units, right, wrong, can, can, ~all_k), confidence)


def producers(
    strata_px: np.ndarray,
    units: np.ndarray,
    right: np.ndarray,
    omitted: np.ndarray,
    confidence: float,
    holds: np.ndarray | None = None,
    only: np.ndarray | None = None,
) -> Bounds:
    """Class k's producer's accuracy (Fieller's interval): right = units of reference k mapped
    k, omitted = units of reference k mapped as another class, per stratum (..., H). holds,
    only: as :func:`users` (a stratum without pixels mapped k has no right unit, one mapped k
    throughout no omitted unit)."""
    h = len(strata_px)
    can, all_k = _structure(h, holds, only)
    got = smoothed(strata_px, units, right, omitted, can, ~all_k, np.ones(h, bool))
    return fieller(got, confidence)


def _structure(
    h: int, holds: np.ndarray | None, only: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    can = np.ones(h, bool) if holds is None else np.asarray(holds, bool)
    return can, np.zeros(h, bool) if only is None else np.asarray(only, bool)


class Smoothed(NamedTuple):
    """A ratio R = A / X of stratified totals: the papers' estimates and the pseudo-count
    variances (module docstring), arrays of the figures' shape."""

    estimate: np.ndarray  # R = A / X, the papers' (NaN where X = 0)
    big_a: np.ndarray  # A = sum_h W_h a_h / n_h
    big_x: np.ndarray  # X = sum_h W_h (a_h + b_h) / n_h
    var_a: np.ndarray  # V(A) from the smoothed shares
    var_x: np.ndarray  # V(X)
    cov_ax: np.ndarray  # C(A, X)
    smooth: np.ndarray  # the smoothed shares' ratio, the centre of the effective n
    none: np.ndarray  # bool: no interval (a stratum of 1 unit or of none; X = 0)


def proportion(strata_px: np.ndarray, units: np.ndarray, hits: np.ndarray) -> Smoothed:
    """P = sum_h W_h hits_h / n_h as the ratio whose x is 1 for every unit."""
    units, hits = np.asarray(units, float), np.asarray(hits, float)
    both = np.ones(len(strata_px), bool)
    return smoothed(strata_px, units, hits, units - hits, both, both, ~both)


def smoothed(
    strata_px: np.ndarray,
    units: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    a_can: np.ndarray,
    b_can: np.ndarray,
    rest_can: np.ndarray,
) -> Smoothed:
    """R = sum_h W_h q_ah / sum_h W_h (q_ah + q_bh), per unit y = [a], x = [a or b], with the
    variances of A and X from the pseudo-counted shares.

    a, b: (..., H) units in categories a and b, the rest (units - a - b) in a third; a_can,
    b_can, rest_can: (H,) bool (or broadcastable), whether stratum h can hold that category.
    Per stratum q~_c = (count_c + 1/2 [c can occur]) / (n_h + 1/2 #categories that can), and
    V(q~_a) = q~_a (1 - q~_a) / n_h, C(q~_a, q~_b) = -q~_a q~_b / n_h (a multinomial share's
    variance, 0 in a census stratum); V(A) = sum_h W_h^2 V(q~_ah), likewise X.
    """
    big_n = np.asarray(strata_px, float)
    units, a, b = (np.asarray(v, float) for v in (units, a, b))
    w = big_n / big_n.sum()
    counts = np.stack(np.broadcast_arrays(a, b, units - a - b))  # (3, ..., H)
    census = units >= big_n  # sampled whole: known, no pseudo-count, no variance
    lone = (units == 1) & (big_n > 1)
    missing = (units == 0) & (big_n > 0)

    prior = np.stack(np.broadcast_arrays(*(np.asarray(c, bool) for c in (a_can, b_can, rest_can))))
    prior = prior.reshape((3,) + (1,) * (counts.ndim - prior.ndim) + prior.shape[1:])
    alpha = counts + np.where(census, 0.0, prior * JEFFREYS)
    total = alpha.sum(0)
    share = np.divide(alpha, total, out=np.zeros_like(alpha), where=total > 0)  # (3, ..., H)
    spread = np.where(census, 0.0, np.divide(1.0, units, out=np.zeros_like(units), where=units > 0))
    var_a = share[0] * (1 - share[0]) * spread
    var_b = share[1] * (1 - share[1]) * spread
    cov_ab = -share[0] * share[1] * spread
    w2 = w**2
    smooth_x = (w * (share[0] + share[1])).sum(-1)
    smooth = np.divide((w * share[0]).sum(-1), smooth_x, out=np.full_like(smooth_x, np.nan),
                       where=smooth_x > 0)  # fmt: skip

    q = np.divide(counts, units, out=np.zeros_like(counts), where=units > 0)
    big_a, big_x = (w * q[0]).sum(-1), (w * (q[0] + q[1])).sum(-1)
    estimate = np.divide(big_a, big_x, out=np.full_like(big_a, np.nan), where=big_x > 0)
    enters = np.asarray(a_can, bool) | np.asarray(b_can, bool)  # a stratum that adds to A or X
    none = ((lone & enters) | missing).any(-1) | ~(big_x > 0)
    return Smoothed(
        estimate,
        big_a,
        big_x,
        (w2 * var_a).sum(-1),
        (w2 * (var_a + var_b + 2 * cov_ab)).sum(-1),
        (w2 * (var_a + cov_ab)).sum(-1),
        smooth,
        none,
    )


def ratio_var(s: Smoothed) -> np.ndarray:
    """The linearised variance of R at the smoothed centre: (V_A - 2 R C_AX + R^2 V_X) / X^2."""
    r = s.smooth
    num = s.var_a - 2 * r * s.cov_ax + r**2 * s.var_x
    return np.maximum(np.divide(num, s.big_x**2, out=np.zeros_like(num), where=s.big_x > 0), 0)


def adjusted_wald(s: Smoothed, confidence: float) -> Bounds:
    """Agresti & Coull (1998)'s interval on the effective sample size.

    n* = R~ (1 - R~) / V(R~) (Korn & Graubard 1998's effective n; R~ the smoothed ratio, so
    n* is finite where every unit agrees), x* = R n* (R the papers' estimate); then
    n~ = n* + z^2, p~ = (x* + z^2 / 2) / n~, p~ -/+ z sqrt(p~ (1 - p~) / n~), clipped to
    [0, 1]. With one stratum n* = n: Agresti & Coull's interval itself. A variance of 0
    (every stratum a census) gives the estimate itself.
    """
    return _withheld(s, *effective_n_bounds(s.estimate, s.smooth, ratio_var(s), confidence))


def effective_n_bounds(
    estimate: np.ndarray, smooth: np.ndarray, var: np.ndarray, confidence: float
) -> Bounds:
    """:func:`adjusted_wald`'s bounds of a ratio's papers' ``estimate``, its smoothed centre
    ``smooth`` and the variance ``var`` at that centre (:func:`ratio_var`), whatever computed
    them (the check by district sums its variances its own way)."""
    z = z_of(confidence)
    n = np.divide(smooth * (1 - smooth), var, out=np.full_like(var, np.inf), where=var > 0)
    known = ~(var > 0)
    n = np.where(known, 1.0, n)
    n_t = n + z**2
    p = (estimate * n + z**2 / 2) / n_t
    half = z * np.sqrt(p * (1 - p) / n_t)
    lo = np.where(known, estimate, np.clip(p - half, 0, 1))
    hi = np.where(known, estimate, np.clip(p + half, 0, 1))
    return Bounds(lo, hi)


def fieller(s: Smoothed, confidence: float) -> Bounds:
    """Fieller's (1954) interval of R = A / X: every R with (A - R X)^2 <= z^2 (V_A - 2 R C_AX
    + R^2 V_X), the roots of a quadratic; clipped to [0, 1]. Where the denominator is not
    significantly above 0 (X^2 <= z^2 V_X) the set is unbounded: [0, 1]."""
    z2 = z_of(confidence) ** 2
    qa = s.big_x**2 - z2 * s.var_x
    qb = -2 * (s.big_a * s.big_x - z2 * s.cov_ax)
    qc = s.big_a**2 - z2 * s.var_a
    root = np.sqrt(np.maximum(qb**2 - 4 * qa * qc, 0))
    bounded = qa > 0
    safe = np.where(bounded, qa, 1.0)
    lo = np.where(bounded, np.clip((-qb - root) / (2 * safe), 0, 1), 0.0)
    hi = np.where(bounded, np.clip((-qb + root) / (2 * safe), 0, 1), 1.0)
    return _withheld(s, np.fmin(lo, s.estimate), np.fmax(hi, s.estimate))


def _withheld(s: Smoothed, lo: np.ndarray, hi: np.ndarray) -> Bounds:
    return Bounds(np.where(s.none, np.nan, lo), np.where(s.none, np.nan, hi))


def z_of(confidence: float) -> float:
    """The normal quantile of a two-sided interval, e.g. 1.959964 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError(
            f"confidence: expected a level between 0 and 1, e.g. 0.95, found {confidence!r}"
        )
    return NormalDist().inv_cdf(0.5 + confidence / 2)
