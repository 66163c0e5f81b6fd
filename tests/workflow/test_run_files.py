"""A run's files as the workflow names them while it parses (emb.workflow.parsed_runs): the
schema relative to the project, the overlays in order, what rule train reads. Before, only
dry runs of the whole workflow reached these."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, venv_env

from emb.workflow import parsed_runs


def test_the_schema_is_named_relative_to_a_project_that_holds_the_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parsed_runs.schema_path(tmp_path) == os.path.join(
        "workflow", "schemas", "train.schema.yaml"
    )
    elsewhere = tmp_path.parent / "checkout"  # a Snakefile outside the working directory
    assert parsed_runs.schema_path(elsewhere) == str(
        elsewhere / "workflow/schemas/train.schema.yaml"
    )


def test_a_runs_files_are_defaults_its_own_the_demo_then_every_runs_overlays_once() -> None:
    overlays = parsed_runs.shared_overlays(["mine.yaml", "config/train/demo.yaml"], "lumi.yaml")
    assert overlays == ["mine.yaml", "config/train/demo.yaml", "lumi.yaml"]
    assert parsed_runs.shared_overlays([], None) == []
    assert parsed_runs.config_files("aef_segformer", True, overlays) == [
        "config/train/defaults.yaml",
        "config/train/aef_segformer.yaml",
        "config/train/demo.yaml",  # once, where the demo's place is
        "mine.yaml",
        "lumi.yaml",
    ]
    assert parsed_runs.config_files("aef_segformer", False, ["lumi.yaml"]) == [
        "config/train/defaults.yaml",
        "config/train/aef_segformer.yaml",
        "lumi.yaml",
    ]


def planned_jobs(stdout: str) -> list[dict[str, str]]:
    """The jobs ``snakemake -n`` lists: rule, and each ``key: value`` line (input, output,
    wildcards)."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", stdout):
        head = re.match(r"(?:local)?rule (\w+):", block)
        if head:
            lines = re.findall(r"^    (\w+): (.*)$", block, re.M)
            jobs.append({"rule": head.group(1), **dict(lines)})
    return jobs


def test_train_reads_its_config_and_its_sources_manifest_and_statistics(tmp_path: Path) -> None:
    """What rule train of a TESSERA run reads is what that run's train_config job and its
    source's manifest and channel_stats jobs write (a dry run of the real workflow), and
    what parsed_runs.train_inputs names."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
           "-n", "--cores", "2", "results/runs/tessera_deeplab/train.json"]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=tmp_path, env=venv_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    jobs = planned_jobs(done.stdout)
    (train,) = [job for job in jobs if job["rule"] == "train"]
    producer = {out: job for job in jobs for out in job.get("output", "").split(", ")}
    made_by = {
        path: (producer[path]["rule"], producer[path].get("wildcards", ""))
        for path in train["input"].split(", ")
    }
    assert sorted(made_by.values()) == [
        ("channel_stats", "source=tessera"),
        ("gpu_check", ""),
        ("manifest", "source=tessera"),
        ("train_config", "run=tessera_deeplab"),
    ]
    named = parsed_runs.train_inputs("tessera_deeplab", "tessera")
    assert {key: made_by[path][0] for key, path in named.items()} == {
        "config": "train_config",
        "manifest": "manifest",
        "stats": "channel_stats",
    }
