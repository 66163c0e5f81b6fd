"""Ordered work in threads: file and GDAL reads and numpy's large-array loops release the GIL,
so the next item's work overlaps this one's on few cores, with a bounded number held."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def read_ahead(items: Iterator[T]) -> Iterator[T]:
    """``items``, each produced in a thread while the caller works on the one before.

    File and GDAL reads and numpy's large-array loops release the GIL, so on two cores
    reading the next tile overlaps encoding this one (bench/data.py). Memory holds at most
    two items.
    """
    done = object()
    with ThreadPoolExecutor(1, thread_name_prefix="read-ahead") as pool:
        pending = pool.submit(next, items, done)
        while (item := pending.result()) is not done:
            pending = pool.submit(next, items, done)
            yield item


def in_threads(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) in order, up to ``workers`` computed at once (numpy's loops release
    the GIL); at most ``workers`` items are held, however long ``items`` is."""
    with ThreadPoolExecutor(max(workers, 1), "stats") as pool:
        pending: deque = deque()
        for item in items:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) >= workers:
                item, future = pending.popleft()
                yield item, future.result()
        while pending:
            item, future = pending.popleft()
            yield item, future.result()
