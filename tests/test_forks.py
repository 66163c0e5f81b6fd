"""Work in parts in forked processes (emb.forks): the parts' results in order from other
processes, a closure reaching them by fork, two rounds in one process a part, the lowest
failing part's error raised as running them in turn would raise it, and the parts in this
process where fork is not allowed, for one part or one worker, or inside a part."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from emb import forks
from emb.forks import forked_workers, in_parts, shares, two_rounds


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two cores whatever this machine has (forking is then allowed on Linux)."""
    monkeypatch.setattr(forks, "cores", lambda most: min(most, 2))


def test_the_parts_results_come_in_order_from_other_processes() -> None:
    table = {i: i * i for i in range(9)}  # a closure's data, reaching the workers by fork
    got = in_parts(lambda i: (table[i], os.getpid()), 9, 2)
    assert [value for value, _ in got] == [i * i for i in range(9)]
    pids = {pid for _, pid in got}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


class Odd(Exception):
    """An exception whose __init__ takes other arguments than its args: unpickling fails."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code}: {text}")


def failing(i: int) -> int:
    if i == 5:
        raise ValueError("part 5: map b.tif values [200]")
    if i == 3:
        raise KeyError("part 3: region r3 has no labels")
    return i


def test_the_lowest_failing_parts_error_is_raised_whole() -> None:
    with pytest.raises(KeyError, match="part 3: region r3 has no labels") as raised:
        in_parts(failing, 8, 2)
    assert any("in worker process" in note for note in raised.value.__notes__)


def test_in_turn_the_same_error_is_raised() -> None:
    with pytest.raises(KeyError, match="part 3: region r3 has no labels"):
        in_parts(failing, 8, 1)


def test_an_error_that_cannot_travel_comes_back_as_its_type_and_text() -> None:
    def odd(i: int) -> int:
        if i == 1:
            raise Odd(7, "no such band")
        return i

    with pytest.raises(RuntimeError, match=r"^Odd: 7: no such band$"):
        in_parts(odd, 4, 2)


@pytest.mark.parametrize(("parts", "workers"), [(1, 2), (5, 1)])
def test_one_part_or_one_worker_runs_here(parts: int, workers: int) -> None:
    assert in_parts(lambda i: os.getpid(), parts, workers) == [os.getpid()] * parts


def test_off_linux_the_parts_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS offers fork, but a forked child of a process with its frameworks loaded may crash."""
    monkeypatch.setattr(forks.sys, "platform", "darwin")
    assert in_parts(lambda i: os.getpid(), 4, 2) == [os.getpid()] * 4
    assert forked_workers(2, 4) == 1


def test_a_part_that_runs_parts_runs_them_in_its_own_process() -> None:
    def outer(i: int) -> tuple[int, list[int]]:
        return os.getpid(), in_parts(lambda j: os.getpid(), 3, 2)

    for pid, inner in in_parts(outer, 2, 2):
        assert pid != os.getpid() and inner == [pid] * 3


def test_workers_are_the_cores_given_at_most_one_a_part(two_cores: None) -> None:
    assert forked_workers(2, 10) == 2
    assert forked_workers(8, 10) == 2  # the cores this process may run on
    assert forked_workers(2, 1) == 1
    assert forked_workers(1, 10) == 1


def test_the_cores_are_counted_where_the_os_cannot_give_this_process_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(forks.os, "sched_getaffinity")  # as on macOS
    monkeypatch.setattr(forks.os, "cpu_count", lambda: 3)
    assert forks.cores(8) == 3
    assert forks.cores(2) == 2


def test_weighted_shares_are_near_equal_in_weight_and_never_empty() -> None:
    assert shares(list("abcdefghij"), 3, [1] * 10) == [list("abc"), list("def"), list("ghij")]
    assert shares(list("abcde"), 2, [8, 1, 1, 1, 5]) == [["a"], list("bcde")]
    assert shares(list("abcd"), 4, [0, 0, 0, 9]) == [["a"], ["b"], ["c"], ["d"]]
    assert shares(list("abcd"), 3, [9, 0, 0, 0]) == [["a"], ["b"], ["c", "d"]]


@pytest.mark.parametrize(("n", "parts"), [(10, 3), (3, 8), (8, 8), (1, 1), (0, 2), (1000, 8)])
def test_shares_are_contiguous_near_equal_and_never_empty(n: int, parts: int) -> None:
    items = list(range(n))
    got = shares(items, parts)
    assert [i for share in got for i in share] == items
    sizes = [len(share) for share in got]
    assert len(got) == max(1, min(parts, n))
    assert max(sizes) - min(sizes) <= 1
    assert n == 0 or min(sizes) >= 1


def rounds_in_memory(fail: str = "") -> tuple[list, list]:
    """two_rounds over 3 parts: the first round leaves a value in its process's memory that
    the second reads; ``between`` sums the first round's answers here."""
    left: dict[int, int] = {}
    between_calls: list[int] = []

    def first(i: int) -> tuple[int, int]:
        if fail == "first" and i >= 1:
            raise ValueError(f"part {i}: map {i}.tif unreadable")
        if fail == "dies" and i == 1:
            os._exit(3)
        left[i] = 10 * i
        return i, os.getpid()

    def between(firsts: list) -> int:
        between_calls.append(os.getpid())
        if fail == "between":
            raise KeyError("between: no mapped pixel")
        return sum(i for i, _ in firsts)

    def second(i: int, total: int) -> tuple[int, int, int]:
        if fail == "second" and i == 2:
            raise ValueError("part 2: map 2.tif changed")
        return left[i] + total, os.getpid(), i

    return two_rounds(first, between, second, 3), between_calls


def test_two_rounds_keep_each_parts_memory_in_its_own_process() -> None:
    got, between_calls = rounds_in_memory()
    assert [(value, i) for value, _, i in got] == [(3, 0), (13, 1), (23, 2)]
    pids = [pid for _, pid, _ in got]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert between_calls == [os.getpid()]


@pytest.mark.parametrize(("fail", "error", "match"), [
    ("first", ValueError, "part 1: map 1.tif unreadable"),
    ("between", KeyError, "between: no mapped pixel"),
    ("second", ValueError, "part 2: map 2.tif changed"),
    ("dies", RuntimeError, r"part 1\) ended in the first round without an answer, exit code 3"),
])  # fmt: skip
def test_two_rounds_raise_the_lowest_error_and_leave_no_worker(
    fail: str, error: type, match: str
) -> None:
    before = {child.pid for child in multiprocessing.active_children()}
    with pytest.raises(error, match=match):
        rounds_in_memory(fail)
    assert {child.pid for child in multiprocessing.active_children()} == before


def test_off_linux_two_rounds_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forks.sys, "platform", "darwin")
    got, _ = rounds_in_memory()
    assert [(value, pid, i) for value, pid, i in got] == [(3 + 10 * i, os.getpid(), i)
                                                         for i in range(3)]  # fmt: skip


def test_a_worker_still_busy_when_another_fails_is_stopped() -> None:
    """Part 0 fails while part 1 is still in its first round (a minute's work): the error comes
    at once and the busy worker is stopped, not waited for."""

    def first(i: int) -> int:
        if i == 0:
            raise ValueError("part 0: map 0.tif unreadable")
        time.sleep(60)
        return i

    before = {child.pid for child in multiprocessing.active_children()}
    start = time.monotonic()
    with pytest.raises(ValueError, match="part 0: map 0.tif unreadable"):
        two_rounds(first, lambda firsts: None, lambda i, b: i, 2)
    assert time.monotonic() - start < 20
    assert {child.pid for child in multiprocessing.active_children()} == before
