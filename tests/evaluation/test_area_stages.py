"""H6's proposed tests for the stages area_estimates (its options, the confidence it uses, a
record given apart) and reference_points (the files it writes, what it refuses)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_area_check import CLASSES, region_files
from test_sample_estimates import labelled_sample, scene, write_map

from emb.classes import load_class_map
from emb.evaluation import area_estimates, reference_points
from emb.evaluation.area_estimator import z_of
from emb.evaluation.sample_design import draw_points


def stage_args(tmp_path: Path, *extra: str) -> list[str]:
    _, _, paths = region_files(tmp_path)
    maps = tmp_path / "maps"
    maps.mkdir(exist_ok=True)
    (maps / "r1.tif").write_bytes(paths["map"].read_bytes())
    return ["--run", "run", "--maps", str(maps), "--indexes", str(paths["index"]),
            "--labels", str(paths["labels"]), "--classes", str(CLASSES), "--n", "200",
            "--min-per-class", "5", "--csv", str(tmp_path / "run.csv"),
            "--png", str(tmp_path / "run.png"), *extra]  # fmt: skip


def test_the_intervals_are_at_the_confidence_asked(tmp_path: Path) -> None:
    area_estimates.main(stage_args(tmp_path, "--draws", "3", "--confidence", "0.8"))
    frame = pd.read_csv(tmp_path / "run.csv").dropna(subset=["se_ha", "lo_ha"])
    frame = frame[frame["se_ha"] > 0]
    z = (frame["hi_ha"] - frame["lo_ha"]) / (2 * frame["se_ha"])
    assert np.allclose(z, z_of(0.8))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--draws", "0"], "--draws: expected an integer >= 1, found 0"),
        (["--labels", "a.tif", "b.tif"], "--labels: expected one per --indexes (1), found 2"),
    ],
)
def test_the_stage_refuses_bad_options_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    args = stage_args(tmp_path)
    if extra[0] == "--labels":
        i = args.index("--labels")
        args[i + 1 : i + 2] = extra[1:]
    else:
        args += extra
    with pytest.raises(SystemExit) as exit_:
        area_estimates.main(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run.csv").exists()


def test_a_design_record_given_apart_from_the_sample_is_used(tmp_path: Path) -> None:
    truth, mapped = scene(0)
    sample_csv, record = labelled_sample(tmp_path, truth, mapped, level=2)
    apart = tmp_path / "records" / "design.json"
    apart.parent.mkdir()
    record.rename(apart)
    labels = write_map(tmp_path / "labels.tif", truth)
    index = tmp_path / "r1" / "index.json"
    index.parent.mkdir()
    index.write_text('{"tile_size": 40, "splits": {"test": {"blocks": {"r1_40_40": "b"}}}}')
    out = tmp_path / "run.csv"
    area_estimates.main(["--run", "a", "--maps", str(tmp_path / "maps"), "--indexes", str(index),
                         "--labels", str(labels), "--classes", str(CLASSES), "--n", "50",
                         "--min-per-class", "5", "--draws", "2", "--labelled", str(sample_csv),
                         "--record", str(apart), "--csv", str(out),
                         "--png", str(tmp_path / "run.png")])  # fmt: skip
    assert (pd.read_csv(out)["method"] == "user sample").any()


def test_reference_points_writes_the_design_asked_for(tmp_path: Path) -> None:
    _, mapped = scene(0)
    m = write_map(tmp_path / "r1.tif", mapped)
    out = tmp_path / "sample"
    reference_points.main(["--maps", str(m), "--classes", str(CLASSES), "--n", "60",
                           "--min-per-class", "5", "--level", "2", "--seed", "4",
                           "--out-dir", str(out)])  # fmt: skip
    record = json.loads((out / "sample.json").read_text())
    assert (record["n"], record["n_drawn"], record["seed"], record["level"]) == (60, 60, 4, 2)
    want = draw_points([m], 2, load_class_map(CLASSES), 60, 5, 4)
    rows = list(csv.DictReader((out / "sample.csv").open()))
    assert [float(r["x"]) for r in rows] == want.points.x.tolist()
    assert (out / "sample.gpkg").stat().st_size > 0


@pytest.mark.parametrize(
    ("option", "message"),
    [("--n=0", "--n: expected an integer >= 1, found 0"),
     ("--seed=-1", "--seed: expected an integer >= 0, found -1")],
)  # fmt: skip
def test_reference_points_refuses_a_design_it_cannot_draw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, message: str
) -> None:
    _, mapped = scene(0)
    m = write_map(tmp_path / "r1.tif", mapped)
    with pytest.raises(SystemExit) as exit_:
        reference_points.main(["--maps", str(m), "--classes", str(CLASSES),
                               "--out-dir", str(tmp_path / "s"), option])  # fmt: skip
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_run_that_does_not_map_the_samples_region_gets_a_note_not_a_failure(
    tmp_path: Path,
) -> None:
    """FAILS at 573a6dd (exit 66: maps_b/r1.tif cannot be read): the fix to test."""
    truth, mapped = scene(0)
    sample_csv, _ = labelled_sample(tmp_path, truth, mapped, level=2)
    other = tmp_path / "maps_b"
    other.mkdir()
    write_map(other / "r2.tif", mapped)  # run b maps r2 only
    labels = write_map(tmp_path / "labels.tif", truth)
    index = tmp_path / "r2" / "index.json"
    index.parent.mkdir()
    index.write_text('{"tile_size": 40, "splits": {"test": {"blocks": {"r2_40_40": "b"}}}}')
    out = tmp_path / "b.csv"
    area_estimates.main(["--run", "b", "--maps", str(other), "--indexes", str(index),
                         "--labels", str(labels), "--classes", str(CLASSES), "--n", "50",
                         "--min-per-class", "5", "--draws", "2", "--labelled", str(sample_csv),
                         "--csv", str(out), "--png", str(tmp_path / "b.png")])  # fmt: skip
    users = pd.read_csv(out).query("method == 'user sample'")
    assert len(users) == 1 and "r1" in users["note"].iloc[0]
