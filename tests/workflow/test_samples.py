"""Parse-time answers of emb.workflow.samples: the regions a user's sample is drawn over, and
the files of a labelled sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from emb.workflow.samples import (
    ERRORS,
    SampleSettingsError,
    area_settings,
    design_regions,
    district_inputs,
    district_outputs,
    labelled_inputs,
)

MAPPED = ["demo_a", "demo_b", "iowa_15N", "iowa_16N", "iowa2_15N"]


def test_no_region_named_means_every_mapped_region() -> None:
    assert design_regions([], MAPPED, "r") == MAPPED


def test_an_area_name_gives_its_zones_and_a_region_itself() -> None:
    assert design_regions(["iowa", "demo_b"], MAPPED, "r") == ["iowa_15N", "iowa_16N", "demo_b"]
    assert design_regions(["iowa_16N", "iowa"], MAPPED, "r") == ["iowa_16N", "iowa_15N"]


def test_a_name_the_run_does_not_map_is_refused_naming_the_key_and_the_run() -> None:
    with pytest.raises(SampleSettingsError, match=r"design_regions: .* run r maps, found 'ohio'"):
        design_regions(["ohio"], MAPPED, "r")


def test_a_labelled_sample_brings_its_design_record(tmp_path: Path) -> None:
    assert labelled_inputs(None) == []
    csv = tmp_path / "labelled.csv"
    assert labelled_inputs(str(csv)) == [str(csv), str(tmp_path / "sample.json")]
    (tmp_path / "labelled.json").write_text("{}")
    assert labelled_inputs(str(csv)) == [str(csv), str(tmp_path / "labelled.json")]
    with pytest.raises(SampleSettingsError, match=r"labelled: expected the labelled sample's"):
        labelled_inputs(str(tmp_path / "sample.gpkg"))


def test_the_check_reads_each_trained_regions_test_tiles_and_labels() -> None:
    from emb.workflow.samples import check_inputs

    assert check_inputs(["a", "b"], "tessera") == {
        "indexes": ["results/shards/tessera/a/index.json", "results/shards/tessera/b/index.json"],
        "labels": ["results/labels/tessera/a.tif", "results/labels/tessera/b.tif"],
    }


def test_a_region_one_source_lacks_refuses_only_that_runs_sample() -> None:
    from emb.workflow.samples import regions_per_run, sample_maps

    mapped = {"aef_run": ["demo_a", "own_x"], "tessera_run": ["demo_a"]}
    chosen = regions_per_run(["own_x"], mapped)
    assert chosen == {"aef_run": ["own_x"], "tessera_run": []}
    assert sample_maps(chosen["aef_run"], "m", "aef_run") == ["m/own_x.tif"]
    with pytest.raises(SampleSettingsError, match="run tessera_run maps none of the regions"):
        sample_maps(chosen["tessera_run"], "m", "tessera_run")
    with pytest.raises(SampleSettingsError, match="found 'nowhere'"):
        regions_per_run(["nowhere"], mapped)


def test_a_labelled_sample_inside_results_is_refused_before_a_rerun_overwrites_it() -> None:
    with pytest.raises(SampleSettingsError, match="expected a copy of the sample outside results"):
        labelled_inputs("results/samples/aef_segformer/sample.csv")


def test_a_labelled_sample_is_checked_at_parse_time_with_errors_the_rules_catch(
    tmp_path: Path,
) -> None:
    from conftest import CLASSES_CSV

    from emb.workflow.samples import ERRORS, check_labelled_sample

    check_labelled_sample([], str(CLASSES_CSV))  # no labelled sample: nothing to check
    csv = tmp_path / "labelled.csv"
    csv.write_bytes(b"PK\x03\x04")
    (tmp_path / "sample.json").write_text("{}")
    with pytest.raises(ERRORS, match=r"sample\.json: the record lacks keys"):
        check_labelled_sample(labelled_inputs(str(csv)), str(CLASSES_CSV))


def test_districts_are_read_at_parse_time_and_add_the_layer_only_when_set(
    tmp_path: Path,
) -> None:
    demo = area_settings({"districts": {"file": "config/demo_districts.geojson", "name": "name"}})
    assert district_inputs(demo) == ["config/demo_districts.geojson"]
    assert district_outputs(demo) == {"gpkg": "results/area_estimates/{run}_districts.gpkg"}
    for none in ({}, {"districts": {"file": None, "name": "name"}}):
        assert district_inputs(area_settings(none)) == []
        assert district_outputs(area_settings(none)) == {}
    bad = area_settings({"districts": {"file": "config/demo_districts.geojson", "name": "county"}})
    with pytest.raises(ERRORS, match=r"demo_districts.geojson: layer .*: no field 'county'"):
        district_inputs(bad)
    missing = area_settings({"districts": {"file": str(tmp_path / "gone.gpkg"), "name": "name"}})
    with pytest.raises(ERRORS, match=r"gone.gpkg: districts file not found"):
        district_inputs(missing)
