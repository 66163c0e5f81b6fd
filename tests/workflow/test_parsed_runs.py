"""A run's config as the workflow resolves it while it parses (emb.training.train_config):
its source from its own file, the files merged in order, and an overlay that would change the
source refused by name. Before, only dry runs of the whole workflow reached these."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO

from emb.training.run_config import ConfigError
from emb.workflow import parsed_runs

SCHEMA = Path("workflow/schemas/train.schema.yaml")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project's config/train and the schema, where the workflow runs (its working dir)."""
    shutil.copytree(REPO / "config/train", tmp_path / "config/train")
    (tmp_path / SCHEMA).parent.mkdir(parents=True)
    shutil.copyfile(REPO / SCHEMA, tmp_path / SCHEMA)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_runs_source_comes_from_its_own_file(project: Path) -> None:
    assert parsed_runs.run_source("aef_segformer", SCHEMA) == "aef"
    assert parsed_runs.run_source("tessera_deeplab", SCHEMA) == "tessera"


def test_a_runs_source_is_read_not_resolved_when_its_files_name_one(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each resolution validates against the schema: the parse resolves each run once
    (resolve_run), not twice."""
    resolved = []
    monkeypatch.setattr(parsed_runs, "resolve", lambda *args: resolved.append(args) or {})
    assert parsed_runs.run_source("tessera_deeplab", SCHEMA) == "tessera"
    assert resolved == []


@pytest.mark.parametrize("body", ["data: {}\n", "data:\n  source: sentinel\n", "[1, 2]\n"])
def test_a_run_file_naming_no_known_source_is_resolved_and_refused_by_name(
    project: Path, body: str
) -> None:
    (project / "config/train/odd.yaml").write_text(body)
    with pytest.raises(ConfigError, match=r"train config of run 'odd'.*config/train/odd.yaml"):
        parsed_runs.run_source("odd", SCHEMA)


def test_a_run_without_its_file_is_named(project: Path) -> None:
    with pytest.raises(ConfigError, match=r"train config of run 'nope'.*config/train/nope.yaml"):
        parsed_runs.run_source("nope", SCHEMA)


def test_the_files_merge_in_order_and_a_file_listed_twice_merges_once(project: Path) -> None:
    overlays = ["config/train/demo.yaml", "config/train/demo.yaml", "mine.yaml"]
    assert parsed_runs.run_config_files("aef_deeplab", overlays) == [
        "config/train/defaults.yaml",
        "config/train/aef_deeplab.yaml",
        "config/train/demo.yaml",
        "mine.yaml",
    ]


def test_an_overlay_that_changes_the_runs_source_is_refused_naming_both(project: Path) -> None:
    (project / "swap.yaml").write_text("data:\n  source: tessera\nmodel:\n  in_dim: 128\n")
    files = parsed_runs.run_config_files("aef_segformer", ["swap.yaml"])
    with pytest.raises(ConfigError, match=r"data.source: expected the run file's 'aef'.*'tessera'"):
        parsed_runs.resolve_run("aef_segformer", files, SCHEMA, "aef")
    resolved = parsed_runs.resolve_run(
        "aef_segformer", parsed_runs.run_config_files("aef_segformer", []), SCHEMA, "aef"
    )
    assert resolved["data"]["source"] == "aef" and resolved["train"]["num_workers"] >= 0


def test_an_overlay_key_the_schema_does_not_know_names_the_run_and_the_file(
    project: Path,
) -> None:
    (project / "typo.yaml").write_text("train:\n  epocs: 3\n")
    files = parsed_runs.run_config_files("tessera_segformer", ["typo.yaml"])
    with pytest.raises(ConfigError, match=r"run 'tessera_segformer'.*typo.yaml"):
        parsed_runs.resolve_run("tessera_segformer", files, SCHEMA, "tessera")


def test_the_shard_check_asks_for_the_most_reader_threads_of_the_sources_runs() -> None:
    configs = [
        {"data": {"source": "aef"}, "train": {"num_workers": 2}},
        {"data": {"source": "aef"}, "train": {"num_workers": 6}},
        {"data": {"source": "tessera"}, "train": {"num_workers": 9}},
    ]
    assert parsed_runs.loader_workers(configs, "aef") == 6
    assert parsed_runs.loader_workers(configs, "tessera") == 9
    assert parsed_runs.loader_workers(configs[:2], "tessera") == 0
