"""Every bench in bench/ runs its default path (issue 51, item 11): a move in src/ must not
break one unseen, as the restructure broke ``python bench/predict.py`` (its reference path
imported ``emb.evaluation.inference``, which had moved). Each bench runs in its smallest mode
(its default contenders and parts, small inputs, one repeat); every ``emb`` name a bench
imports, at the top or inside a function, is looked up without running it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, venv_env

BENCH = REPO / "bench"
# bench script -> the options of its smallest mode, or the tests that run it (a text)
SMALLEST: dict[str, list[str] | str] = {
    "areas.py": ["--quick"],
    "bootstrap.py": ["--blocks", "20", "--resamples", "20", "--repeats", "1"],
    "check_draws.py": ["--draws", "4", "--pixels", "100000", "--repeat", "1"],
    "tile_coverage.py": ["--quick"],
    "data.py": ["--quick"],
    "dry_run.py": ["--sizes", "10", "20", "--repeats", "1"],
    "dry_run_identity.py": ["--before", str(REPO), "--setups", "demo"],  # the tree against itself
    "ema.py": ["--device", "cpu", "--blocks", "1", "--reps", "1"],
    "gpu.py": "tests/bench/test_gpu_bench.py::test_gpu_bench_tiny_cpu",
    "map_counts.py": ["--quick"],
    "memory.py": ["--sides", "512", "--tessera-sides", "512"],
    "predict.py": ["--quick", "--models", "tiny"],  # the old path and both jobs included
    # a runner of tests/reliability itself: even at 0 trials its uncounted checks take ~6 min
    "reliability.py": "tests/reliability (the trials it counts, at CI's counts)",
    "scale.py": ["--regions", "10"],
    # its check by district draws 100 x 40 strata: a fixed cost, ~15 ms a draw (2026-12-07)
    "state_scale.py": ["--regions", "4", "--size", "256", "--draws", "2"],
    "stem_cost.py": [],
    "train.py": ["--quick"],
}


def scripts() -> list[Path]:
    """The benches one runs: files of bench/ with a ``__main__`` block (the others are parts
    of one, e.g. gpu_loop.py of gpu.py)."""
    return sorted(p for p in BENCH.glob("*.py") if "__main__" in p.read_text())


def emb_imports(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every ``from emb... import name`` in ``path``, anywhere in it; a
    plain ``import emb.x`` gives (``emb.x``, "")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "emb":
                found |= {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {(a.name, "") for a in node.names if a.name.split(".")[0] == "emb"}
    return found


def test_every_bench_has_a_smallest_mode() -> None:
    """A new bench states how it runs small, or the test of defaults would miss it."""
    assert {p.name for p in scripts()} == set(SMALLEST)


@pytest.mark.parametrize("bench", [p.name for p in sorted(BENCH.glob("*.py"))])
def test_every_emb_name_a_bench_imports_exists(bench: str) -> None:
    missing = []
    for module, name in sorted(emb_imports(BENCH / bench)):
        try:
            found = importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{module} ({err})")
            continue
        if name and not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"bench/{bench} imports what src/ no longer has: {missing}"


def test_predicts_old_path_loads_on_todays_modules() -> None:
    """The reference contender: emb 0dcd26c's windows module, from git, with the imports
    that moved since pointed at their new homes."""
    sys.path.insert(0, str(BENCH))
    try:
        predict = importlib.import_module("predict")
    finally:
        sys.path.remove(str(BENCH))
    known = subprocess.run(["git", "cat-file", "-e", f"{predict.OLD_COMMIT}^{{commit}}"],
                           cwd=REPO, capture_output=True)  # fmt: skip
    if known.returncode:
        pytest.skip(f"this checkout has no commit {predict.OLD_COMMIT} (a shallow clone)")
    old = predict.old_module()
    assert old is not None
    assert all(hasattr(old, name) for name in ("PredictSpec", "predict_block", "classify"))


@pytest.mark.parametrize("bench", sorted(SMALLEST))
def test_each_bench_runs_its_default_path_in_its_smallest_mode(bench: str, tmp_path: Path) -> None:
    options = SMALLEST[bench]
    if isinstance(options, str):
        pytest.skip(f"run by {options}")
    done = subprocess.run([sys.executable, str(BENCH / bench), *options], cwd=tmp_path,
                          env=venv_env(), capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
