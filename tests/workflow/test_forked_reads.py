"""The regions check's rows read in forked processes (emb.workflow.forked_reads): in table
order, the first mistake of the table named as the threads named it, and an exception that
cannot travel back between processes still reported by its type and text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_region_checks import READERS, table_of

from emb import forks
from emb.prep.regions import RegionsError, read_regions
from emb.workflow import forked_reads
from emb.workflow.forked_reads import in_order
from emb.workflow.region_checks import check_regions


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked readers from 2 rows on, two of them, on any machine."""
    monkeypatch.setattr(forked_reads, "FORK_FROM", 2)
    monkeypatch.setattr(forked_reads, "processes", lambda: 2)


def pid_of(item: int) -> dict[str, object]:
    return {"item": item, "pid": os.getpid()}


class Odd(Exception):
    """An exception whose __init__ takes other arguments than its args: unpickling fails."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code}: {text}")


def odd_failure(item: int) -> dict[str, object]:
    return {"read": Odd(item, "no such band") if item == 3 else None}


def test_many_items_are_read_in_other_processes_in_order(forking: None) -> None:
    got = list(in_order(pid_of, list(range(50)), READERS))
    assert [item for item, _ in got] == [found["item"] for _, found in got] == list(range(50))
    assert os.getpid() not in {found["pid"] for _, found in got}


def test_few_items_are_read_in_this_process(forking: None) -> None:
    got = list(in_order(pid_of, [1], READERS))
    assert got == [(1, {"item": 1, "pid": os.getpid()})]


def test_off_linux_many_items_are_read_in_this_process(
    forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """macOS offers fork, but a forked child of a process with its frameworks loaded may crash."""
    monkeypatch.setattr(forks.sys, "platform", "darwin")
    got = list(in_order(pid_of, list(range(50)), READERS))
    assert {found["pid"] for _, found in got} == {os.getpid()}


def test_the_cores_are_counted_where_the_os_cannot_give_this_process_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(forks.os, "sched_getaffinity")  # as on macOS
    monkeypatch.setattr(forks.os, "cpu_count", lambda: 3)
    assert forked_reads.processes() == 3


def test_an_exception_that_cannot_travel_comes_back_as_its_type_and_text(forking: None) -> None:
    got = dict(in_order(odd_failure, list(range(6)), READERS))
    error = got[3]["read"]
    assert type(error) is RuntimeError and str(error) == "Odd: 3: no such band"
    assert [got[i]["read"] for i in (0, 1, 2, 4, 5)] == [None] * 5


def test_forked_rows_give_every_size(tmp_path: Path, forking: None) -> None:
    path = table_of(tmp_path, 3 * READERS)
    checks = check_regions(read_regions(path), path)
    assert len(checks.pixels) == 3 * 3 * READERS and set(checks.pixels.values()) == {16}


@pytest.mark.parametrize(("labels_fail", "file_missing", "named", "column"),
                         [(3, 7, 3, "cdl"), (7, 3, 3, "aef"), (10, 0, 10, "cdl")])  # fmt: skip
def test_forked_rows_name_the_first_mistake_of_the_table(
    tmp_path: Path, forking: None, labels_fail: int, file_missing: int, named: int, column: str
) -> None:
    path = table_of(tmp_path, 10, tessera_elsewhere=labels_fail, aef_missing=file_missing)
    with pytest.raises(
        RegionsError, match=rf"row {named} \(region 'r{named}'\), column '{column}'"
    ):
        check_regions(read_regions(path), path)
