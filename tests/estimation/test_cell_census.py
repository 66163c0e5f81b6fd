"""The compiled count of a strip's planes into (domain, cell) (issue 58, item 5), set against a
count of its own in numpy: each pixel of the spans put in its cell by comparisons (not the cell
table), its domain looked up, added with ``np.add.at``; planes with runs (a field's row) and
speckle, 255 and foreign values on either side, gaps between spans, many local districts."""

from __future__ import annotations

import numpy as np
import pytest

from emb.classes import IGNORE, N_L3
from emb.estimation.cell_census import add_census
from emb.estimation.holdout_counts import CELL_OF, CELLS, FOREIGN, UNLABELLED


def numpy_census(
    n_domains: int, ids: np.ndarray, mapped: np.ndarray, reference: np.ndarray,
    local: np.ndarray, spans: list[tuple[int, int]],
) -> np.ndarray:  # fmt: skip
    """(n_domains, CELLS) pixels per (domain, cell) of the spans' columns, pixel by pixel."""
    columns = np.concatenate([np.arange(a, b) for a, b in spans])
    m = mapped[:, columns].astype(np.int64).ravel()
    r = reference[:, columns].astype(np.int64).ravel()
    domain = ids[local[:, columns].astype(np.int64).ravel()]
    foreign = ((m >= N_L3) & (m != IGNORE)) | ((r >= N_L3) & (r != IGNORE))
    cell = np.where((m < N_L3) & (r < N_L3), m * N_L3 + r, UNLABELLED)
    cell = np.where(foreign, FOREIGN, cell)
    out = np.zeros((n_domains, CELLS), np.int64)
    np.add.at(out, (domain, cell), 1)
    return out


def field_plane(rng: np.random.Generator, shape: tuple[int, int], values: np.ndarray) -> np.ndarray:
    """(h, w) uint8 runs of 1 to 12 equal pixels of ``values``, rows continuing each other's
    runs, with a tenth of the pixels speckled."""
    size = shape[0] * shape[1]
    lengths = rng.integers(1, 13, size)
    runs = np.repeat(rng.choice(values, size), lengths)[:size]
    speckle = rng.random(size) < 0.1
    runs[speckle] = rng.choice(values, int(speckle.sum()))
    return runs.reshape(shape).astype(np.uint8)


VALUES = np.concatenate([np.arange(N_L3), [IGNORE] * 8, [N_L3, 99, 254]])  # 255, foreign among


@pytest.mark.parametrize(("n_local", "dtype"), [(1, np.uint8), (5, np.uint8), (300, np.uint16)])
def test_the_compiled_census_is_a_pixel_by_pixel_count(n_local: int, dtype: type) -> None:
    """Local districts by runs too (a district's part of a row), up to 300 (uint16: the key's
    high bits), their ids scattered over 1,000 domains; spans with gaps before, between and
    after them."""
    rng = np.random.default_rng(n_local)
    shape = (37, 150)
    mapped, reference = field_plane(rng, shape, VALUES), field_plane(rng, shape, VALUES)
    local = field_plane(rng, shape, np.arange(min(n_local, 256))).astype(dtype)
    if n_local > 256:
        local += rng.integers(0, n_local - 255, shape).astype(dtype)
    ids = np.concatenate([[0], np.sort(rng.choice(np.arange(1, 1000), n_local - 1, False))])
    spans = [(3, 40), (40, 41), (57, 100), (120, 149)]
    cells = np.zeros((1000, CELLS), np.int64)
    add_census(cells, ids, CELL_OF, mapped, reference, local, np.array(spans, np.int64))
    want = numpy_census(1000, ids, mapped, reference, local, spans)
    assert want[:, FOREIGN].sum() > 0 and want[:, UNLABELLED].sum() > 0
    assert (want.sum(1) > 0).sum() >= min(n_local, 257)  # past uint8 when it may
    assert np.array_equal(cells, want)


def test_one_domain_from_a_broadcast_zero_and_counts_added_to_those_held() -> None:
    """Without districts the local plane is a broadcast 0 (no array a strip): every pixel in
    ``ids[0]``; a second strip adds to the first's counts."""
    rng = np.random.default_rng(7)
    mapped, reference = field_plane(rng, (20, 64), VALUES), field_plane(rng, (20, 64), VALUES)
    zero = np.broadcast_to(np.uint8(0), mapped.shape)
    ids, spans = np.array([4]), [(0, 64)]
    cells = np.zeros((6, CELLS), np.int64)
    for _ in range(2):
        add_census(cells, ids, CELL_OF, mapped, reference, zero, np.array(spans, np.int64))
    assert np.array_equal(cells, 2 * numpy_census(6, ids, mapped, reference, zero, spans))
    assert cells[4].sum() == 2 * mapped.size


def test_a_run_through_a_gap_counts_only_its_pixels_in_the_spans() -> None:
    """One class everywhere, so one run would cross each gap: only the spans' pixels count."""
    mapped = np.full((3, 10), 7, np.uint8)
    zero = np.broadcast_to(np.uint8(0), mapped.shape)
    cells = np.zeros((1, CELLS), np.int64)
    add_census(cells, np.array([0]), CELL_OF, mapped, mapped, zero,
               np.array([(1, 3), (6, 8)], np.int64))  # fmt: skip
    assert cells[0, 7 * N_L3 + 7] == 3 * 4
    assert cells.sum() == 3 * 4
