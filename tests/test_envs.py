"""envs/emb.yaml, the environment of `snakemake --sdm conda`: valid, in step with
pyproject.toml, and resolvable by pip as far as this machine allows (conda is not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib
import yaml
from conftest import REPO, venv_env
from packaging.requirements import InvalidRequirement, Requirement

HOST_ONLY = {"snakemake", "snakemake-executor-plugin-slurm"}  # run Snakemake, not the rules


def env_pip_lines() -> list[str]:
    env = yaml.safe_load((REPO / "envs" / "emb.yaml").read_text())
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1, "envs/emb.yaml: expected one pip: section"
    return pips[0]


def test_env_pip_part_holds_only_requirements() -> None:
    bad = []
    for line in env_pip_lines():
        try:
            Requirement(line)
        except InvalidRequirement:
            bad.append(line)
    assert not bad, f"envs/emb.yaml: pip lines that are not requirements: {bad}"


def test_env_asks_for_what_the_package_asks_for() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {str(Requirement(d)) for d in project["dependencies"]}
    wanted = {r for r in wanted if Requirement(r).name not in HOST_ONLY}
    assert {str(Requirement(line)) for line in env_pip_lines()} == wanted


def test_env_pip_part_resolves(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(env_pip_lines()) + "\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--disable-pip-version-check",
            "-r",
            str(requirements),
        ],  # fmt: skip
        env=venv_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
