"""Reliability figures: the fault-injection and hostile-input trials of tests/reliability, run
with the bench's trial counts, counted per check and printed as a table.

Each trial is one pytest item (``test_x[check-i]``); a trial passes when its item passes. An
expected failure (a known bug, ``xfail(strict=True)``) counts as a trial that did not pass.
Counts default to the issue's bench figures (see tests/reliability/trials.py); ``--ci`` uses the
CI counts, ``--trials check=N,...`` overrides some.

Usage: ``python bench/reliability.py [--ci] [--trials sigkill_resume=3,...] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "reliability"))

from trials import CHECKS, ENV, trial_counts  # noqa: E402


class Tally:
    """A pytest plugin counting trials and passes per check (from each item's check marker)."""

    def __init__(self) -> None:
        self.trials: Counter[str] = Counter()
        self.passed: Counter[str] = Counter()
        self.failed: dict[str, list[str]] = {}
        self._check: dict[str, str] = {}

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            marker = item.get_closest_marker("check")
            if marker:
                self._check[item.nodeid] = marker.args[0]

    def pytest_runtest_logreport(self, report) -> None:
        check = self._check.get(report.nodeid)
        if check is None:
            return
        if report.when == "setup" and not report.passed:
            self.trials[check] += 1  # an error or skip before the trial ran: not passed
            self.failed.setdefault(check, []).append(f"{report.nodeid} ({report.outcome})")
        elif report.when == "call":
            self.trials[check] += 1
            if report.passed and not hasattr(report, "wasxfail"):
                self.passed[check] += 1
            else:
                self.failed.setdefault(check, []).append(report.nodeid.split("[")[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="CI trial counts instead of the bench's")
    parser.add_argument("--trials", default="", help="check=N,... overrides")
    parser.add_argument("--json", type=Path, help="write {check: {trials, passed}} here")
    args = parser.parse_args(argv)
    counts = trial_counts(args.trials, bench=not args.ci)
    os.environ[ENV] = ",".join(f"{k}={v}" for k, v in counts.items())
    tally = Tally()
    started = time.perf_counter()
    pytest.main(
        [str(REPO / "tests" / "reliability"), "-q", "-p", "no:cacheprovider", "--no-header",
         "-o", "addopts="],
        plugins=[tally],
    )  # fmt: skip
    minutes = (time.perf_counter() - started) / 60
    rows = [(c, tally.trials[c], tally.passed[c], CHECKS[c].what) for c in CHECKS]
    print(f"\n{'check':<17} {'trials':>6} {'passed':>6}  what it checks")
    for check, n, ok, what in rows:
        print(f"{check:<17} {n:>6} {ok:>6}  {what}")
    print(f"({minutes:.1f} min; counts {os.environ[ENV]})")
    for check, nodes in tally.failed.items():
        print(f"not passed in {check}: {', '.join(nodes)}")
    if args.json:
        args.json.write_text(
            json.dumps({c: {"trials": n, "passed": ok} for c, n, ok, _ in rows}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
