"""The test split's pixels counted into (domain, cell) as one compiled loop over a strip's
planes (issue 58, item 5): numpy's bincount of a strip costs a pass to build its keys, a copy
of them as intp, and a fold of 64K bins per domain; this loop reads each pixel's map, CDL and
local district byte once and adds whole runs of equal pixels (a field's row is one run), so a
strip costs about one read of its bytes.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def add_census(
    cells: np.ndarray, ids: np.ndarray, cell_of: np.ndarray, mapped: np.ndarray,
    reference: np.ndarray, local: np.ndarray, spans: np.ndarray,
) -> None:  # fmt: skip
    """Add to ``cells`` (D + 1, CELLS) int64 the pixels of the columns ``spans`` ((k, 2) int64
    col0, col1, sorted and disjoint) of a strip's (h, w) uint8 planes ``mapped`` and
    ``reference``: a pixel's cell ``cell_of[map << 8 | CDL]``, its domain ``ids[local]``
    (``local`` (h, w) uint8 or uint16, e.g. a broadcast 0 for one domain). A run of pixels
    with the same (local, map, CDL) is added once, as it ends (GIL released: a reader thread
    may decode the next strip meanwhile)."""
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
