"""The checks CI runs before the tests: formatting and lint of Python and Snakemake files."""

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
