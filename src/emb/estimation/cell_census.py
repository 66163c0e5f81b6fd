"""The test split's pixels counted into (domain, cell) as one compiled loop over a strip's
planes (issue 58, item 5): numpy's bincount of a strip costs a pass to build its keys, a copy
of them as intp, and a fold of 64K bins per domain; this loop reads each pixel's map, CDL and
local district byte once. A strip with few districts near it (nearly all) adds each pixel to a
strip-local histogram of (lane, local district, cell) (a few hundred KB, in cache), folded into
the domains once: the lanes (a pixel's by its column) keep two pixels in a row of the same cell
(a field's row) from waiting on each other's add, about 2 ns a pixel. A strip with many
districts near it adds whole runs of equal pixels instead (no histogram growing with them),
about 4 ns a pixel: a run's end, every few pixels, is a branch the CPU mispredicts.
"""

from __future__ import annotations

import numba
import numpy as np

LANES = 4  # histograms a strip is counted into, a pixel's by its column (a power of 2)
LANE_LOCALS = 16  # districts near a strip up to which it is counted by lanes (~2 MB of them)


@numba.njit(cache=True, nogil=True)
def add_census(
    cells: np.ndarray, ids: np.ndarray, cell_of: np.ndarray, mapped: np.ndarray,
    reference: np.ndarray, local: np.ndarray, spans: np.ndarray,
) -> None:  # fmt: skip
    """Add to ``cells`` (D + 1, CELLS) int64 the pixels of the columns ``spans`` ((k, 2) int64
    col0, col1, sorted and disjoint) of a strip's (h, w) uint8 planes ``mapped`` and
    ``reference``: a pixel's cell ``cell_of[map << 8 | CDL]``, its domain ``ids[local]``
    (``local`` (h, w) uint8 or uint16, e.g. a broadcast 0 for one domain; ``ids`` (L + 1,)
    int64). GIL released: a reader thread may decode the next strip meanwhile."""
    if ids.size > LANE_LOCALS:
        _add_runs(cells, ids, cell_of, mapped, reference, local, spans)
        return
    hist = np.zeros((LANES, ids.size, cells.shape[1]), np.int64)
    for row in range(mapped.shape[0]):
        for s in range(spans.shape[0]):
            for col in range(spans[s, 0], spans[s, 1]):
                key = (np.int64(mapped[row, col]) << 8) | np.int64(reference[row, col])
                hist[col & (LANES - 1), local[row, col], cell_of[key]] += 1
    for lane in range(LANES):
        for near in range(ids.size):
            for cell in range(cells.shape[1]):
                cells[ids[near], cell] += hist[lane, near, cell]


def warm() -> None:
    """Load the compiled loop now: numba's first call in a process takes ~0.6 s (its compiler
    set up, the cache read); worker processes forked after it inherit it instead of each paying
    it."""
    plane = np.zeros((1, 1), np.uint8)
    add_census(np.zeros((1, 1), np.int64), np.zeros(1, np.int64), np.zeros(65536, np.uint16),
               plane, plane, plane, np.zeros((1, 2), np.int64))  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _add_runs(
    cells: np.ndarray, ids: np.ndarray, cell_of: np.ndarray, mapped: np.ndarray,
    reference: np.ndarray, local: np.ndarray, spans: np.ndarray,
) -> None:  # fmt: skip
    """:func:`add_census` a run of pixels with the same (local, map, CDL) at a time, added
    once, as it ends."""
    held, run = -1, 0
    for row in range(mapped.shape[0]):
        for s in range(spans.shape[0]):
            for col in range(spans[s, 0], spans[s, 1]):
                key = (
                    (np.int64(local[row, col]) << 16)
                    | (np.int64(mapped[row, col]) << 8)
                    | np.int64(reference[row, col])
                )
                if key == held:
                    run += 1
                    continue
                if run:
                    cells[ids[held >> 16], cell_of[held & 0xFFFF]] += run
                held, run = key, 1
    if run:
        cells[ids[held >> 16], cell_of[held & 0xFFFF]] += run
