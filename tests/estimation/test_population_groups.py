"""Groups of reads (a region's strips each) produced by several threads side by side and
taken in their order (:func:`emb.estimation.population.read_ahead_groups`): the chain's items
in its order, whatever the threads; groups read by different threads, each under a GDAL
environment; a producer's error in its place; every producer stopped when the taking stops."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import islice

import pytest
import rasterio

from emb.estimation.population import read_ahead_groups


def group(g: int, size: int, seen: dict[int, set[int]] | None = None) -> Iterator[tuple]:
    """``size`` items (g, i), noting the thread that produced each in ``seen``."""
    for i in range(size):
        if seen is not None:
            seen.setdefault(g, set()).add(threading.get_ident())
        yield g, i


SIZES = (3, 0, 5, 1, 4, 2, 7)  # an empty group among them


@pytest.mark.parametrize("threads", [1, 2, 3, 9])
def test_the_groups_items_come_in_their_order_whatever_the_threads(threads: int) -> None:
    groups = [group(g, size) for g, size in enumerate(SIZES)]
    want = [(g, i) for g, size in enumerate(SIZES) for i in range(size)]
    assert list(read_ahead_groups(groups, threads)) == want


def test_groups_are_read_by_threads_side_by_side_each_in_an_environment() -> None:
    """Two threads: the groups dealt in turn, neither read by the taking thread; each
    producer's reads find a GDAL environment (no rasterio.open sets up its own)."""
    seen: dict[int, set[int]] = {}
    envs: list[bool] = []

    def noted(g: int) -> Iterator[tuple]:
        envs.append(rasterio.env.hasenv())
        yield from group(g, 2, seen)

    list(read_ahead_groups([noted(g) for g in range(6)], threads=2))
    assert envs == [True] * 6
    assert all(len(ids) == 1 for ids in seen.values())
    producers = [next(iter(seen[g])) for g in range(6)]
    assert producers[0::2] == [producers[0]] * 3 and producers[1::2] == [producers[1]] * 3
    assert producers[0] != producers[1] and threading.get_ident() not in producers


def endless(g: int) -> Iterator[tuple]:
    """Items (g, 0), (g, 1), ... without end."""
    i = 0
    while True:
        yield g, i
        i += 1


def test_an_error_is_raised_in_its_place_every_producer_stopped() -> None:
    """Group 1 fails after an item (its thread's error ready while group 0 is taken), group 2
    (the other thread's) is endless: group 0's items, group 1's, then its error, the endless
    producer stopped by then though the error (its traceback) is still held."""

    def failing(g: int, after: int) -> Iterator[tuple]:
        yield from group(g, after)
        raise ValueError(f"group {g} failed")

    before = {t.ident for t in threading.enumerate()}
    taken = []
    with pytest.raises(ValueError, match="group 1 failed") as caught:
        groups = [group(0, 3), failing(1, 1), endless(2)]
        for item in islice(read_ahead_groups(groups, threads=2), 1000):  # endless: bounded
            taken.append(item)
    assert taken == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert caught.value is not None
    assert not [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]


def test_closing_stops_every_producer() -> None:
    """Endless groups, one item taken, then closed: no producer left running."""
    before = {t.ident for t in threading.enumerate()}
    taken = read_ahead_groups([endless(g) for g in range(3)], threads=3)
    assert next(taken) == (0, 0)
    taken.close()
    assert not [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
