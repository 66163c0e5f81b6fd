"""H6's proposed tests for the stages area_estimates (its options, the confidence it uses, a
record given apart) and sample_design (the files it writes, what it refuses)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_holdout_check import CLASSES, region_files, settings_arg
from test_labelled_estimates import labelled_sample, scene, stage_on_sample, write_map

from emb.classes import load_class_map
from emb.estimation import area_estimates, sample_design
from emb.estimation.design import draw_points
from emb.estimation.estimators import z_of


def stage_args(tmp_path: Path, *extra: str) -> list[str]:
    _, _, paths = region_files(tmp_path)
    maps = tmp_path / "maps"
    maps.mkdir(exist_ok=True)
    (maps / "r1.tif").write_bytes(paths["map"].read_bytes())
    return ["--run", "run", "--maps", str(maps), "--indexes", str(paths["index"]),
            "--labels", str(paths["labels"]), "--classes", str(CLASSES),
            "--csv", str(tmp_path / "run.csv"), "--png", str(tmp_path / "run.png"),
            *(extra or [settings_arg(n=200, min_per_class=5)])]  # fmt: skip


def test_the_intervals_are_at_the_confidence_asked(tmp_path: Path) -> None:
    area_estimates.main(
        stage_args(tmp_path, settings_arg(n=200, min_per_class=5, draws=3, confidence=0.8))
    )
    frame = pd.read_csv(tmp_path / "run.csv")
    assert (frame["confidence"] == 0.8).all()
    wald = frame.dropna(subset=["se_ha", "wald_lo_ha"])
    width = wald["wald_hi_ha"] - wald["wald_lo_ha"]  # each figure rounded to 0.01 ha
    assert np.allclose(width, 2 * z_of(0.8) * wald["se_ha"], atol=0.03)
    assert not np.allclose(width, 2 * z_of(0.95) * wald["se_ha"], atol=0.03)
    held = frame.dropna(subset=["lo_ha"])
    assert len(held) and (held["lo_ha"] <= held["estimated_ha"]).all()
    assert (held["estimated_ha"] <= held["hi_ha"]).all()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            [settings_arg(draws=0)],
            "--settings: area_estimates.draws: 0 is less than the minimum of 1",
        ),
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
    out = stage_on_sample(tmp_path, truth, sample_csv, 2, "--record", str(apart))
    assert (pd.read_csv(out)["method"] == "user sample").any()


def test_sample_design_writes_the_design_asked_for(tmp_path: Path) -> None:
    _, mapped = scene(0)
    m = write_map(tmp_path / "r1.tif", mapped)
    out = tmp_path / "sample"
    sample_design.main(["--maps", str(m), "--classes", str(CLASSES),
                        settings_arg(n=60, min_per_class=5, level=2, seed=4),
                        "--out-dir", str(out)])  # fmt: skip
    record = json.loads((out / "sample.json").read_text())
    assert (record["n"], record["n_drawn"], record["seed"], record["level"]) == (60, 60, 4, 2)
    want = draw_points([m], 2, load_class_map(CLASSES), 60, 5, 4)
    rows = list(csv.DictReader((out / "sample.csv").open()))
    assert [float(r["x"]) for r in rows] == want.points.x.tolist()
    assert (out / "sample.gpkg").stat().st_size > 0


@pytest.mark.parametrize(
    ("option", "message"),
    [(settings_arg(n=0), "area_estimates.sample.n: 0 is less than the minimum of 1"),
     (settings_arg(seed=-1), "area_estimates.sample.seed: -1 is less than the minimum of 0"),
     (settings_arg(min_per_class=1), "sample.min_per_class: 1 is less than the minimum of 2"),
     ('--settings={"levl": 2}', "Additional properties are not allowed ('levl' was unexpected)")],
)  # fmt: skip
def test_sample_design_refuses_a_design_it_cannot_draw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, message: str
) -> None:
    _, mapped = scene(0)
    m = write_map(tmp_path / "r1.tif", mapped)
    with pytest.raises(SystemExit) as exit_:
        sample_design.main(["--maps", str(m), "--classes", str(CLASSES),
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
                         "--labels", str(labels), "--classes", str(CLASSES),
                         settings_arg(n=50, min_per_class=5, draws=2),
                         "--labelled", str(sample_csv),
                         "--csv", str(out), "--png", str(tmp_path / "b.png")])  # fmt: skip
    users = pd.read_csv(out).query("method == 'user sample'")
    assert len(users) == 1 and "r1" in users["note"].iloc[0]
