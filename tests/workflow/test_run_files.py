"""A run's files as the workflow names them while it parses (emb.training.run_files): the
schema relative to the project, the overlays in order, what rule train reads. Before, only
dry runs of the whole workflow reached these."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from emb.training import run_files


def test_the_schema_is_named_relative_to_a_project_that_holds_the_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_files.schema_path(tmp_path) == os.path.join(
        "workflow", "schemas", "train.schema.yaml"
    )
    elsewhere = tmp_path.parent / "checkout"  # a Snakefile outside the working directory
    assert run_files.schema_path(elsewhere) == str(elsewhere / "workflow/schemas/train.schema.yaml")


def test_a_runs_files_are_defaults_its_own_the_demo_then_every_runs_overlays_once() -> None:
    overlays = run_files.shared_overlays(["mine.yaml", "config/train/demo.yaml"], "lumi.yaml")
    assert overlays == ["mine.yaml", "config/train/demo.yaml", "lumi.yaml"]
    assert run_files.shared_overlays([], None) == []
    assert run_files.config_files("aef_segformer", True, overlays) == [
        "config/train/defaults.yaml",
        "config/train/aef_segformer.yaml",
        "config/train/demo.yaml",  # once, where the demo's place is
        "mine.yaml",
        "lumi.yaml",
    ]
    assert run_files.config_files("aef_segformer", False, ["lumi.yaml"]) == [
        "config/train/defaults.yaml",
        "config/train/aef_segformer.yaml",
        "lumi.yaml",
    ]


def test_train_reads_its_config_and_its_sources_manifest_and_statistics() -> None:
    assert run_files.train_inputs("tessera_deeplab", "tessera") == {
        "config": "results/runs/tessera_deeplab/config.yaml",
        "manifest": "results/shards/tessera/manifest.json",
        "stats": "results/stats/tessera/stats.json",
    }
