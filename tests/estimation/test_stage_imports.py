"""The crop-area stages import no torch: they count rasters and sample tables, and a torch
import cost 2 of the 13.5 s of each demo run's ``area_estimates`` (a manifest helper pulled the
loader in through ``emb.prep.region_index``). Each stage module is imported in a fresh
interpreter, as its rule runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, venv_env

STAGES = ("emb.estimation.area_estimates", "emb.estimation.sample_design")


@pytest.mark.parametrize("stage", STAGES)
def test_an_area_stage_imports_no_torch(stage: str) -> None:
    env = venv_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    script = f"import sys, {stage}; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "False", (
        f"{stage} imports torch; python -X importtime -c 'import {stage}' shows the chain"
    )
