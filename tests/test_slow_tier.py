"""The slow tier (tests/slow_tests.py): its list cannot rot, and the quick tier still touches
every package of emb."""

from __future__ import annotations

from pathlib import Path

import pytest
import slow_tests
from conftest import REPO


def test_an_entry_that_names_nothing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = {
        "tests/test_gone.py": "x",
        "tests/test_slow_tier.py::test_gone": "x",
        "tests/test_slow_tier.py::test_an_entry_that_names_nothing_is_reported": "x",
    }
    monkeypatch.setattr(slow_tests, "SLOW_TESTS", entries)
    monkeypatch.setattr(slow_tests, "SLOW_FIXTURES", {"tests/conftest.py::no_fixture": "x"})
    problems = slow_tests.check(REPO, [], [], whole=True)
    assert problems == [
        "tests/test_gone.py: no file tests/test_gone.py",
        "tests/test_slow_tier.py::test_gone: test_gone is not defined in tests/test_slow_tier.py",
        "tests/conftest.py::no_fixture: no_fixture is not defined in tests/conftest.py",
    ]
    assert slow_tests.check(REPO, [], [], whole=False) == []  # none of their files collected


def test_every_listed_entry_names_a_test_or_fixture() -> None:
    assert slow_tests.check(REPO, [], [], whole=True) == []


def named(paths: set[Path], names: list[str]) -> set[str]:
    """The names of ``names`` that the files ``paths`` mention as ``emb.<name>``."""
    text = "\n".join(path.read_text() for path in paths)
    return {n for n in names if f"emb.{n}" in text or f"from emb import {n}" in text}


def test_the_quick_tier_touches_every_package(request: pytest.FixtureRequest) -> None:
    """Every subpackage and top-level module of emb that some test names is named by a test
    module that is not slow. Judged when the whole tests/ folder is collected."""
    if any(Path(arg).resolve() not in (REPO, REPO / "tests") for arg in request.config.args):
        pytest.skip("judged only when the whole tests/ folder is collected")
    src = REPO / "src" / "emb"
    names = [p.parent.name for p in src.glob("*/__init__.py")]
    names += [p.stem for p in src.glob("*.py") if p.stem != "__init__"]
    every = set((REPO / "tests").rglob("test_*.py"))
    collected = request.config.stash[slow_tests.COLLECTED]  # -m and -k have not chosen yet
    quick = {Path(item.path) for item in collected if not item.get_closest_marker("slow")}
    untouched = sorted(named(every, names) - named(quick, names))
    assert not untouched, f"only slow tests name emb.{untouched} (tests/slow_tests.py)"


def test_listed_files_tests_and_users_of_slow_fixtures_are_marked_and_others_not(
    request: pytest.FixtureRequest,
) -> None:
    collected = {item.nodeid: item for item in request.config.stash[slow_tests.COLLECTED]}
    profiles = [i for n, i in collected.items() if n.startswith("tests/cluster/test_profiles.py")]
    if not profiles or "tests/test_workflow.py::test_rerun_has_nothing_to_do" not in collected:
        pytest.skip("judged when tests/test_workflow.py and tests/cluster/test_profiles.py are")
    slow = {n for n, i in collected.items() if i.get_closest_marker("slow")}
    assert "tests/test_workflow.py::test_rerun_has_nothing_to_do" in slow  # a listed file
    assert "tests/test_workflow.py::test_full_run_creates_every_declared_output" in slow
    assert "tests/test_inputs.py::test_missing_file_names_row_and_column" in slow  # a test
    assert "tests/test_inputs.py::test_unknown_key_in_config_yaml_is_rejected[launch-gpus]" in slow
    users = [i.nodeid for i in profiles if {"listed", "own_data"} & set(i.fixturenames)]
    assert users and set(users) <= slow  # these fixtures run Snakemake: their users are slow
    assert "tests/cluster/test_profiles.py::test_no_profile_is_named_default" not in slow


def test_the_longest_modules_come_first_then_the_slow_ones_each_module_in_one_piece(
    request: pytest.FixtureRequest,
) -> None:
    """The order pytest-xdist's workers take the modules in (tests/slow_tests.py, ``order``)."""
    collected = request.config.stash[slow_tests.COLLECTED]
    runs = [item.nodeid.split("::", 1)[0] for item in collected]
    modules = list(dict.fromkeys(runs))
    pieces = [m for i, m in enumerate(runs) if i == 0 or runs[i - 1] != m]
    assert pieces == modules, "a module's tests are not together"
    first = slow_tests.LONGEST_FIRST
    longest = sorted(first, key=first.__getitem__, reverse=True)
    listed = [m for m in longest if m in modules]
    assert modules[: len(listed)] == listed
    slow = {item.nodeid.split("::", 1)[0] for item in collected if item.get_closest_marker("slow")}
    rest = [m in slow for m in modules[len(listed) :]]
    assert rest == sorted(rest, reverse=True), "a quick module before a slow one"
