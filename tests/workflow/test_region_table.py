"""The workflow's questions about the regions table (emb.workflow.region_table), asked directly:
before, only dry runs of the whole workflow reached these answers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from emb.prep.regions import RegionsError, is_predict_only, read_regions
from emb.workflow.region_table import REGION_ID, RegionTable

DEMO = ["resources/demo/demo_a/aef.tif", "resources/demo/demo_b/aef.tif"]
ROWS = """region\tyear\taef\ttessera\tcdl\tsplit
demo_a\t2024\tresources/demo/demo_a/aef.tif\tt/a.tif\tc/a.tif\tauto
mine\t2024\tmine/aef.tif\t\tc/m.tif\ttrain
npy_row\t2024\t\tt/grid_1_2.NPY\tc/n.tif\t
demo_b\t2024\tresources/demo/demo_b/aef.tif\t\tc/b.tif\ttest
next\t2025\tnext/aef.tif\tt/next.tif\t\tpredict
"""


@pytest.fixture
def table(tmp_path: Path) -> RegionTable:
    path = tmp_path / "regions.tsv"
    path.write_text(ROWS, encoding="utf-8")
    return RegionTable(read_regions(path), generated=DEMO)


def test_a_run_trains_on_the_labelled_regions_of_its_source_in_table_order(
    table: RegionTable,
) -> None:
    runs = {"aef_segformer": "aef", "tessera_deeplab": "tessera"}
    assert table.regions_trained_by("aef_segformer", runs) == ["demo_a", "mine", "demo_b"]
    assert table.regions_trained_by("tessera_deeplab", runs) == ["demo_a", "npy_row"]
    assert table.training_regions("aef") == ["demo_a", "mine", "demo_b"]


def test_a_run_maps_its_training_regions_and_the_prediction_only_ones(table: RegionTable) -> None:
    assert table.mapped_regions("aef") == ["demo_a", "mine", "demo_b", "next"]
    assert table.mapped_regions("tessera") == ["demo_a", "npy_row", "next"]
    assert table.labelled_cdls("aef") == ["c/a.tif", "c/m.tif", "c/b.tif"]
    pixels = {"mine/aef.tif": 3_000_000, "next/aef.tif": 500_000, "t/a.tif": 7}
    assert table.megapixels_mapped("aef", pixels) == 3.5  # demo rasters not made yet: 0


def test_the_split_says_which_regions_are_only_mapped(table: RegionTable) -> None:
    assert [r for r in table.regions if is_predict_only(table.split(r))] == ["next"]
    assert table.split("npy_row") == "" and table.split("not_a_region") == ""


def test_a_source_is_demo_data_only_when_every_training_region_is_a_demo_raster(
    tmp_path: Path, table: RegionTable
) -> None:
    assert not table.is_demo_data("aef")  # 'mine' is your own raster
    assert not table.is_demo_data("tessera")
    path = tmp_path / "demo.tsv"
    rows = [line for line in ROWS.splitlines() if not line.startswith(("mine", "npy_row"))]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    demo = RegionTable(read_regions(path), generated=DEMO)
    assert demo.is_demo_data("aef")  # the prediction-only row is not trained on: no say
    assert not demo.is_demo_data("tessera")
    assert not RegionTable(read_regions(path), generated=[]).is_demo_data("aef")


def test_jobs_read_a_converted_geotiff_for_a_geotessera_npy_tile(table: RegionTable) -> None:
    assert table.job_raster("npy_row", "tessera") == "results/converted/tessera/npy_row.tif"
    assert table.job_raster("demo_a", "tessera") == "t/a.tif"
    assert table.job_raster("mine", "aef") == "mine/aef.tif"
    jobs = table.jobs_table()
    assert jobs.loc["npy_row", "tessera"] == "results/converted/tessera/npy_row.tif"
    assert jobs.loc["mine", "tessera"] == "" and jobs.loc["mine", "aef"] == "mine/aef.tif"
    assert table.frame.loc["npy_row", "tessera"] == "t/grid_1_2.NPY"  # the table is untouched


def test_the_region_wildcard_matches_every_id_the_regions_schema_allows_and_no_other() -> None:
    schema = yaml.safe_load((REPO / "workflow/schemas/regions.schema.yaml").read_text())
    assert f"^{REGION_ID}$" == schema["properties"]["region"]["pattern"]
    for name in ("demo_a", "r0001", "field_2024-b"):
        assert re.fullmatch(REGION_ID, name)
    for name in ("-x", "a/b", "A", "field.2024", ""):
        assert not re.fullmatch(REGION_ID, name)


def test_a_region_the_table_lacks_is_refused_by_name(table: RegionTable) -> None:
    """The constraint lets any id through (REGION_ID): a target naming another region must
    not reach a job with an empty raster path."""
    assert table.cell("mine", "cdl") == "c/m.tif"
    with pytest.raises(RegionsError, match="region 'mne' is not in the regions table"):
        table.cell("mne", "cdl")
    with pytest.raises(RegionsError, match="'mne'"):
        table.job_raster("mne", "aef")
