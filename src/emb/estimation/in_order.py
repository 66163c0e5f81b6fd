"""Work on items by a pool of threads, the results taken in the items' order: the sample
design reads and decodes a map per item (GDAL, numba's loops and hashlib let go of the GIL),
so with two threads both cores decode, where a single reader thread ahead of the counting
left decoding, the longest part, on one core (``bench/state_scale.py``). At most ``ahead``
items are taken beyond the one the consumer waits for, so memory stays that of a few items.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
AHEAD = 2  # items taken beyond the one the consumer waits for
THREAD_NAME = "read-ahead"  # the pool's threads (as population.read_ahead's): they read ahead


class _Pool:
    """The shared state of :func:`in_order`'s threads: the items (advanced under the lock, so
    a generator of items may keep state), the results by index until taken, and the stop."""

    def __init__(self, items: Iterable, ahead: int) -> None:
        self.items, self.ahead = iter(items), ahead
        self.ready = threading.Condition()
        self.results: dict[int, tuple[object, BaseException | None]] = {}
        self.taken = 0  # items taken from ``items``
        self.wanted = 0  # the index the consumer waits for
        self.exhausted = self.stop = False

    def take(self) -> tuple[int, object] | None:
        """The next (index, item), or None when there is none or the pool stops; waits while
        ``ahead`` items are taken beyond the one the consumer waits for."""
        with self.ready:
            while not self.stop and not self.exhausted and self.taken > self.wanted + self.ahead:
                self.ready.wait()
            if self.stop or self.exhausted:
                return None
            index = self.taken
            try:
                item = next(self.items)
            except StopIteration:
                self.exhausted = True
                self.ready.notify_all()
                return None
            except BaseException as err:  # noqa: BLE001 - raised in the consumer's place
                self.exhausted = True
                self.put(index, None, err)
                self.taken += 1
                return None
            self.taken += 1
            return index, item

    def put(self, index: int, value: object, err: BaseException | None) -> None:
        """Hand the result of item ``index`` (or its error) to the consumer."""
        with self.ready:
            self.results[index] = (value, err)
            self.ready.notify_all()

    def result(self, index: int) -> tuple[bool, object]:
        """(found, value) of item ``index`` once done; (False, None) past the last item."""
        with self.ready:
            self.wanted = index
            self.ready.notify_all()
            while index not in self.results and not (self.exhausted and index >= self.taken):
                self.ready.wait()
            if index not in self.results:
                return False, None
            value, err = self.results.pop(index)
        if err is not None:
            raise err
        return True, value


def in_order(
    work: Callable[[T], R], items: Iterable[T], threads: int, ahead: int = AHEAD,
    around: Callable[[], AbstractContextManager] = nullcontext,
) -> Iterator[R]:  # fmt: skip
    """``work(item)`` of each item, in the items' order; with ``threads`` > 1 done by that many
    threads at once, each inside its own ``around()`` (e.g. a GDAL environment, entered once a
    thread). An error of ``work`` or of the items is raised here in its place; closing this
    generator stops the threads (each ends the item it works on)."""
    if threads <= 1:
        with around():
            yield from (work(item) for item in items)
        return
    pool = _Pool(items, ahead)

    def serve() -> None:
        with around():
            while (taken := pool.take()) is not None:
                index, item = taken
                try:
                    pool.put(index, work(item), None)
                except BaseException as err:  # noqa: BLE001 - raised in the consumer's place
                    pool.put(index, None, err)

    workers = [threading.Thread(target=serve, name=THREAD_NAME, daemon=True)
               for _ in range(threads)]  # fmt: skip
    for worker in workers:
        worker.start()
    try:
        index = 0
        while True:
            found, value = pool.result(index)
            if not found:
                return
            yield value
            index += 1
    finally:
        with pool.ready:
            pool.stop = True
            pool.ready.notify_all()
        for worker in workers:
            worker.join()
