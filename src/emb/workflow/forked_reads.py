"""Many small file checks across the machine's cores, in order: rasterio holds the GIL while it
builds each raster's CRS (~half of an open), so reader threads overlap little of it; forked
processes do. Below a threshold, or off Linux, threads as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from emb.forks import cores, fork_allowed, in_parts, sendable, shares
from emb.threads import in_threads

T = TypeVar("T")

# Items from which forking pays: a worker starts in ~20-50 ms (a copy-on-write fork of the
# parsing process) and checks ~300-500 rows a second.
FORK_FROM = 200
MAX_PROCESSES = 4  # a login node's share; each reads ~1,000 rasters a second


def processes() -> int:
    """The cores this process may run on, at most MAX_PROCESSES."""
    return cores(MAX_PROCESSES)


def in_order(
    fn: Callable[[T], dict[str, object]], items: Sequence[T], threads: int
) -> Iterator[tuple[T, dict[str, object]]]:
    """(item, fn(item)) in order: in forked processes for many items on several cores
    (:func:`emb.forks.in_parts`, a few dozen items a part), else in ``threads`` threads
    (emb.threads.in_threads). ``fn`` returns a dict of plain values, or of exceptions it caught
    (sent back whole where they pickle, else as RuntimeError with their type and text)."""
    workers = processes()
    if len(items) < FORK_FROM or workers < 2 or not fork_allowed():
        yield from in_threads(fn, items, threads)
        return
    parts = shares(items, workers * 8)  # a few dozen per part: little pickling overhead

    def read(part: int) -> list[dict[str, object]]:
        return [{key: sendable(value) for key, value in fn(item).items()} for item in parts[part]]

    for part, found in zip(parts, in_parts(read, len(parts), workers), strict=True):
        yield from zip(part, found, strict=True)
