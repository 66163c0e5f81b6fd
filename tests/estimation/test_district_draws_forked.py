"""The check by district's draws in forked worker processes (district_check.check_districts
with threads > 1, emb.forks): contiguous ranges of draws in other processes, and every figure of
the check the one a single process gives, to the last bit (the half-widths are summed here, in
draw order); a worker's error reaches the caller."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pytest
from test_check_draws import scene_population, uneven_population
from test_holdout_check import CMAP, settings

from emb import forks
from emb.classes import N_L3
from emb.estimation import district_check
from emb.estimation.district_check import check_districts
from emb.estimation.holdout_counts import TestSplitCounts

N = 300


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worker processes for threads=2, on any machine."""
    monkeypatch.setattr(forks, "cores", lambda most: min(most, 2))


def assert_same(got: object, want: object, where: str = "check") -> None:
    """``got`` is ``want`` field by field, floats to the bit (NaN where NaN), arrays of the same
    dtype, shape and values, dicts with the same keys in the same order."""
    assert type(got) is type(want), where
    if dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):
            assert_same(getattr(got, field.name), getattr(want, field.name),
                        f"{where}.{field.name}")  # fmt: skip
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for key, value in want.items():
            assert_same(got[key], value, f"{where}[{key!r}]")
    elif isinstance(want, tuple | list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), where
    elif isinstance(want, float):
        assert got == want or (math.isnan(got) and math.isnan(want)), (where, got, want)
    else:
        assert got == want, where


def log_draws(monkeypatch: pytest.MonkeyPatch, log: Path, fail_at: int | None = None) -> None:
    """Each chunk of draws logged (the process, its first and last draw + 1) as it is drawn;
    ``fail_at``: the chunk holding that draw raises."""
    draw_runs = district_check.draw_runs

    def logged(sampler: object, draws: range, seed: list[int]) -> object:
        with log.open("a") as out:
            out.write(f"{os.getpid()} {draws.start} {draws.stop}\n")
        if fail_at in draws:
            raise ValueError(f"no draw {fail_at}")
        return draw_runs(sampler, draws, seed)

    monkeypatch.setattr(district_check, "draw_runs", logged)


def chunks_of(log: Path) -> list[tuple[int, int, int]]:
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()]


@pytest.mark.parametrize(("draws", "at_once", "population"), [
    (7, None, scene_population(seed=12, districts=3)),
    (7, 2, scene_population(seed=12, districts=3)),  # ranges 0-2, 3-6: chunks 0-1, 2, 3-4, 5-6
    (7, 2, uneven_population()),
    (1, None, scene_population(seed=12, districts=3)),
])  # fmt: skip
def test_two_processes_give_one_process_check_to_the_bit(
    draws: int, at_once: int | None, population: TestSplitCounts, two_cores: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    if at_once is not None:
        held = int((population.domains.reshape(len(population.domains), -1).sum(1) > 0).sum())
        monkeypatch.setattr(district_check, "DOMAIN_SHARES", at_once * held * N_L3)
    design = settings(n=N, min_per_class=5, level=3, seed=2, draws=draws)
    want = check_districts(population, CMAP, design, N)
    got = check_districts(population, CMAP, design, N, threads=2)
    assert_same(got, want)
    assert any(c.half_width for t in want.total for c in t.coverage.values())  # widths summed


def test_the_draws_run_in_other_processes_in_contiguous_ranges(
    tmp_path: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_draws(monkeypatch, tmp_path / "chunks.txt")
    design = settings(n=N, min_per_class=5, level=3, seed=2, draws=7)
    check_districts(scene_population(seed=12, districts=3), CMAP, design, N, threads=2)
    chunks = chunks_of(tmp_path / "chunks.txt")
    assert os.getpid() not in {pid for pid, _, _ in chunks}
    assert sorted((a, b) for _, a, b in chunks) == [(0, 3), (3, 7)]


@pytest.mark.parametrize("off_linux", [False, True])
def test_one_thread_or_no_fork_draws_here_at_once(
    off_linux: bool, tmp_path: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_draws(monkeypatch, tmp_path / "chunks.txt")
    if off_linux:
        monkeypatch.setattr(forks.sys, "platform", "darwin")
    design = settings(n=N, min_per_class=5, level=3, seed=2, draws=7)
    check_districts(scene_population(seed=12, districts=3), CMAP, design, N,
                    threads=2 if off_linux else 1)  # fmt: skip
    assert chunks_of(tmp_path / "chunks.txt") == [(os.getpid(), 0, 7)]


def test_an_error_in_a_worker_reaches_the_caller(
    tmp_path: Path, two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_draws(monkeypatch, tmp_path / "chunks.txt", fail_at=5)
    design = settings(n=N, min_per_class=5, level=3, seed=2, draws=7)
    with pytest.raises(ValueError, match="no draw 5") as caught:
        check_districts(scene_population(seed=12, districts=3), CMAP, design, N, threads=2)
    assert any("in worker process" in note for note in caught.value.__notes__)
