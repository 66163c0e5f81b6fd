"""Tiles half a tile off the grid, where the grid's own tiles leave labelled pixels unused.

The CRS-anchored grid cuts a small area (or a field between holes) into pieces that are each
under ``min_valid`` of a tile, so none is kept. A tile on the same grid shifted by half a tile
(the half-tile lattice is CRS-anchored too, so neighbouring regions' tiles still line up) may
hold such pieces together. It is kept when it holds ``min_valid`` of a tile of labelled pixels
that no kept tile holds (so it never just repeats one), lies wholly inside one block of the
train split, and passes the split buffer; the best one first, until none does. Only training
tiles overlap this way: validation and test tiles never do, so a scored pixel counts once. On
regions many tiles wide the dropped tiles are slivers at the edge, which no shifted tile can
gather: their tiles stay those of the grid. Pieces in blocks of different splits stay apart:
that is the limit the split design sets (``bench/tile_coverage.py`` measures it).

Bookkeeping is per half-tile cell (every candidate tile is 2 x 2 cells), so a cell's labelled
pixels are counted once, whatever the count is (a label raster, or a footprint's area).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rasterio.windows import Window

Cell = tuple[int, int]  # (row, col) of a half-tile cell's top-left pixel


def fill_windows(
    dropped: list[Window],
    kept: list[Window],
    size: int,
    need: float,
    labelled_in: Callable[[Window], int],
    accept: Callable[[Window], str | None],
) -> list[tuple[Window, str, int]]:
    """Shifted windows to keep, with their split and labelled pixels: candidates are the
    half-tile neighbours of the ``dropped`` grid windows (those that held labelled pixels but
    too few); ``kept`` are the grid's kept windows; ``need`` the labelled pixels a tile must
    hold (and, here, hold unused); ``accept`` gives a window's split or None (straddles a
    block edge, within the buffer). ``size`` must be even."""
    half = size // 2
    counts: dict[Cell, int] = {}
    covered = {c for w in kept for c in _cells(_origin(w), half)}

    def count(cell: Cell) -> int:
        if cell not in counts:
            counts[cell] = labelled_in(Window(cell[1], cell[0], half, half))
        return counts[cell]

    def fresh(rc: Cell) -> int:
        return sum(count(c) for c in _cells(rc, half) if c not in covered)

    origins = {
        (w.row_off + dr, w.col_off + dc)
        for w in dropped
        for dr in (-half, 0, half)
        for dc in (-half, 0, half)
        if dr or dc
    }
    heap = [(-fresh(rc), rc) for rc in origins]  # fresh counts only fall: re-check at the top
    heapq.heapify(heap)
    out = []
    while heap:
        negative, rc = heapq.heappop(heap)
        now = fresh(rc)
        if now != -negative:
            heapq.heappush(heap, (-now, rc))
            continue
        if now < need:
            break
        win = Window(rc[1], rc[0], size, size)
        split = accept(win)
        if split is not None:
            covered.update(_cells(rc, half))
            out.append((win, split, sum(count(c) for c in _cells(rc, half))))
    return out


def _origin(win: Window) -> Cell:
    return win.row_off, win.col_off


def _cells(rc: Cell, half: int) -> list[Cell]:
    r, c = rc
    return [(r, c), (r, c + half), (r + half, c), (r + half, c + half)]
