"""The sample design's per-pixel passes over a strip, as compiled loops (numba): the first
pass counts a strip's pixels per (local district, map value) key, the second walks a strip in
scan order (row-major), counting each stratum's pixels as it goes, and records the pixels whose
rank within their stratum was drawn. numpy's bincounts and stable sorts cost several passes
over a strip and an int64 copy of it; one loop costs about what decoding the strip costs
(``bench/state_scale.py``). The loops release the GIL, so a reader thread's decode
(:func:`emb.estimation.population.read_ahead`) may run beside them.

A pixel's key is ``local * 256 + value`` (``local`` its district's index among those near the
strip, :func:`emb.estimation.districts.district_burn`), or ``value`` alone where no local plane
is given (a strip in one district, a design without districts); ``strata_of[key]`` is its
stratum, NO_STRATUM (nodata) for none.
"""

from __future__ import annotations

import numba
import numpy as np

NO_STRATUM = -1  # strata_of's entry for a key of no stratum (nodata)
ALL_FOUND = np.iinfo(np.int64).max  # a stratum's next drawn rank once all are found


LANES = 4  # count_keys's histograms, one for every LANES-th pixel


@numba.njit(cache=True, nogil=True)
def count_keys(values: np.ndarray, local: np.ndarray | None, counts: np.ndarray) -> None:
    """Add to ``counts`` (int64, 256 per local district) a strip's pixels per key; ``values``
    (n,) uint8 and ``local`` (n,) uint8 or uint16 or None, flat in scan order. Pixel p goes
    to histogram p % LANES, the histograms summed at the end: in one, a map's runs of one
    value (a field) make each add wait for the one before to the same count (2.6x slower on
    the bench's maps: 1.6 against 0.6 ms a Mpx, measured 2026-12-07)."""
    width = counts.size
    lanes = np.zeros(LANES * width, np.int64)
    whole = values.size - values.size % LANES
    if local is None:
        for p in range(0, whole, LANES):
            for lane in range(LANES):
                lanes[lane * width + values[p + lane]] += 1
        for p in range(whole, values.size):
            lanes[values[p]] += 1
    else:
        for p in range(0, whole, LANES):
            for lane in range(LANES):
                lanes[lane * width + np.int64(local[p + lane]) * 256 + values[p + lane]] += 1
        for p in range(whole, values.size):
            lanes[np.int64(local[p]) * 256 + values[p]] += 1
    for key in range(width):
        for lane in range(LANES):
            counts[key] += lanes[lane * width + key]


def warm() -> None:
    """Load the compiled loops now: numba's first call in a process takes ~0.6 s (its compiler
    set up, the cache read), a later one's new types ~0.01 s; worker processes forked after it
    inherit them instead of each paying it."""
    count_keys(np.zeros(LANES, np.uint8), None, np.zeros(256, np.int64))


@numba.njit(cache=True, nogil=True)
def pick_ranked(
    values: np.ndarray, local: np.ndarray | None, strata_of: np.ndarray, seen: np.ndarray,
    next_rank: np.ndarray, taken: np.ndarray, ends: np.ndarray, ranks: np.ndarray,
    found_at: np.ndarray, found_in: np.ndarray,
) -> int:  # fmt: skip
    """Walk a strip (``values``, ``local`` as :func:`count_keys` takes them) in scan order;
    the number m of drawn pixels it holds, their positions in it in ``found_at[:m]`` (scan
    order) and their strata in ``found_in[:m]``. Per stratum h: ``seen[h]`` its pixels passed
    so far (counted on), ``ranks[taken[h]:ends[h]]`` its drawn ranks not found yet (sorted),
    ``next_rank[h]`` the first of them (ALL_FOUND past the last); a pixel whose count before
    it equals its stratum's next rank is drawn, and taken. ``found_at``/``found_in`` hold at
    least the drawn ranks not found yet: no more can be found, whatever the strip holds."""
    for key in range(strata_of.size):  # a stratum past ``seen`` would write beyond it
        if strata_of[key] >= seen.size:
            raise ValueError("strata_of names a stratum past the end of seen")
    m = 0
    for p in range(values.size):
        key = np.int64(values[p]) if local is None else np.int64(local[p]) * 256 + values[p]
        h = strata_of[key]
        if h < 0:
            continue
        before = seen[h]
        seen[h] = before + 1
        if before == next_rank[h]:
            found_at[m] = p
            found_in[m] = h
            m += 1
            t = taken[h] + 1
            taken[h] = t
            next_rank[h] = ranks[t] if t < ends[h] else ALL_FOUND
    return m
