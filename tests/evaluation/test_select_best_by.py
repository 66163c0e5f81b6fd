"""``ema.select_best_by: raw``: best.pt was picked by its raw weights, so evaluation, prediction
and the summary report the raw weights even though the checkpoint also holds EMA weights."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import rasterio
from conftest import CLASSES_CSV, TinyDemo
from tiny_runs import fit, resolved_config, write_run

from emb.classes import load_class_map
from emb.evaluation.evaluate import main as evaluate_main
from emb.evaluation.predict import main as predict_main
from emb.evaluation.runs import open_run
from emb.report.summary import main as summary_main


@pytest.fixture(scope="module")
def raw_selected(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with raw and EMA weights (the half-way weights play the EMA), selected by raw."""
    root = tmp_path_factory.mktemp("select_raw")
    config = resolved_config(tiny_demo, root, "aef", "segformer")
    config["ema"]["select_best_by"] = "raw"
    final, half = fit(config, 40)
    tile = tiny_demo.manifest("aef")["tile_size"]
    return write_run(root / "runs" / "aef_raw", config, final, half, tile_size=tile)


def test_the_run_stands_for_its_raw_weights(raw_selected: Path) -> None:
    run = open_run(raw_selected, load_class_map(CLASSES_CSV), CLASSES_CSV)
    assert set(run.weights) == {"raw", "ema"} and run.selected == "raw"


def test_evaluate_and_summary_report_the_raw_weights(raw_selected: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    evaluate_main(["--run-dir", str(raw_selected), "--classes", str(CLASSES_CSV),
                   "--out-dir", str(out), "--threads=1"])  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["weights"] == "raw" and set(metrics["weight_sets"]) == {"raw", "ema"}
    assert metrics["ema"]["l3"]["miou"] != metrics["raw"]["l3"]["miou"]
    for level in ("l1", "l2", "l3"):
        assert metrics[f"miou_{level}"] == metrics["raw"][level]["miou"]
    summary_main(["--runs", "aef_raw", "--metrics", str(out / "metrics.json"),
                  "--out", str(tmp_path / "summary.csv")])  # fmt: skip
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert row["weights"] == "raw"
    assert row["miou_l3"] == pytest.approx(metrics["raw"]["l3"]["miou"])


def test_predict_maps_with_the_raw_weights(
    raw_selected: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    out = tmp_path / "demo_a.tif"
    predict_main(["--run-dir", str(raw_selected), "--raster",
                  str(tiny_demo.rasters["demo_a"]["aef"]), "--region", "demo_a", "--classes",
                  str(CLASSES_CSV), "--out", str(out), "--png",
                  str(tmp_path / "demo_a.png"), "--overlap=0.5", "--block=1024",
                  "--batch-size=16", "--threads=1"])  # fmt: skip
    with rasterio.open(out) as ds:
        assert ds.tags()["WEIGHTS"] == "raw"
