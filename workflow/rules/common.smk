# Validation, the parsed tables and the input functions; runs before any job starts, top to
# bottom. The decisions live in tested code, all in the package emb.workflow (docs/design.md):
# the regions' checks in region_checks, the table's answers in region_table, the runs' files and
# configs in parsed_runs, the profile's checks in profile, the report's targets in
# report_targets, stages' options in stage_options; a user's mistake found here is one line
# (errors.as_workflow_error: Snakemake's WorkflowError, no traceback).
import os
from pathlib import Path

import pandas as pd

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

from emb.workflow import profile, region_table, parsed_runs
from emb.workflow import report_targets as targets
from emb.workflow.area_plan import empty_regions, plan_from_config, planned_footprints
from emb.workflow.errors import as_workflow_error
from emb.workflow.region_checks import check_predict_only, check_regions
from emb.workflow.signatures import known_parameters
from emb.workflow.region_table import (
    DEMO_NAMES,
    REGION_ID,
    RegionTable,
    demo_rasters,
    one_of,
    read_regions,
)
from emb.workflow.stage_options import predict_options, rule_options, validation_options

validate(config, "../schemas/config.schema.yaml")


# The regions: the table's rows, then those planned from config areas: over tile collections
# (workflow/rules/areas.smk writes their VRTs; the planner has checked their tiles).
UNREADABLE = (ValueError, KeyError, OSError)  # RegionsError, pandas, decoding
with as_workflow_error(UNREADABLE, f"regions table {config['regions']}: "):
    REGIONS = read_regions(config["regions"]) if config["regions"] else empty_regions()
with as_workflow_error():
    AREAS = plan_from_config(config)
AREA_VRTS = AREAS.vrts() if AREAS else []
if AREAS:
    REGIONS = pd.concat([REGIONS, AREAS.rows()])
validate(REGIONS, "../schemas/regions.schema.yaml")
REGIONS_FILE = Path(config["regions"] or config["areas"])
DEMO_FILES = demo_rasters()
with as_workflow_error():
    # sizes (the demo's own rasters, not made yet, count as 0) and split groups of the rasters
    CHECKS = check_regions(
        REGIONS,
        REGIONS_FILE,
        generated=DEMO_FILES + AREA_VRTS,
        planned=planned_footprints(AREAS, config["areas"]) if AREAS else None,
    )
RASTER_PIXELS = CHECKS.pixels
if AREAS:  # the areas' VRTs, not written yet: their parts' extents
    RASTER_PIXELS.update(AREAS.pixels())
TABLE = RegionTable(REGIONS, generated=DEMO_FILES)


def profile_resource(rule, name):
    return profile.profile_resource(workflow.resource_settings, rule, name)


# The profile's GPU rules on a GPU partition; the runs: each one's source (its own file), then
# its config as train_config will resolve it; each prediction job's minutes from its regions'
# megapixels (refused beyond the partition's limit).
RUNS = config["runs"]
TRAIN_SCHEMA = parsed_runs.schema_path(Path(workflow.basedir))
OVERLAYS = parsed_runs.shared_overlays(
    config["train_overlays"], profile_resource("train_config", "train_overlay")
)
with as_workflow_error():
    profile.check_gpu_partitions(workflow.resource_settings)
    RUN_SOURCE = {run: parsed_runs.run_source(run, Path(TRAIN_SCHEMA)) for run in RUNS}
    check_predict_only(REGIONS, REGIONS_FILE, RUN_SOURCE)
    RUN_FILES = {
        run: parsed_runs.config_files(
            run, TABLE.is_demo_data(RUN_SOURCE[run]), OVERLAYS
        )
        for run in RUNS
    }
    RUN_CONFIG = {
        run: parsed_runs.resolve_run(
            run, RUN_FILES[run], Path(TRAIN_SCHEMA), RUN_SOURCE[run]
        )
        for run in RUNS
    }
    PREDICT_MINUTES = {
        run: profile.predict_runtime(
            workflow.resource_settings,
            f"rule predict of run {run}",
            TABLE.megapixels_mapped(RUN_SOURCE[run], RASTER_PIXELS),
            len(TABLE.mapped_regions(RUN_SOURCE[run])),
        )
        for run in RUNS
    }
with as_workflow_error():  # the tiles and windows each run's model must map; no gaps
    parsed_runs.check_windows(config, TABLE, RUN_SOURCE, RUN_CONFIG)
# a split block larger than the regions: every split needs one (after the runs' checks)
with as_workflow_error():
    region_table.check_split_blocks(
        CHECKS, TABLE, config, REGIONS_FILE, RUN_SOURCE.values()
    )


wildcard_constraints:
    source="aef|tessera",
    region=REGION_ID,  # any id the regions schema allows; a name the table lacks is refused
    run=one_of(RUNS),


# Input functions and params: one-liners over the objects above.
def train_config_files(run):
    return RUN_FILES[run]


def data_settings(source, section):
    return region_table.data_settings(config, section, TABLE.is_demo_data(source))


def source_settings(section):
    """A params function: the section of the data settings of the job's source."""
    return known_parameters(lambda wildcards: data_settings(wildcards.source, section))


@known_parameters  # called for every job (emb.workflow.signatures)
def get_emb(wildcards):
    return TABLE.job_raster(wildcards.region, wildcards.source)


def get_tessera_npy(wildcards):
    return TABLE.tessera_npy_inputs(wildcards.region)


@known_parameters
def get_cdl(wildcards):
    return TABLE.cell(wildcards.region, "cdl")


@known_parameters
def get_split(wildcards):
    return TABLE.split(wildcards.region) or "auto"


@known_parameters
def split_group(wildcards):
    return region_table.split_group(CHECKS, wildcards.source, wildcards.region)


def get_region_indexes(wildcards):
    regions = TABLE.training_regions(wildcards.source)
    return [f"results/shards/{wildcards.source}/{r}/index.json" for r in regions]


def loader_workers(wildcards):
    return parsed_runs.loader_workers(RUN_CONFIG.values(), wildcards.source)


def validation_batches(wildcards):
    return validation_options(RUN_CONFIG, wildcards.source)


def training_ranks(wildcards):
    """Processes of one training job as the profile submits it (rule train's resources)."""
    with as_workflow_error():
        return profile.launched_processes(rules.train.rule.resources, "train")


def get_run_inputs(wildcards):
    return parsed_runs.train_inputs(wildcards.run, RUN_SOURCE[wildcards.run])


def run_manifest(wildcards):
    return get_run_inputs(wildcards)["manifest"]


def predict_runtime(wildcards):
    return PREDICT_MINUTES[wildcards.run]


def get_run_rasters(wildcards):
    return TABLE.mapped_rasters(RUN_SOURCE[wildcards.run])


def get_run_cdls(wildcards):
    return TABLE.labelled_cdls(RUN_SOURCE[wildcards.run])


def map_category(wildcards):
    return targets.map_category(TABLE.split(wildcards.region))


def map_labels(wildcards):
    split = TABLE.split(wildcards.region)
    return targets.map_labels(wildcards.run, wildcards.region, split)


def report_targets():
    return targets.report_targets(RUNS, sorted(set(RUN_SOURCE.values())))


def report_file(path, caption, category, figure):
    """``path`` flagged for the report: emb.workflow.report_targets.report_settings."""
    return report(path, **targets.report_settings(path, caption, category, figure))


# Software: with `--sdm conda` every rule runs in envs/emb.yaml (emb's dependencies) and finds
# emb itself in this checkout's src/ (a `pip -e ..` in the env file would resolve from
# Snakemake's copy of the file). With `--sdm apptainer` every rule runs in the image named by
# $EMB_CONTAINER (the cluster profiles check that it exists). train and gpu_check run the
# launcher outside it, and the launcher starts the image inside its srun step (srun is not in
# the image).
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    SRC = [str(Path(workflow.basedir) / "src"), os.environ.get("PYTHONPATH")]
    os.environ.update(PYTHONPATH=os.pathsep.join(filter(None, SRC)))  # jobs inherit it
APPTAINER = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
CONTAINER = os.environ.get("EMB_CONTAINER", "") if APPTAINER else ""
if APPTAINER and not CONTAINER:
    raise WorkflowError("--sdm apptainer: set EMB_CONTAINER to the image file (.sif)")


container: CONTAINER or None


def threads_per_process(wildcards, threads, resources):
    given = resources.get("cpus_per_task")
    return profile.threads_per_process(threads, given, resources.tasks_per_node)


def launch_options(wildcards, resources):
    """The launcher's options from the rule's resources (set by the profiles)."""
    return rule_options(
        dict(resources.items()), CONTAINER, workflow.deployment_settings.apptainer_args
    )
