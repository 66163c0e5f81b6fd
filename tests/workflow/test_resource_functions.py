"""The rules' resource functions (emb.workflow.resources): Snakemake calls them for every job
of the DAG, so each is a lookup in figures computed once while the workflow parses; what they
return is the measured line for the job's own raster."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake.common import get_function_params

from emb.prep.regions import read_regions
from emb.workflow import resources
from emb.workflow.region_table import RegionTable

PIXELS = {("aef", "big"): 400_000_000, ("aef", "small"): 1_000_000, ("tessera", "small"): 4_000_000}


def wildcards(**values: str) -> SimpleNamespace:
    return SimpleNamespace(**values)


def test_a_per_region_job_asks_for_its_own_rasters_memory_and_time() -> None:
    mem = resources.region_mem_mb(("shards",), PIXELS)
    minutes = resources.region_runtime(("shards",), PIXELS)
    big, small = wildcards(source="aef", region="big"), wildcards(source="aef", region="small")
    assert mem(big, 1) == resources.mem_mb("shards", 400_000_000, "aef") > mem(small, 1)
    assert mem(big, 2) == 2 * mem(big, 1)  # doubled per retry
    assert minutes(big) == resources.runtime("shards", 400_000_000, "aef") > minutes(small)
    # a raster not made yet (the demo's) counts as 0 pixels
    assert mem(wildcards(source="tessera", region="demo_a"), 1) == resources.mem_mb(
        "shards", 0, "tessera"
    )


def test_a_job_running_two_stages_asks_for_the_larger_peak_and_both_times() -> None:
    """Rule shards aligns the labels, then cuts the shards: one process at a time."""
    mem = resources.region_mem_mb(("align_labels", "shards"), PIXELS)
    minutes = resources.region_runtime(("align_labels", "shards"), PIXELS)
    for source, region in PIXELS:
        job, size = wildcards(source=source, region=region), PIXELS[source, region]
        align, shards = (resources.mem_mb(s, size, source, 2) for s in ("align_labels", "shards"))
        assert mem(job, 2) == max(align, shards)
        assert minutes(job) == sum(
            resources.runtime(s, size, source) for s in ("align_labels", "shards")
        )
    # the shards' peak grows with the raster, the alignment's does not: each wins somewhere
    small, big = wildcards(source="tessera", region="small"), wildcards(source="aef", region="big")
    assert mem(small, 1) == resources.mem_mb("align_labels", 4_000_000, "tessera")
    assert mem(big, 1) == resources.mem_mb("shards", 400_000_000, "aef")


def test_a_run_job_asks_for_its_sources_largest_raster_on_every_process() -> None:
    regions = {"aef": ["small", "big"], "tessera": ["small"]}
    runs = {"aef_segformer": "aef", "tessera_deeplab": "tessera"}
    mem = resources.run_mem_mb("predict", 8, runs, regions.__getitem__, PIXELS, block=256)
    assert mem(wildcards(run="aef_segformer"), 1) == resources.launched_mem_mb(
        "predict", 8, 1, block=256, pixels=400_000_000, source="aef"
    )
    assert mem(wildcards(run="tessera_deeplab"), 2) == resources.launched_mem_mb(
        "predict", 8, 2, block=256, pixels=4_000_000, source="tessera"
    )
    # a profile without tasks_per_node (a laptop), or with a function there: one process
    alone = resources.run_mem_mb("evaluate", None, runs, regions.__getitem__, PIXELS)
    assert alone(wildcards(run="aef_segformer"), 1) == resources.launched_mem_mb("evaluate", 1)


def test_the_tables_pixels_are_looked_up_per_source_and_region(tmp_path: Path) -> None:
    path = tmp_path / "regions.tsv"
    path.write_text(
        "region\tyear\taef\ttessera\tcdl\tsplit\n"
        "a\t2024\ta/aef.tif\t\ta/cdl.tif\t\n"
        "b\t2024\tb/aef.tif\tb/t.tif\tb/cdl.tif\t\n"
    )
    table = RegionTable(read_regions(path))
    pixels = table.raster_pixels({"a/aef.tif": 16, "b/aef.tif": 25, "b/t.tif": 36})
    assert pixels == {("aef", "a"): 16, ("aef", "b"): 25, ("tessera", "a"): 0,
                      ("tessera", "b"): 36}  # fmt: skip
    assert table.cell("b", "tessera") == "b/t.tif" and table.cell("a", "tessera") == ""
    assert table.cell("a", "no_such_column") == ""


def test_snakemake_reads_the_region_functions_parameters_without_inspecting_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Snakemake asks each job's functions for their parameters (emb.workflow.signatures)."""
    mem = resources.region_mem_mb(("shards",), PIXELS)
    minutes = resources.region_runtime(("shards",), PIXELS)

    def per_job(*args: object, **kwargs: object) -> None:
        raise AssertionError("inspect.signature called per job")

    monkeypatch.setattr(inspect, "signature", per_job)
    assert list(get_function_params(mem)) == ["wildcards", "attempt"]
    assert list(get_function_params(minutes)) == ["wildcards"]
