"""What the report shows and where it files each map (emb.workflow.report_targets), and predict's
options from config predict: (emb.workflow.stage_options), asked directly: before, only a
finished workflow's report and dry runs reached them."""

from __future__ import annotations

import shlex

from emb.workflow import report_targets
from emb.workflow.stage_options import predict_options


def test_the_report_shows_every_runs_maps_and_curves_and_each_sources_data() -> None:
    assert report_targets.report_targets(["aef_x", "tessera_y"], ["aef", "tessera"]) == [
        "results/maps/aef_x",
        "results/maps/tessera_y",
        "results/runs/aef_x/curves.png",
        "results/runs/tessera_y/curves.png",
        "results/data/aef.png",
        "results/data/aef.html",
        "results/data/tessera.png",
        "results/data/tessera.html",
    ]


def test_a_prediction_only_regions_map_is_filed_apart_and_labelled_unscored() -> None:
    assert report_targets.map_category("predict") == "Maps, unscored (prediction-only regions)"
    assert report_targets.map_labels("aef_x", "next", "predict") == {
        "run": "aef_x",
        "region": "next",
        "scored": "no (split predict)",
    }
    for split in ("", "auto", "train", "test"):
        assert report_targets.map_category(split) == "Maps"
        assert report_targets.map_labels("aef_x", "r", split)["scored"] == "test tiles"


def test_predict_gets_the_windows_settings_and_only_the_options_that_are_set() -> None:
    settings = {"overlap": 0.5, "block": 1024, "batch_size": 16, "tile": None,
                "probabilities": False}  # fmt: skip
    assert predict_options(settings) == "--overlap=0.5 --block=1024 --batch-size=16"
    given = {**settings, "tile": 64, "probabilities": True}
    assert shlex.split(predict_options(given)) == [
        "--overlap=0.5",
        "--block=1024",
        "--batch-size=16",
        "--tile=64",
        "--with-probabilities",
    ]


def test_a_report_entry_is_labelled_by_the_run_or_source_its_path_names() -> None:
    """The rules' report_file helper (workflow/rules/common.smk): a run's file in a subsection
    of its run, a source's labelled with its source, a workflow-wide one with what it shows."""
    assert report_targets.report_settings("results/eval/{run}/iou.png", "iou", "Runs", "IoU") == {
        "caption": "../report/iou.rst",
        "category": "Runs",
        "subcategory": "{run}",
        "labels": {"run": "{run}", "figure": "IoU"},
    }
    data = report_targets.report_settings("results/data/{source}.png", "data", "Data", "tiles")
    assert data["subcategory"] is None
    assert data["labels"] == {"source": "{source}", "figure": "tiles"}
    summary = report_targets.report_settings("results/summary.csv", "summary", "Summary", "table")
    assert (summary["subcategory"], summary["labels"]) == (None, {"figure": "table"})
