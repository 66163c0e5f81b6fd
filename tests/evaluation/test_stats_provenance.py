"""Channel statistics are part of what made a result: their digest is in train.json, the
checkpoints and metrics.json, and evaluate and predict refuse statistics that changed since
training (as they refuse a changed manifest) before they write anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CLASSES_CSV, TinyDemo, venv_env
from training_runs import resolve_config, train_here

from emb.provenance import UNUSED, digest_stats
from emb.training import checkpoint_file


@pytest.fixture(scope="module")
def tessera_run(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained TESSERA run (it normalizes with its channel statistics)."""
    root = tmp_path_factory.mktemp("stats_run")
    subprocess.run(
        [sys.executable, "-m", "emb.prep.channel_stats", "--n-tiles=all",
         f"--manifest={tiny_demo.manifests['tessera']}", f"--out-dir={root / 'stats'}"],
        check=True, capture_output=True, env=venv_env(),
    )  # fmt: skip
    config = resolve_config(tiny_demo, root / "run", "train.epochs=1",
                            f"data.stats_dir={root / 'stats'}", source="tessera")  # fmt: skip
    summary = train_here(config)  # what the stage writes to train.json
    (root / "train.json").write_text(json.dumps(summary))
    return root


def stage(module: str, run_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """Evaluate, or predict every region of a table (the run is opened before the table)."""
    table = [f"--regions={out.parent / 'regions.tsv'}", "--overlap=0.5", "--block=1024",
             "--batch-size=16"] if module.endswith("predict") else []  # fmt: skip
    cmd = [sys.executable, "-m", module, f"--run-dir={run_dir}", f"--classes={CLASSES_CSV}",
           f"--out-dir={out}", "--threads=1", *table]  # fmt: skip
    return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=300)


def test_train_json_checkpoints_and_metrics_carry_the_stats_digest(
    tessera_run: Path, tmp_path: Path
) -> None:
    expected = digest_stats(tessera_run / "stats")
    run_dir = tessera_run / "run"
    assert (
        json.loads((tessera_run / "train.json").read_text())["provenance"]["stats_digest"]
        == expected
    )
    for name in ("best.pt", "last.pt"):
        assert checkpoint_file.load(run_dir / name)["provenance"]["stats_digest"] == expected, name
    result = stage("emb.evaluation.evaluate", run_dir, tmp_path / "eval")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["provenance"]["stats_digest"] == expected
    assert metrics["trained_with"]["stats_digest"] == expected


def test_a_run_without_normalization_records_its_stats_as_unused(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    config = resolve_config(tiny_demo, tmp_path / "run", "train.epochs=1")  # AEF
    assert train_here(config)["provenance"]["stats_digest"] == UNUSED


def test_the_digest_sees_every_byte_of_both_files(tessera_run: Path, tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    for name in ("channel_mean.npy", "channel_std.npy"):
        (stats / name).write_bytes((tessera_run / "stats" / name).read_bytes())
    before = digest_stats(stats)
    std = np.load(stats / "channel_std.npy")
    std[3] *= 1.0001
    np.save(stats / "channel_std.npy", std)
    assert digest_stats(stats) != before


@pytest.mark.parametrize("module", ["emb.evaluation.evaluate", "emb.evaluation.predict"])
def test_statistics_changed_since_training_are_refused(
    tessera_run: Path, tmp_path: Path, module: str
) -> None:
    """The statistics rebuilt (another sample of tiles): other bytes, still valid."""
    stats = tessera_run / "stats"
    mean_file = stats / "channel_mean.npy"
    kept = mean_file.read_bytes()
    mean = np.load(mean_file)
    try:
        np.save(mean_file, mean + np.float32(0.01))
        out = tmp_path / "out"
        result = stage(module, tessera_run / "run", out)
    finally:
        mean_file.write_bytes(kept)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert f"channel statistics in {stats}" in message and "changed since training" in message
    assert not out.exists() or not any(out.rglob("*.json")) and not any(out.rglob("*.tif"))
