"""A checkpoint must be its run's and of the data the run names: evaluate and predict refuse
another run's checkpoint, or a run whose data changed since training, before they rewrite
anything; training does not resume an unfinished last.pt of other data."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLASSES_CSV, TinyDemo, venv_env
from training_runs import interrupt, resolve_config, train_here

from emb.training import checkpoint_file


@pytest.fixture(scope="module")
def two_runs(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two trained runs side by side: ``aef_r`` (SegFormer) and ``deeplab_r`` (DeepLab)."""
    root = tmp_path_factory.mktemp("runs")
    for name, arch in (("aef_r", "segformer"), ("deeplab_r", "deeplab")):
        train_here(resolve_config(tiny_demo, root / name, "train.epochs=1", arch=arch))
    return root


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def rebuild(manifest: Path) -> None:
    """The manifest as a rebuild of the data could leave it: other bytes, still valid."""
    content = json.loads(manifest.read_text())
    content["warnings"] = [*content.get("warnings", []), "rebuilt"]
    manifest.write_text(json.dumps(content))


def evaluate(run_dir: Path, out_dir: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "emb.evaluation.evaluate", f"--run-dir={run_dir}",
           f"--classes={CLASSES_CSV}", f"--out-dir={out_dir}", "--threads=1"]  # fmt: skip
    return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=300)


def test_evaluating_another_runs_checkpoint_is_refused_and_keeps_the_runs_results(
    two_runs: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "deeplab_r"
    shutil.copytree(two_runs / "deeplab_r", run_dir)
    out = tmp_path / "eval"
    assert evaluate(run_dir, out).returncode == 0  # its own checkpoint: fine
    before = tree_hashes(out)
    for name in ("best.pt", "best.pt.sha256"):  # a user's `cp ../aef_r/best.pt* .`
        shutil.copyfile(two_runs / "aef_r" / name, run_dir / name)

    result = evaluate(run_dir, out)

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert str(run_dir / "best.pt") in message and "another run" in message, message
    assert tree_hashes(out) == before


def test_a_checkpoint_of_the_same_shape_under_another_run_name_is_refused(
    two_runs: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "aef_other"
    shutil.copytree(two_runs / "aef_r", run_dir)  # same config, but trained as aef_r
    result = evaluate(run_dir, tmp_path / "eval")
    assert result.returncode != 0
    assert "run: expected 'aef_other'" in result.stderr and "'aef_r'" in result.stderr
    assert not (tmp_path / "eval" / "metrics.json").exists()


def test_evaluating_after_the_data_changed_is_refused(
    two_runs: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    run_dir = tmp_path / "aef_r"
    shutil.copytree(two_runs / "aef_r", run_dir)
    manifest = tmp_path / "manifest.json"  # the run's data, rebuilt since it was trained
    shutil.copyfile(tiny_demo.manifests["aef"], manifest)
    state = checkpoint_file.load(run_dir / "best.pt")
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace(str(tiny_demo.manifests["aef"]), str(manifest)))
    state["config"]["data"]["manifest"] = str(manifest)
    checkpoint_file.save(run_dir / "best.pt", state)
    assert evaluate(run_dir, tmp_path / "same").returncode == 0  # same bytes: same data
    rebuild(manifest)

    result = evaluate(run_dir, tmp_path / "eval")

    assert result.returncode != 0
    assert f"trained on {manifest}" in result.stderr and "data changed" in result.stderr
    assert not (tmp_path / "eval" / "metrics.json").exists()


def test_an_unfinished_last_pt_of_other_data_is_not_resumed(
    tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    run_dir = tmp_path / "run"
    manifest = tmp_path / "manifest.json"
    shutil.copyfile(tiny_demo.manifests["aef"], manifest)
    config = resolve_config(tiny_demo, run_dir, "train.epochs=2", f"data.manifest={manifest}")
    interrupt(config)
    kept = (run_dir / "last.pt").read_bytes()
    rebuild(manifest)
    capsys.readouterr()

    train_here(config)

    out = capsys.readouterr().out
    assert "was trained on other data" in out and "starting over" in out
    assert "resumed from" not in out
    (aside,) = (run_dir / "previous").iterdir()
    assert (aside / "last.pt").read_bytes() == kept
