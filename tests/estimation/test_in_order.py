"""The design's pool of threads: results in the items' order whatever order the threads end
in, every thread at work at once, at most ``ahead`` items taken beyond the one waited for,
errors of the work and of the items raised in their place, closing stops the threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from emb.estimation.in_order import THREAD_NAME, in_order


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_results_come_in_the_items_order(threads: int) -> None:
    """Early items take longest, so later ones end first."""

    def slow_first(i: int) -> int:
        time.sleep(0.002 * (20 - i))
        return i * i

    assert list(in_order(slow_first, range(20), threads)) == [i * i for i in range(20)]


def test_two_threads_work_at_once() -> None:
    """Two items each wait for the other to start: only two threads at once end them."""
    barrier = threading.Barrier(2, timeout=5)

    def meet(i: int) -> str:
        barrier.wait()
        return threading.current_thread().name

    assert list(in_order(meet, range(2), threads=2)) == [THREAD_NAME, THREAD_NAME]


def test_no_more_than_ahead_items_are_taken_beyond_the_one_waited_for() -> None:
    taken: list[int] = []

    def items() -> Iterator[int]:
        for i in range(50):
            taken.append(i)
            yield i

    results = in_order(lambda i: i, items(), threads=2, ahead=3)
    assert next(results) == 0
    time.sleep(0.2)  # the threads take what they may
    assert len(taken) <= 1 + 3 + 1  # the one waited for, ahead, one taken while it was handed
    results.close()


def test_an_error_of_the_work_is_raised_in_its_place() -> None:
    def fail_at_3(i: int) -> int:
        if i == 3:
            raise ValueError("item 3")
        return i

    got = []
    with pytest.raises(ValueError, match="item 3"):
        for value in in_order(fail_at_3, range(10), threads=2):
            got.append(value)
    assert got == [0, 1, 2]
    assert not any(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())


def test_an_error_of_the_items_is_raised_in_its_place() -> None:
    def items() -> Iterator[int]:
        yield 0
        yield 1
        raise KeyError("the third item")

    got = []
    with pytest.raises(KeyError, match="the third item"):
        for value in in_order(lambda i: i, items(), threads=2):
            got.append(value)
    assert got == [0, 1]


def test_closing_stops_the_threads() -> None:
    results = in_order(lambda i: i, iter(range(10**9)), threads=2)
    assert next(results) == 0
    results.close()
    assert not any(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())
