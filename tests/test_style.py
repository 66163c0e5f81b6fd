"""The checks CI runs before the tests: formatting and lint of Python and Snakemake files, and
the size rules of the package (functions: ruff's PLR0915 in pyproject.toml; modules here)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO, venv_env

CHECKS = {
    "ruff format": ["ruff", "format", "--check", "."],
    "ruff lint": ["ruff", "check", "."],
    "snakefmt": ["snakefmt", "--check", "Snakefile", "workflow"],
    "snakemake --lint": ["snakemake", "--lint"],
}


@pytest.mark.parametrize("name", CHECKS)
def test_style_check_passes(name: str) -> None:
    result = subprocess.run(
        CHECKS[name], cwd=REPO, env=venv_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    if name == "snakemake --lint":
        assert "Congratulations" in result.stdout + result.stderr


# A module holds one idea (one noun), however long that takes; about 500 lines is the signal to
# look whether it holds two, not a wall to split at (docs/design.md, "Layout").
MAX_MODULE_LINES = 500


def test_no_package_module_is_over_500_lines() -> None:
    sizes = {p: len(p.read_text().splitlines()) for p in (REPO / "src" / "emb").rglob("*.py")}
    assert sizes, "no modules found under src/emb"
    too_long = {str(p.relative_to(REPO)): n for p, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, (
        f"modules over {MAX_MODULE_LINES} lines (does each still hold one idea?): {too_long}"
    )
