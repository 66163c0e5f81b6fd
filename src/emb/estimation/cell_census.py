"""The test split's pixels counted into (domain, cell) as one compiled loop over a strip's
planes (issue 58, item 5): numpy's bincount of a strip costs a pass to build its keys, a copy
of them as intp, and a fold of 64K bins per domain; this loop reads each pixel's map, CDL and
local district byte once and adds it to a strip-local histogram of (lane, local district, cell)
(a few hundred KB, in cache), folded into the domains once a strip. The lanes (a pixel's by
its column) keep two pixels in a row of the same cell (a field's row) from waiting on each
other's add: about 2 ns a pixel against 4 for adding whole runs (whose end is a branch the CPU
mispredicts every few pixels), about two thirds of a read of the strip's bytes.
"""

from __future__ import annotations

import numba
import numpy as np

LANES = 4  # histograms a strip is counted into, a pixel's by its column (a power of 2)


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
