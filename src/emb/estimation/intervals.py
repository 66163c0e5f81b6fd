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


def area_by_stratum(
    strata_px: np.ndarray, units: np.ndarray, hits: np.ndarray, confidence: float
) -> Bounds:
    """:func:`area` of counts laid out stratum by stratum, many domains at once: strata_px
    (..., H) N_h of each domain (broadcast against units); units (..., H) n_h; hits (..., H, K)
    the units of reference k per stratum, K >= 2; bounds (..., K). Bit for bit ``area(
    strata_px, units[..., None, :], swapaxes(hits, -1, -2), confidence)`` of each domain (the
    layout in which :func:`area`'s sums run one stratum after another), at a fraction of its
    cost: only the two categories an area has (the third, units of neither, is empty), and
    each stratum's terms of a class without a hit there (most: a stratum's units fall in a
    few classes) computed once per stratum, not once per class; every term is the one
    :func:`smoothed` computes, every sum over the strata taken in its order."""
    big_n = np.broadcast_to(np.asarray(strata_px, float), np.shape(units))
    w = big_n / big_n.sum(-1, keepdims=True)
    n = np.asarray(units, float)
    census = n >= big_n
    prior = np.where(census, 0.0, JEFFREYS)
    spread = np.where(census, 0.0, np.divide(1.0, n, out=np.zeros_like(n), where=n > 0))
    sums = dict(zip(_AREA_TERMS, _summed_terms(np.asarray(hits), n, w, prior, spread),
                    strict=True))  # fmt: skip
    smooth_x = sums["smooth_x"]
    smooth = np.divide(sums["smooth_a"], smooth_x, out=np.full_like(smooth_x, np.nan),
                       where=smooth_x > 0)  # fmt: skip
    big_a, big_x = sums["big_a"], sums["big_x"]
    estimate = np.divide(big_a, big_x, out=np.full_like(big_a, np.nan), where=big_x > 0)
    lone = (n == 1) & (big_n > 1)
    missing = (n == 0) & (big_n > 0)
    none = (lone | missing).any(-1)[..., None] | ~(big_x > 0)
    got = Smoothed(estimate, big_a, big_x, sums["var_a"], sums["var_x"], sums["cov_ax"], smooth,
                   none)  # fmt: skip
    return adjusted_wald(got, confidence)


def _summed_terms(
    hits: np.ndarray, n: np.ndarray, w: np.ndarray, prior: np.ndarray, spread: np.ndarray
) -> np.ndarray:
    """(terms, ..., K) each of :func:`_area_terms`' sums over the strata of hits (..., H, K),
    one stratum after another (the order :func:`area`'s layout sums in, each sum starting
    from its first stratum's term): per stratum, every class takes the stratum's no-hit term
    but the few with hits there, which take theirs. Sums of a few classes per domain at a
    time, held in cache, not one array of every term."""
    lead, (strata, k) = hits.shape[:-2], hits.shape[-2:]
    terms = len(_AREA_TERMS)
    by_stratum = np.ascontiguousarray(np.moveaxis(hits, -2, 0))  # (H, ..., K): h by h
    at = np.flatnonzero(by_stratum)
    stratum, rest = np.divmod(at, by_stratum.size // strata)
    row, cls = np.divmod(rest, k)
    each = (np.ravel(v)[row * strata + stratum] for v in (n, w, prior, spread))
    some = np.stack(_area_terms(by_stratum.ravel()[at].astype(float), *each, some=True), -1)
    none = np.stack(_area_terms(np.zeros_like(n), n, w, prior, spread))  # (terms, ..., H)
    none = np.ascontiguousarray(np.moveaxis(none.reshape(terms, -1, strata), -1, 0))
    ends = np.cumsum(np.bincount(stratum, minlength=strata)).tolist()
    rows = none.shape[-1]
    sums = np.empty((k, terms, rows))  # a class's sums, each a row per (..., ) of the lead
    flat = sums.reshape(-1)
    place = (cls * terms * rows + row)[:, None] + np.arange(terms) * rows  # (entries, terms)
    for h in range(strata):  # stratum after stratum
        mine = slice(ends[h - 1] if h else 0, ends[h])  # this stratum's entries
        to = place[mine]
        if h == 0:
            sums[:] = none[0]
            flat[to] = some[mine]
        else:
            before = flat[to]
            sums += none[h]
            flat[to] = before + some[mine]
    return np.moveaxis(sums, 0, -1).reshape((terms, *lead, k))


_AREA_TERMS = ("smooth_x", "smooth_a", "big_a", "big_x", "var_a", "var_x", "cov_ax")


def _area_terms(
    a: np.ndarray, n: np.ndarray, w: np.ndarray, prior: np.ndarray, spread: np.ndarray,
    some: bool = False,
) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Each stratum's term of every sum of :func:`smoothed` for an area (``_AREA_TERMS``), of
    ``a`` hits among ``n`` units, elementwise, as :func:`smoothed` computes them (``some``:
    every a > 0, so n > 0 and no division needs its guard)."""
    b = n - a
    alpha_a, alpha_b = a + prior, b + prior
    total = alpha_a + alpha_b  # + the third category's alpha, 0
    if some:
        share_a, share_b, q_a, q_b = alpha_a / total, alpha_b / total, a / n, b / n
    else:
        share_a = np.divide(alpha_a, total, out=np.zeros_like(total), where=total > 0)
        share_b = np.divide(alpha_b, total, out=np.zeros_like(total), where=total > 0)
        q_a = np.divide(a, n, out=np.zeros_like(a), where=n > 0)
        q_b = np.divide(b, n, out=np.zeros_like(b), where=n > 0)
    var_a = share_a * (1 - share_a) * spread
    var_b = share_b * (1 - share_b) * spread
    cov_ab = -share_a * share_b * spread
    w2 = w**2
    return (w * (share_a + share_b), w * share_a, w * q_a, w * (q_a + q_b), w2 * var_a,
            w2 * (var_a + var_b + 2 * cov_ab), w2 * (var_a + cov_ab))  # fmt: skip


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
    z = z_of(confidence)
    var = ratio_var(s)
    n = np.divide(s.smooth * (1 - s.smooth), var, out=np.full_like(var, np.inf), where=var > 0)
    known = ~(var > 0)
    n = np.where(known, 1.0, n)
    n_t = n + z**2
    p = (s.estimate * n + z**2 / 2) / n_t
    half = z * np.sqrt(p * (1 - p) / n_t)
    lo = np.where(known, s.estimate, np.clip(p - half, 0, 1))
    hi = np.where(known, s.estimate, np.clip(p + half, 0, 1))
    return _withheld(s, lo, hi)


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
