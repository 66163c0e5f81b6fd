"""Bad input stops the workflow before any job starts, with one message naming row and column."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import rasterio
import yaml
from affine import Affine
from conftest import REPO, TinyDemo, venv_env

HEADER = "region\tyear\taef\ttessera\tcdl\tsplit\n"


def workdir_with(tmp_path: Path, rows: list[str]) -> Path:
    """A working directory whose regions.tsv holds ``rows`` (tab-separated, no header)."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    cfg = tmp_path / "config" / "config.yaml"  # blocks small enough for the rows' 1.28 km
    config = yaml.safe_load(cfg.read_text())
    config["splits"] = {**config.get("splits", {}), "block_m": 320}
    cfg.write_text(yaml.safe_dump(config))
    (tmp_path / "config" / "regions.tsv").write_text(HEADER + "".join(r + "\n" for r in rows))
    return tmp_path


def run_snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """A real (not dry) run: if validation passes, jobs would start and write results/."""
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "1", *args]
    return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=300)


def assert_stopped_before_any_job(result: subprocess.CompletedProcess, workdir: Path, *needles):
    message = result.stdout + result.stderr
    assert result.returncode != 0, message[-2000:]
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message[-2000:]}"
    assert not (workdir / "results").exists()
    assert not (workdir / "logs").exists()


def good_row(demo: TinyDemo, region: str = "demo_a", **replace: str) -> str:
    cells = {"region": region, "year": "2024", "aef": str(demo.rasters["demo_a"]["aef"]),
             "tessera": str(demo.rasters["demo_a"]["tessera"]),
             "cdl": str(demo.rasters["demo_a"]["cdl"]), "split": "auto"}  # fmt: skip
    cells.update(replace)
    return "\t".join(cells.values())


def write_raster(path: Path, count: int, crs: str, transform: Affine, dtype="int8") -> Path:
    with rasterio.open(path, "w", driver="GTiff", count=count, height=16, width=16,
                       dtype=dtype, crs=crs, transform=transform) as dst:  # fmt: skip
        dst.write(np.ones((count, 16, 16), dtype))
    return path


def test_valid_external_rows_pass_validation(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    workdir = workdir_with(tmp_path, [good_row(tiny_demo)])
    result = run_snakemake(workdir, "-n")
    assert result.returncode == 0, result.stderr[-2000:]


def test_missing_file_names_row_and_column(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    other = tiny_demo.rasters["demo_b"]  # each region its own rasters (duplicates are refused)
    r2 = good_row(tiny_demo, "r2", aef=str(other["aef"]), cdl=str(other["cdl"]),
                  tessera=str(tmp_path / "nope.tif"))  # fmt: skip
    rows = [good_row(tiny_demo), r2]
    workdir = workdir_with(tmp_path / "w", rows)
    result = run_snakemake(workdir)
    assert_stopped_before_any_job(result, workdir, "row 2", "'r2'", "column 'tessera'",
                                  "file not found", "nope.tif")  # fmt: skip


def test_unreadable_raster_names_row_and_column(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    broken = tmp_path / "broken.tif"
    broken.write_text("this is not a GeoTIFF")
    workdir = workdir_with(tmp_path / "w", [good_row(tiny_demo, aef=str(broken))])
    result = run_snakemake(workdir)
    assert_stopped_before_any_job(result, workdir, "row 1", "column 'aef'", "cannot read")


def test_wrong_band_count_names_expected_and_found(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    tf = rasterio.open(tiny_demo.rasters["demo_a"]["aef"]).transform
    three = write_raster(tmp_path / "three.tif", 3, "EPSG:32615", tf)
    workdir = workdir_with(tmp_path / "w", [good_row(tiny_demo, aef=str(three))])
    result = run_snakemake(workdir)
    assert_stopped_before_any_job(result, workdir, "column 'aef'", "3 bands", "expected 64")


def test_cdl_without_overlap_names_row_and_column(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    far = write_raster(tmp_path / "far.tif", 1, "EPSG:5070",
                       Affine(30, 0, 2_000_000, 0, -30, 500_000), "uint8")  # fmt: skip
    workdir = workdir_with(tmp_path / "w", [good_row(tiny_demo, cdl=str(far))])
    result = run_snakemake(workdir)
    assert_stopped_before_any_job(result, workdir, "row 1", "column 'cdl'", "does not overlap")


@pytest.mark.parametrize(
    "section, key", [(None, "learning_rate"), ("tiles", "tile_sise"), ("launch", "gpus")]
)
def test_unknown_key_in_config_yaml_is_rejected(tmp_path: Path, section, key) -> None:
    workdir = workdir_with(tmp_path, [])
    shutil.copy(REPO / "config" / "regions.tsv", workdir / "config" / "regions.tsv")
    path = workdir / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    (config if section is None else config.setdefault(section, {}))[key] = 1
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake(workdir)
    assert_stopped_before_any_job(result, workdir, key)


def test_unknown_key_in_train_config_is_rejected(tmp_path: Path) -> None:
    workdir = workdir_with(tmp_path, [])
    shutil.copy(REPO / "config" / "regions.tsv", workdir / "config" / "regions.tsv")
    path = workdir / "config" / "train" / "aef_deeplab.yaml"
    run = yaml.safe_load(path.read_text())
    run["optimizer"]["momentum"] = 0.9
    path.write_text(yaml.safe_dump(run))
    result = run_snakemake(workdir)
    assert_stopped_before_any_job(result, workdir, "aef_deeplab", "momentum")


def test_a_path_cell_with_a_trailing_space_is_shown_quoted(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """The space is invisible in a plain message ("file not found: hin/base/aef.tif")."""
    from emb.prep.regions import RegionsError, read_regions
    from emb.workflow.region_checks import check_regions

    aef, cdl = tiny_demo.rasters["demo_a"]["aef"], tiny_demo.rasters["demo_a"]["cdl"]
    table = tmp_path / "regions.tsv"
    table.write_text(HEADER + f"a\t2024\t{aef} \t\t{cdl}\tauto\n")
    with pytest.raises(RegionsError) as err:
        check_regions(read_regions(table), table)
    assert f"file not found: '{aef} '" in str(err.value)
    assert "spaces around the path" in str(err.value)
