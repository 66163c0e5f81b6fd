"""The reliability checks, their trial counts (CI and bench) and what each proves.

Counts come from ``EMB_RELIABILITY_TRIALS`` (``name=N,name=N``; unnamed checks keep their CI
count), so ``bench/reliability.py`` runs the same tests with the bench's counts. Every trial is
its own pytest item, ``test_x[check-i]``: a failure names its check and trial, and its random
choices are printed in the assertion message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

ENV = "EMB_RELIABILITY_TRIALS"


@dataclass(frozen=True)
class Check:
    ci: int | None  # None: one trial per kind of input, not a count
    bench: int | None
    what: str


CHECKS = {
    "sigkill_resume": Check(
        5, 20, "SIGKILL of one rank at a random step after the first checkpoint, resume: model, "
        "optimizer, EMA, scheduler bitwise equal to an uninterrupted run; same sample keys",
    ),
    "kill_during_save": Check(
        10, 50, "SIGKILL during a (slowed) checkpoint write: last.pt loads with weights_only "
        "and matches its recorded sha256; leftovers removed on the next start",
    ),
    "disk_full": Check(
        1, 3, "disk full (tmpfs) during a save: previous checkpoint byte-identical, non-zero exit "
        "saying the disk is full",
    ),
    "stop_signal": Check(
        2, 10, "SIGUSR1 or SIGTERM to one rank: every rank saves at the same step, exits 75 in "
        "bounded time (collective timeout set)",
    ),
    "nonfinite_step": Check(
        2, 10, "NaN tile or Inf loss on one rank at a random step: all ranks skip it; weights, "
        "BN buffers, EMA unchanged; counter logged",
    ),
    "uneven_data": Check(
        50, 500, "1-20 uneven shards over 1-4 ranks, 0-2 workers: same batch count on every "
        "rank, none empty, epoch completes; eval sees every sample once",
    ),
    "hostile_inputs": Check(
        None, None, "hostile rasters, tables, configs, stats, shards, checkpoints (one trial per "
        "kind, 60 s limit each): a message naming the file/key and what was expected; earlier "
        "good outputs byte-identical; odd-but-valid inputs accepted",
    ),
    "real_forms": Check(
        None, None, "products as AEF, TESSERA and NASS ship them (COGs, Earth Engine exports, "
        "geotessera GeoTIFFs, mosaics and .npy, national CDL; one trial per kind) through "
        "Snakemake: accepted with the right outputs, or refused in one line naming the file",
    ),
}  # fmt: skip


def trial_counts(spec: str | None = None, bench: bool = False) -> dict[str, int]:
    """{check: trials} from the defaults and a ``name=N,...`` spec (counted checks only)."""
    counts = {n: (c.bench if bench else c.ci) for n, c in CHECKS.items() if c.ci is not None}
    for item in filter(None, (spec or "").split(",")):
        name, _, n = item.partition("=")
        if name.strip() not in counts or not n.strip().isdigit():
            raise ValueError(f"{ENV}: {item!r}: expected CHECK=N with CHECK in {sorted(counts)}")
        counts[name.strip()] = int(n)
    return counts


def trials(name: str) -> int:
    return trial_counts(os.environ.get(ENV))[name]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize a test's ``trial`` argument by the count of its ``check`` marker."""
    if "trial" not in metafunc.fixturenames:
        return
    name = metafunc.definition.get_closest_marker("check").args[0]
    n = trials(name)
    metafunc.parametrize("trial", range(n), ids=[f"{name}-{i}" for i in range(n)])
