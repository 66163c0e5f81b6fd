"""The table's rules for prediction-only rows (split predict): refused before any job where the
row is ambiguous or nothing would map it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, TinyDemo, venv_env

from emb.prep.regions import RegionsError, read_regions
from emb.workflow.region_checks import check_regions

HEADER = "region\tyear\taef\ttessera\tcdl\tsplit\n"


def write_table(path: Path, *rows: str) -> Path:
    path.write_text(HEADER + "".join(f"{row}\n" for row in rows))
    return path


def test_a_prediction_only_row_with_a_cdl_is_ambiguous(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    files = tiny_demo.rasters["demo_a"]
    table = write_table(tmp_path / "t.tsv", f"p\t2025\t{files['aef']}\t\t{files['cdl']}\tpredict")
    with pytest.raises(RegionsError, match=r"row 1 \(region 'p'\).*prediction-only row.*names a"):
        check_regions(read_regions(table), table)


def test_a_training_row_without_a_cdl_is_refused(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    table = write_table(tmp_path / "t.tsv", f"t\t2024\t{tiny_demo.rasters['demo_a']['aef']}\t\t\t")
    with pytest.raises(RegionsError, match=r"no CDL for a training row.*or split 'predict'"):
        check_regions(read_regions(table), table)


def test_a_prediction_only_row_of_another_year_on_trained_ground_is_fine(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    a = tiny_demo.rasters["demo_a"]
    table = write_table(tmp_path / "t.tsv", f"a\t2024\t{a['aef']}\t\t{a['cdl']}\tauto",
                        f"p\t2025\t{a['aef']}\t\t\tpredict")  # fmt: skip
    with pytest.raises(RegionsError, match="the same file"):  # one file is one year's product
        check_regions(read_regions(table), table)
    copy = tmp_path / "aef_2025.tif"
    copy.write_bytes(Path(a["aef"]).read_bytes())
    table = write_table(tmp_path / "t.tsv", f"a\t2024\t{a['aef']}\t\t{a['cdl']}\tauto",
                        f"p\t2025\t{copy}\t\t\tpredict")  # fmt: skip
    checks = check_regions(read_regions(table), table)
    assert checks.split_key("aef", "a") == "a" and "p" not in checks.split_keys["aef"]


def test_a_prediction_only_row_that_no_run_can_map_is_refused_before_any_job(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    a = tiny_demo.rasters["demo_a"]
    copy = tmp_path / "aef_2025.tif"
    copy.write_bytes(Path(a["aef"]).read_bytes())
    table = write_table(tmp_path / "t.tsv", f"a\t2024\t{a['aef']}\t{a['tessera']}\t{a['cdl']}\t",
                        f"p\t2025\t{copy}\t\t\tpredict")  # fmt: skip
    shutil.copytree(REPO / "config", tmp_path / "config")
    result = subprocess.run(
        ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n",
         "--configfile", str(REPO / "config/config.yaml"),
         "--config", "runs=[tessera_segformer]", f"regions={table}"],
        cwd=REPO, env=venv_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "row 2 (region 'p'), column 'split': a prediction-only row with aef" in out, out[-2000:]
    assert "add a run of aef" in out and "rule " not in result.stdout
