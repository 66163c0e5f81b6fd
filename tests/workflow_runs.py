"""Helpers for tests that run the real Snakemake workflow: a fresh checkout, and Snakemake run
in it on the tests' tiny demo config."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import REPO, venv_env

RULES = ["demo_region", "shards", "manifest", "channel_stats", "train_config", "train",
         "evaluate", "summary", "predict", "curves", "data_report"]  # fmt: skip
RUNS = ["aef_segformer", "aef_deeplab", "tessera_segformer", "tessera_deeplab"]


def make_workdir(path: Path) -> Path:
    """A fresh checkout as a user runs it: the Snakefile, workflow/, envs/, config/ and .test/ in
    one folder (emb itself is installed from this repository), so the project can be moved."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "Snakefile", path / "Snakefile")
    for folder in ("workflow", "envs", "config", ".test"):
        shutil.copytree(REPO / folder, path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return path


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """Snakemake in ``workdir`` with the tests' tiny demo config (.test/config.yaml) merged."""
    cmd = ["snakemake", "-s", str(workdir / "Snakefile"), "-d", str(workdir),
           "--configfile", ".test/config.yaml", *args]  # fmt: skip
    return subprocess.run(
        cmd, cwd=workdir, env=venv_env(), capture_output=True, text=True, timeout=timeout
    )
