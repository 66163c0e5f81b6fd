"""The real Snakemake workflow on the tiny demo, run once: every declared output, the summary,
maps and report, a rerun and a moved project with nothing to do, a prediction-only region added
after it. (A fresh checkout's dry run and your own regions: tests/test_workflow_inputs.py.)"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyogrio
import pytest
import rasterio
from conftest import REPO
from workflow_runs import RULES, RUNS, make_workdir, snakemake

from emb.provenance import digest_config, digest_file
from emb.training import checkpoint_file


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = make_workdir(tmp_path_factory.mktemp("workflow"))
    result = snakemake(workdir, "--cores", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir


def test_full_run_creates_every_declared_output(finished_run: Path) -> None:
    result = snakemake(finished_run, "--summary")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("\t") for line in result.stdout.splitlines()[1:] if line.strip()]
    outputs = [row[0] for row in rows]
    assert len(outputs) >= 30
    folders = [p for p in outputs if (finished_run / p).is_dir()]  # predict's maps per run
    assert sorted(folders) == sorted(f"results/maps/{run}" for run in RUNS)
    absent = [p for p in outputs if p not in folders and not (finished_run / p).is_file()]
    assert not absent, f"declared outputs missing: {absent}"
    files = [p for p in outputs if p not in folders]
    maps = [f for d in folders for f in (finished_run / d).glob("[!.]*")]  # no dot files
    files += [str(f.relative_to(finished_run)) for f in maps]
    for folder in folders:  # a map, its GDAL and QGIS legends and its quicklook per region
        assert {f.name for f in (finished_run / folder).glob("[!.]*")} == {
            f"{region}{ext}" for region in ("demo_a", "demo_b")
            for ext in (".tif", ".tif.aux.xml", ".qml", ".png")}  # fmt: skip
    empty = [p for p in files if (finished_run / p).stat().st_size == 0]
    assert not empty, f"declared outputs empty: {empty}"


def test_summary_holds_every_run_with_finite_metrics(finished_run: Path) -> None:
    table = pd.read_csv(finished_run / "results" / "summary.csv")
    assert sorted(table["run"]) == sorted(RUNS)
    metric_cols = [c for c in table.columns if c.split("_")[0] in ("miou", "f1", "oa")]
    figures = [c for c in metric_cols if not c.endswith(("_lo", "_hi"))]
    assert len(figures) == 9 and len(metric_cols) == 27
    values = table[figures].to_numpy().ravel()
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values)
    enough = table["blocks"] >= 10  # below 10 test blocks (the demo): no interval at all
    for c in figures:
        assert (table.loc[enough, f"{c}_lo"] <= table.loc[enough, f"{c}_hi"]).all(), c
        assert table.loc[~enough, [f"{c}_lo", f"{c}_hi"]].isna().all().all(), c
    assert "blocks" in table and (finished_run / "results" / "pairs.csv").is_file()


def test_summary_shows_validation_and_test_side_by_side(finished_run: Path) -> None:
    table = pd.read_csv(finished_run / "results" / "summary.csv").set_index("run")
    for run in RUNS:
        history = pd.read_csv(finished_run / f"results/runs/{run}/history.csv")
        weights = table.loc[run, "weights"]
        best = history.loc[history[f"val_{weights}_miou_l3"].idxmax()]
        for level in ("l1", "l2", "l3"):
            assert table.loc[run, f"val_miou_{level}"] == pytest.approx(
                best[f"val_{weights}_miou_{level}"], abs=1e-12
            )
    page = (finished_run / "results" / "summary.html").read_text()
    assert "one definition" in page and page.count("test_miou") >= 1


def test_every_rule_leaves_a_log_and_a_benchmark(finished_run: Path) -> None:
    for rule in RULES:
        assert list((finished_run / "logs").glob(f"{rule}*")), f"no log of {rule}"
        assert list((finished_run / "benchmarks").glob(f"{rule}*")), f"no benchmark of {rule}"


@pytest.mark.parametrize("source", ["aef", "tessera"])
def test_one_shards_job_logs_its_two_stages(finished_run: Path, source: str) -> None:
    """Rule shards aligns the labels, then cuts the shards: the second stage appends to the
    first's log, so one log says what both did (and why one failed)."""
    log = (finished_run / f"logs/shards/{source}/demo_a.log").read_text()
    assert f"INFO emb.prep.align_labels: results/labels/{source}/demo_a.tif: " in log, log
    assert f"INFO emb.prep.shards: {source}/demo_a: samples " in log, log


@pytest.mark.parametrize("run", RUNS)
def test_maps_on_a_laptop_use_every_core_snakemake_was_given(finished_run: Path, run: str) -> None:
    log = (finished_run / f"logs/predict/{run}.log").read_text()
    launch = next(line for line in log.splitlines() if line.startswith("launch: "))
    assert launch.startswith("launch: python -m emb.evaluation.predict ")  # one process
    assert "--threads=2" in launch.split()  # --cores 2, not one thread
    assert f"published 2 maps into results/maps/{run}" in log


def test_rerun_has_nothing_to_do(finished_run: Path) -> None:
    result = snakemake(finished_run, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr


def test_a_finished_project_copied_or_renamed_elsewhere_has_nothing_to_do(
    finished_run: Path, tmp_path: Path
) -> None:
    """No job's input or params may name the project's absolute path (it was the train
    schema's): a project moved to project storage would retrain every run."""
    copied = tmp_path / "copied"
    shutil.copytree(finished_run, copied, symlinks=True)  # copy2: the files keep their mtimes
    moved = copied.rename(tmp_path / "renamed project")
    result = snakemake(moved, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


def test_fewer_train_shards_than_ranks_stop_the_manifest_rule_in_snakemake(
    finished_run: Path, tmp_path: Path
) -> None:
    """The rule, not only its module: rule train's tasks per node reach the manifest's check
    through Snakemake's resources, and the job fails naming the shards and the ranks."""
    project = tmp_path / "project"
    shutil.copytree(finished_run, project, symlinks=True)
    manifest = "results/shards/aef/manifest.json"
    shards = len(json.loads((project / manifest).read_text())["splits"]["train"]["shards"])
    ranks = shards + 1
    result = snakemake(project, "--cores", "1", "--forcerun", "manifest", "--set-resources",
                       f"train:tasks_per_node={ranks}", "--", manifest)  # fmt: skip
    assert result.returncode != 0, result.stdout[-2000:]
    log = (project / "logs/manifest/aef.log").read_text()
    assert f"aef split 'train' has {shards} shards, expected at least {ranks}" in log, log


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("region", ["demo_a", "demo_b"])
def test_every_map_has_the_crs_transform_and_shape_of_its_input(
    finished_run: Path, run: str, region: str
) -> None:
    source = run.split("_")[0]
    with rasterio.open(finished_run / f"resources/demo/{region}/{source}.tif") as src:
        crs, transform, shape = src.crs, src.transform, src.shape
    with rasterio.open(finished_run / f"results/maps/{run}/{region}.tif") as out:
        assert (out.crs, out.transform, out.shape) == (crs, transform, shape)
        assert out.dtypes[0] == "uint8" and out.nodata == 255
        assert (out.read(1) != 255).mean() > 0


def test_every_run_has_its_area_table_whose_intervals_hold_on_its_test_split(
    finished_run: Path,
) -> None:
    """Issue 49: the test split's check for every run: mapped, estimated with its interval and
    the CDL's area, and the intervals' coverage over the seeded draws at least 90% for the
    classes with 100 sample units or more (Olofsson's rule of thumb is 50-100 a stratum), their
    width near Wald's (issue 57)."""
    for run in RUNS:
        frame = pd.read_csv(finished_run / "results" / "area_estimates" / f"{run}.csv")
        check = frame[frame["method"] == "test split, CDL reference"]
        assert set(check["level"]) == {1, 2, 3}, run
        assert (finished_run / "results" / "area_estimates" / f"{run}.png").stat().st_size > 10_000
        for level, part in check.groupby("level"):  # one population at every level
            rounding = 0.005 * len(part) + 1e-9  # each row's hectares to 0.01
            total = pytest.approx(part["mapped_ha"].sum(), abs=rounding)
            assert part["cdl_ha"].sum() == total, (run, level)
            assert part["estimated_ha"].sum() == pytest.approx(part["cdl_ha"].sum(), abs=rounding)
        enough = check[(check["units_reference"] >= 100) & (check["cdl_ha"] > 0)]
        assert len(enough) >= 3, (run, check[["level", "class", "units_reference"]])
        assert (enough["coverage"] >= 0.90).all(), (run, enough[["class", "coverage"]])
        # not held by width: at most 15% wider than Wald's on average, 30% each (a coverage
        # near 1 over 200 draws is a class with few errors, not a wide interval)
        width = (enough["hi_ha"] - enough["lo_ha"]) / (enough["wald_hi_ha"] - enough["wald_lo_ha"])
        assert width.mean() <= 1.15 and (width <= 1.3).all(), (run, width.round(2).tolist())
        assert enough["lo_ha"].notna().all() and (enough["lo_ha"] < enough["hi_ha"]).all()
        # issue 57: every class with >= 20 units has an interval, at the configured level
        some = check[check["units_reference"] >= 20]
        assert some["lo_ha"].notna().all(), (run, some[some["lo_ha"].isna()][["class", "note"]])
        assert (check["confidence"] == 0.95).all() and check["wald_coverage"].notna().any()
        design = check[check["level"] == 3]
        assert design["recommended_units"].notna().all()
        assert design["expected_half_width"].notna().any()
    page = (finished_run / "results" / "summary.html").read_text()
    assert "Crop areas (hectares, 95% intervals)" in page and "id='areas'" in page
    assert "Wald coverage" in page


def test_districts_from_a_file_or_the_regions_map_and_stratify_a_sample(
    finished_run: Path, tmp_path: Path
) -> None:
    """Issue 58: the demo's districts file maps each run's headline class on the summary page
    (from its district layer); rule sample_design draws by district x class; with
    ``districts.source: regions`` each region is a district of the layer and of the sample."""
    page = (finished_run / "results" / "summary.html").read_text()
    assert page.count("<img class='districts'") == len(RUNS)
    project = tmp_path / "project"
    shutil.copytree(finished_run, project, symlinks=True)
    sample = "results/samples/aef_segformer/sample.csv"
    result = snakemake(project, "--cores", "1", sample)
    assert result.returncode == 0, result.stderr[-3000:]
    drawn = pd.read_csv(project / sample)
    assert set(drawn["district"]) <= {"alder", "birch", "cedar", "outside"}
    assert drawn["district"].nunique() >= 2, drawn["district"].value_counts()
    layer = "results/area_estimates/aef_segformer_districts.gpkg"
    result = snakemake(project, "--cores", "1", "--config",
                       "area_estimates={districts: {source: regions}}", "--",
                       layer, sample)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    _, table = pyogrio.read_arrow(project / layer, layer="districts")
    assert sorted(table.column("district").to_pylist()) == ["demo_a", "demo_b"]
    drawn = pd.read_csv(project / sample)
    assert sorted(drawn["district"].unique()) == ["demo_a", "demo_b"]
    assert (drawn["district"] == drawn["region"]).all()


def test_report_shows_every_figure_of_every_run(finished_run: Path) -> None:
    result = snakemake(finished_run, "--report", "results/report.html")
    assert result.returncode == 0, result.stderr[-3000:]
    page = (finished_run / "results" / "report.html").read_text()

    def shown(name: str) -> int:
        return page.count(f'"filename": "{name}"')

    per_run = ["confusion_l1.png", "confusion_l2.png", "confusion_l3.png", "iou.png",
               "curves.png", "per_class.csv", "demo_a.png", "demo_b.png"]  # fmt: skip
    assert {name: shown(name) for name in per_run} == dict.fromkeys(per_run, len(RUNS))
    once = ["summary.html", "summary.png", "summary.csv", "pairs.png", "aef.png", "aef.html",
            "tessera.png", "tessera.html", "provenance.html"]  # fmt: skip
    assert {name: shown(name) for name in once} == dict.fromkeys(once, 1)
    assert "row-normalized" in page  # a caption from workflow/report/*.rst


def test_metrics_summary_and_maps_name_the_code_config_and_data_that_made_them(
    finished_run: Path,
) -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    table = pd.read_csv(finished_run / "results" / "summary.csv").set_index("run")
    for run in RUNS:
        source = run.split("_")[0]
        trained = checkpoint_file.load(finished_run / f"results/runs/{run}/best.pt")
        metrics = json.loads((finished_run / f"results/eval/{run}/metrics.json").read_text())
        manifest = finished_run / f"results/shards/{source}/manifest.json"
        expected = {
            "git_commit": head,
            "config_digest": digest_config(trained["config"]),
            "manifest_digest": digest_file(manifest),
        }
        for block in (trained["provenance"], metrics["trained_with"], table.loc[run]):
            assert {key: block[key] for key in expected} == expected, run
        assert metrics["provenance"]["manifest_digest"] == expected["manifest_digest"]
        with rasterio.open(finished_run / f"results/maps/{run}/demo_a.tif") as out:
            tags = out.tags()
        assert tags["TRAINED_CONFIG_DIGEST"] == expected["config_digest"]
        assert tags["PROVENANCE_GIT_COMMIT"] == head
        assert tags["PROVENANCE_TORCH_VERSION"] == metrics["provenance"]["torch_version"]
    page = (finished_run / "results" / "provenance.html").read_text()
    assert "What made each run" in page and head in page


def map_of(workdir: Path, run: str, region: str) -> tuple[tuple, np.ndarray]:
    """A map's grid (CRS, transform, shape) and its classes."""
    with rasterio.open(workdir / f"results/maps/{run}/{region}.tif") as out:
        return (out.crs, out.transform, out.shape), out.read(1)


def test_a_prediction_only_region_is_mapped_by_every_run_of_its_source_and_changes_nothing_else(
    finished_run: Path, tmp_path: Path
) -> None:
    """A 2025 AEF raster without CDL beside the 2024 demo: mapped, never labelled or scored."""
    workdir = tmp_path / "wd"
    shutil.copytree(finished_run, workdir, symlinks=True)
    src = workdir / "resources/demo/demo_b/aef.tif"
    raster = workdir / "inputs/next_season/aef.tif"
    raster.parent.mkdir(parents=True)
    with rasterio.open(src) as s:  # the same kind of ground, 20 km away
        profile = {**s.profile, "transform": s.transform * s.transform.translation(2000, 0)}
        data = s.read()
    with rasterio.open(raster, "w", **profile) as dst:
        dst.write(data)
    table = workdir / "config/regions.tsv"
    table.write_text(table.read_text() + f"next_season\t2025\t{raster}\t\t\tpredict\n")
    kept = ["results/shards/aef/manifest.json", "results/shards/tessera/manifest.json",
            "results/stats/aef/stats.json", "results/stats/tessera/stats.json",
            *[f"results/eval/{run}/metrics.json" for run in RUNS]]  # fmt: skip
    before = {name: (workdir / name).read_bytes() for name in kept}
    demo_maps = {(run, region): map_of(workdir, run, region) for run in RUNS
                 for region in ("demo_a", "demo_b")}  # fmt: skip

    result = snakemake(workdir, "--cores", "2")

    assert result.returncode == 0, result.stderr[-4000:]
    ran = set(re.findall(r"^(?:local)?rule (\w+):", result.stdout + result.stderr, re.M))
    # the maps' folder changed: the area checks read it (seconds) and the summary shows them
    assert ran == {"regions_table", "predict", "area_estimates", "summary", "all"}, ran
    assert {name: (workdir / name).read_bytes() for name in kept} == before
    for (run, region), (grid, classes) in demo_maps.items():  # predict ran again: same maps
        again, again_classes = map_of(workdir, run, region)
        assert again == grid and np.array_equal(again_classes, classes), (run, region)
    assert not list(workdir.glob("results/labels/*/next_season*"))
    assert not list(workdir.glob("results/shards/*/next_season"))
    with rasterio.open(raster) as s:
        grid = (s.crs, s.transform, s.shape)
    for run in RUNS:
        made = workdir / f"results/maps/{run}/next_season.tif"
        if not run.startswith("aef"):
            assert not made.exists(), run
            continue
        with rasterio.open(made) as out:
            assert (out.crs, out.transform, out.shape) == grid
            assert (out.read(1) != 255).mean() > 0.5
            tags = out.tags()
        assert tags["REGION_YEAR"] == "2025" and tags["TRAINING_YEARS"] == "2024"
        assert tags["SCORED"].startswith("no")
        for suffix in (".png", ".qml", ".tif.aux.xml"):
            assert made.with_name(f"next_season{suffix}").is_file(), suffix
    report = snakemake(workdir, "--report", "results/report.html")
    assert report.returncode == 0, report.stderr[-3000:]
    page = (workdir / "results/report.html").read_text()
    assert "Maps, unscored (prediction-only regions)" in page
    assert "favour AEF" in page  # AEF was trained with CDL among its targets
