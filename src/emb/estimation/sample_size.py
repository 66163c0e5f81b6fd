"""How many units to label, and where: the allocation that gives each reported class an area
interval of relative half-width at most a target, from a pilot's error matrix.

A class k's area share under stratified random sampling (strata h = the map's classes) is
p_k = sum_h W_h q_hk, q_hk its share of stratum h, with variance
V_k = sum_h W_h^2 S_hk^2 (1 / n_h - 1 / N_h), S_hk^2 = q_hk (1 - q_hk) (Cochran 1977, 5.25;
Olofsson et al. 2014, eq. 13, does the same for overall accuracy). The target, a half-width
z sqrt(V_k) <= r p_k, fixes V_k. For one class, Neyman's allocation n_h ~ W_h S_hk reaches it
with the fewest units, n = (sum_h W_h S_hk)^2 / (V_k + sum_h W_h S_hk^2 / N) (Cochran 5.26).
Every reported class (at least ``min_share`` of the mapped area) is served by the per-stratum
maximum of their Neyman allocations: each class's variance only falls as any n_h grows. Then
the minimum per stratum, and no stratum above its pixels (a census adds no variance).

A pilot stratum whose units saw no unit of class k (or only such units) has not shown that
q_hk = 0 (or 1): a pilot that saw no omission has not shown there is none. Such a share is
taken at its Clopper-Pearson bound, 1 - ((1 - c) / 2)^(1 / m_h) from the nearer end (m_h the
pilot's units in the stratum, c the confidence), so the allocation leaves room for errors the
pilot could not see. The estimate p_k itself is the pilot's (Olofsson's), unfloored.

The interval a sample will get adds a pseudo-count to each stratum's shares
(:mod:`emb.estimation.intervals`), which widens it most where a stratum is small: the expected
half-width counts it, and Neyman's allocation is taken on those shares at the units it gives,
round after round, until it no longer changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emb.estimation.intervals import z_of
from emb.estimation.settings import AreaSettings
from emb.io import read_json, write_json

MAX_ROUNDS = 30  # rounds of Neyman's allocation on the pseudo-counted shares (a fixed point)


class SampleSizeError(ValueError):
    """A pilot or a target that cannot give an allocation."""


@dataclass(frozen=True)
class SampleSize:
    """An allocation for strata of ``strata_px`` pixels: ``units`` (H,) per stratum;
    ``targeted`` (K,) bool, the reported classes; ``share`` (K,) the pilot's area shares;
    ``expected`` (K,) each class's expected relative half-width under ``units`` (NaN where a
    class has no area in the pilot); ``target`` the relative half-width asked for."""

    units: np.ndarray
    targeted: np.ndarray
    share: np.ndarray
    expected: np.ndarray
    target: float
    confidence: float

    @property
    def total(self) -> int:
        return int(self.units.sum())

    def expected_where_targeted(self) -> tuple[float | None, ...]:
        """Each class's expected relative half-width where it is targeted, else None."""
        return tuple(float(e) if t else None for e, t in zip(self.expected, self.targeted,
                                                              strict=True))  # fmt: skip


def pilot_shares(error_matrix: np.ndarray, confidence: float) -> np.ndarray:
    """(H, K) each stratum's reference shares from a pilot's counts (row = stratum), a share
    of 0 or 1 moved to its Clopper-Pearson bound for the stratum's pilot units."""
    counts = np.asarray(error_matrix, float)
    units = counts.sum(1, keepdims=True)
    if (units <= 0).any():
        empty = int(np.flatnonzero(units[:, 0] <= 0)[0])
        raise SampleSizeError(f"pilot: stratum {empty} has no unit: its shares are unknown")
    share = counts / units
    bound = 1 - ((1 - confidence) / 2) ** (1 / units)  # the most a share of 0 may be
    return np.clip(share, bound, 1 - bound)


def allocation(
    strata_px: np.ndarray, pilot: np.ndarray, target: float, min_share: float,
    min_per_stratum: int, confidence: float,
) -> SampleSize:  # fmt: skip
    """The units per stratum that give every class with at least ``min_share`` of the mapped
    area a relative half-width of at most ``target`` at ``confidence``, from the pilot's error
    matrix (H, K) counts (rows: strata = the map's classes, H = K) over strata of
    ``strata_px`` pixels (the design's, which may be another area than the pilot's)."""
    big_n = np.asarray(strata_px, float)
    pilot = np.asarray(pilot)
    if not 0 < target < 1:
        raise SampleSizeError(f"target: expected a relative half-width in (0, 1), found {target}")
    if pilot.shape != (len(big_n), len(big_n)):
        raise SampleSizeError(
            f"pilot: expected a ({len(big_n)}, {len(big_n)}) error matrix (a row and a column "
            f"per stratum), found {pilot.shape}"
        )
    has = big_n > 0
    w = big_n / big_n.sum()
    z = z_of(confidence)
    q_est, q = np.zeros(pilot.shape), np.zeros(pilot.shape)
    q_est[has] = pilot[has] / np.maximum(pilot[has].sum(1, keepdims=True), 1)
    q[has] = pilot_shares(pilot[has], confidence)
    share = w @ q_est
    targeted = (w >= min_share) & (share > 0)
    floor = np.minimum(np.full(len(big_n), min_per_stratum, float), big_n)
    units = floor.astype(np.int64)
    seen = q
    for _ in range(MAX_ROUNDS):  # Neyman on the shares the interval will see at these n_h
        wanted = floor.copy()
        for k in np.flatnonzero(targeted):
            wanted = np.maximum(wanted, np.ceil(_neyman(w, seen[:, k], big_n, share[k], target,
                                                        z)))  # fmt: skip
        step = np.minimum(wanted, big_n).astype(np.int64)
        if np.array_equal(step, units):
            break
        units, seen = step, _as_seen(q, step, big_n)
    return SampleSize(units, targeted, share, expected_half_width(big_n, units, q, share, z),
                      target, confidence)  # fmt: skip


def _neyman(
    w: np.ndarray, q: np.ndarray, big_n: np.ndarray, share: float, target: float, z: float
) -> np.ndarray:
    """(H,) Neyman's allocation for one class's area share at the target (Cochran 5.26)."""
    var = (target * share / z) ** 2
    spread = w * np.sqrt(q * (1 - q))
    n = spread.sum() ** 2 / (var + (w * q * (1 - q)).sum() / big_n.sum())
    return np.divide(n * spread, spread.sum(), out=np.zeros(len(w)), where=spread.sum() > 0)


def _as_seen(q: np.ndarray, units: np.ndarray, big_n: np.ndarray) -> np.ndarray:
    """The shares with the interval's pseudo-count at n_h units, (n_h q + 1/2) / (n_h + 1); a
    census's as they are."""
    n = np.asarray(units, float)[:, None]
    return np.where(n < np.asarray(big_n, float)[:, None], (n * q + 0.5) / (n + 1), q)


def expected_half_width(
    strata_px: np.ndarray, units: np.ndarray, q: np.ndarray, share: np.ndarray, z: float
) -> np.ndarray:
    """(K,) z sqrt(V_k) / p_k for the allocation ``units`` (NaN where p_k = 0), each share as
    the interval will see it: with its pseudo-count, (n_h q + 1/2) / (n_h + 1)
    (:mod:`emb.estimation.intervals`), which a small stratum feels most."""
    big_n = np.asarray(strata_px, float)
    w = big_n / big_n.sum()
    n = np.asarray(units, float)[:, None]
    seen = _as_seen(q, units, big_n)
    fpc = np.maximum(_inverse(n) - _inverse(big_n[:, None]), 0)  # 1/n_h - 1/N_h; 0 if empty
    var = (w[:, None] ** 2 * seen * (1 - seen) * fpc).sum(0)
    return np.divide(z * np.sqrt(var), share, out=np.full(len(share), np.nan), where=share > 0)


def _inverse(values: np.ndarray) -> np.ndarray:
    """1 / values, 0 where a value is 0 (an empty stratum: no units, no variance)."""
    return np.divide(1.0, values, out=np.zeros(values.shape), where=values > 0)


def write_sample_size(
    path: Path, size: SampleSize, pilot: np.ndarray, settings: AreaSettings
) -> None:
    """``{run}_sample_size.json``: the pilot (the test split's error matrix at the design's
    level, rows = strata), the target, and the recommendation over the test split's strata;
    ``sample_design`` with ``n: auto`` allocates on its own strata from the same pilot."""
    record = {
        "level": settings.level, "confidence": settings.confidence, "target": size.target,
        "min_share": settings.min_share, "min_per_class": settings.min_per_class,
        "pilot": np.asarray(pilot).tolist(), "units": size.units.tolist(),
        "targeted": size.targeted.tolist(), "share": size.share.tolist(),
        "expected_half_width": [None if np.isnan(v) else float(v) for v in size.expected],
    }  # fmt: skip
    write_json(path, record)


def read_pilot(path: Path, level: int) -> np.ndarray:
    """The pilot error matrix of a ``{run}_sample_size.json`` written at ``level``."""
    data = read_json(path, "sample size record", "rerun area_estimates")
    if not isinstance(data, dict) or "pilot" not in data or data.get("level") != level:
        found = data.get("level") if isinstance(data, dict) else type(data).__name__
        raise SampleSizeError(
            f"{path}: expected a sample size record at level {level} with its pilot, found "
            f"level {found!r}"
        )
    return np.asarray(data["pilot"], np.int64)
