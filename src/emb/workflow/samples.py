"""Which regions a user's reference sample is drawn over, where a labelled one lies, and the
districts file with the outputs it adds, at parse time (config ``area_estimates``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from emb.classes import load_class_map
from emb.estimation.districts import AREA_FIELD, DistrictsError, load_districts
from emb.estimation.sample_files import ReferenceSampleError, check_labelled
from emb.estimation.sample_record import SampleRecordError
from emb.estimation.settings import AreaSettings, AreaSettingsError, from_config

KEY = "area_estimates.design_regions"


class SampleSettingsError(ValueError):
    """``area_estimates`` names a region, area or file that is not there."""


# what the rules turn into one line (as_workflow_error): settings, and a labelled sample
ERRORS = (SampleSettingsError, AreaSettingsError, ReferenceSampleError, SampleRecordError,
          DistrictsError)  # fmt: skip
DISTRICT_LAYER = "results/area_estimates/{run}_districts.gpkg"


def area_settings(section: Mapping[str, Any], areas: str | None = None) -> AreaSettings:
    """The stages' settings of config ``area_estimates`` (:mod:`emb.estimation.settings`:
    checked there, once), which the rules pass whole as JSON (``to_json``); with
    ``districts.source: areas`` the areas file (config ``areas``) travels as the districts
    file. ``districts.file`` belongs to source ``file``: another source leaves it aside (so
    ``--config area_estimates='{districts: {source: regions}}'`` over the demo's config, which
    names a file, means the regions). Refused: ``areas`` without an areas file."""
    settings = from_config(section, "config")
    source = settings.district_source
    if source == "file":
        return settings
    if source == "areas":
        if not areas:
            raise SampleSettingsError(
                "area_estimates.districts.source: 'areas' takes the districts from the areas "
                "file: expected config areas to name one, found none"
            )
        return replace(settings, districts=str(areas), district_name=AREA_FIELD)
    return replace(settings, districts=None)


def district_inputs(settings: AreaSettings) -> list[str]:
    """The districts file (or the areas file, with ``source: areas``) as an input of the rules
    that read it, read and checked now (:func:`emb.estimation.districts.load_districts`): a
    bad file is refused before any job, not after the runs have trained. None without one;
    none with ``source: regions`` (the maps, the rules' inputs already, are the districts)."""
    if settings.district_source == "regions" or not settings.districts:
        return []
    load_districts(settings.district_source, settings.districts, settings.district_name, {})
    return [settings.districts]


def district_outputs(settings: AreaSettings) -> dict[str, str]:
    """Rule area_estimates' district layer, declared only with districts (the DAG then has
    no output a run without them could not make)."""
    return {"gpkg": DISTRICT_LAYER} if settings.has_districts else {}


def district_layers(settings: AreaSettings, runs: Sequence[str]) -> list[str]:
    """The runs' district layers, which the summary maps (their polygons and estimates);
    none without districts."""
    return [DISTRICT_LAYER.format(run=run) for run in runs] if settings.has_districts else []


def sample_size_inputs(section: Mapping[str, Any], run: str) -> dict[str, str]:
    """Rule sample_design's input with ``sample.n: auto``: the run's recommended size (its
    pilot), which rule area_estimates writes; none with a number."""
    if section.get("sample", {}).get("n") != "auto":
        return {}
    return {"sample_size": f"results/area_estimates/{run}_sample_size.json"}


def design_regions(wanted: Sequence[str], mapped: Sequence[str], run: str) -> list[str]:
    """The regions of run ``run``'s sample: every mapped region when ``wanted`` is empty; a
    name is a region, or an area of the areas file (its regions ``{area}_{zone}``)."""
    if not wanted:
        return list(mapped)
    chosen: list[str] = []
    for name in wanted:
        found = [r for r in mapped if r == name or r.startswith(f"{name}_")]
        if not found:
            raise SampleSettingsError(
                f"{KEY}: expected regions (or areas) that run {run} maps, found {name!r}; "
                f"it maps {list(mapped)}"
            )
        chosen += [r for r in found if r not in chosen]
    return chosen


def labelled_inputs(labelled: str | None) -> list[str]:
    """The labelled sample's CSV and its design record beside it (``{stem}.json`` when there,
    else the design's ``sample.json``: a copy renamed for labelling keeps its record), as
    inputs; none without one."""
    if not labelled:
        return []
    csv = Path(labelled)
    if Path("results/samples") in csv.parents or "results/samples" in csv.as_posix():
        raise SampleSettingsError(
            f"area_estimates.labelled: expected a copy of the sample outside results/ (rule "
            f"sample_design rewrites {labelled!r} when the maps change, and your labels with "
            f"it), found {labelled!r}"
        )
    if csv.suffix.lower() != ".csv":
        raise SampleSettingsError(
            f"area_estimates.labelled: expected the labelled sample's .csv, found {labelled!r}"
        )
    own = csv.with_suffix(".json")
    return [str(csv), str(own if own.exists() else csv.with_name("sample.json"))]


def check_labelled_sample(inputs: Sequence[str], classes: str) -> None:
    """Check the labelled sample of :func:`labelled_inputs` (its CSV, its record) with every
    check that needs no map, at parse time: a bad row refused inside rule area_estimates'
    job would fail it, and Snakemake would delete that run's good area table and figure.
    Nothing to check without a labelled sample."""
    if inputs:
        check_labelled(inputs[0], inputs[1], load_class_map(classes))


def check_inputs(regions: Sequence[str], source: str) -> dict[str, list[str]]:
    """Rule area_estimates' test-split inputs for a run of ``source`` training on ``regions``:
    each region's shard index (its test tiles) and its labels on the maps' grid."""
    return {
        "indexes": [f"results/shards/{source}/{r}/index.json" for r in regions],
        "labels": [f"results/labels/{source}/{r}.tif" for r in regions],
    }


def regions_per_run(wanted: Sequence[str], mapped: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each run's sample regions (:func:`design_regions`); a run that maps none of a named
    region gets none (its sample is refused only if asked for), and a name no run maps is
    refused at once."""
    chosen, errors = {}, {}
    for run, regions in mapped.items():
        try:
            chosen[run] = design_regions(wanted, regions, run)
        except SampleSettingsError as err:
            chosen[run], errors[run] = [], err
    if errors and len(errors) == len(mapped):
        raise next(iter(errors.values()))
    return chosen


def sample_maps(regions: Sequence[str], maps: str, run: str) -> list[str]:
    """The map files rule sample_design reads for run ``run``: one per sample region."""
    if not regions:
        raise SampleSettingsError(
            f"{KEY}: run {run} maps none of the regions named; draw its sample on a run that does"
        )
    return [f"{maps}/{region}.tif" for region in regions]
