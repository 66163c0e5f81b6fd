# Validation, the parsed tables and the input functions; runs before any job starts. The
# decisions live in tested code: the regions table's answers in emb.prep.region_table, the
# runs' configs in emb.training.train_config, the profile's checks in emb.cluster.profile.
import os
import re
import shlex
from pathlib import Path

import pandas as pd

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

from emb.areas import AreasError
from emb.areas.workflow import empty_regions, plan_from_config, planned_footprints
from emb.cluster import profile
from emb.cluster.launch import rule_options
from emb.prep.demo_region import DEMO_REGIONS
from emb.prep.region_rows import (
    PREDICT,
    RegionsError,
    check_predict_only,
    is_predict_only,
)
from emb.prep.region_table import RegionTable
from emb.prep.regions import check_regions, read_regions
from emb.prep.tessera_npy import find_triple
from emb.training import train_config
from emb.training.config import ConfigError

validate(config, "../schemas/config.schema.yaml")


# The regions: the table's rows, then those planned from config areas: over tile collections
# (workflow/rules/areas.smk writes their VRTs; the planner has checked their tiles).
try:
    REGIONS = read_regions(config["regions"]) if config["regions"] else empty_regions()
except (ValueError, KeyError, OSError) as err:  # RegionsError, pandas, decoding
    raise WorkflowError(f"regions table {config['regions']}: {err}") from None
try:
    AREAS = plan_from_config(config)
except AreasError as err:
    raise WorkflowError(str(err)) from None
AREA_VRTS = AREAS.vrts() if AREAS else []
if AREAS:
    REGIONS = pd.concat([REGIONS, AREAS.rows()])
validate(REGIONS, "../schemas/regions.schema.yaml")
DEMO_NAMES = [r.name for r in DEMO_REGIONS]
DEMO_FILES = [
    f"resources/demo/{name}/{kind}.tif"
    for name in DEMO_NAMES
    for kind in ("aef", "tessera", "cdl")
]
try:
    # sizes (the demo's own rasters, not made yet, count as 0) and split groups of the rasters
    CHECKS = check_regions(
        REGIONS,
        Path(config["regions"] or config["areas"]),
        generated=DEMO_FILES + AREA_VRTS,
        planned=planned_footprints(AREAS, config["areas"]) if AREAS else None,
    )
except RegionsError as err:
    raise WorkflowError(str(err)) from None
RASTER_PIXELS = CHECKS.pixels
if AREAS:  # the areas' VRTs, not written yet: their parts' extents
    RASTER_PIXELS.update(AREAS.pixels())
TABLE = RegionTable(REGIONS, generated=DEMO_FILES)


# The profile: GPU rules on a GPU partition.
def profile_resource(rule, name):
    return profile.profile_resource(workflow.resource_settings, rule, name)


try:
    profile.check_gpu_partitions(workflow.resource_settings)
except profile.ProfileError as err:
    raise WorkflowError(str(err)) from None


# The runs: each one's source (its own file), then its config as train_config will resolve
# it. The schema is named relative to the project when it lies inside: an input holding the
# checkout's absolute path would rerun every train_config once the project is moved.
RUNS = config["runs"]
SCHEMA = Path(workflow.basedir) / "workflow/schemas/train.schema.yaml"
TRAIN_SCHEMA = str(
    SCHEMA if os.path.relpath(SCHEMA).startswith("..") else os.path.relpath(SCHEMA)
)
DEMO_OVERLAY = "config/train/demo.yaml"
CLUSTER_OVERLAY = profile_resource("train_config", "train_overlay")
try:
    RUN_SOURCE = {run: train_config.run_source(run, Path(TRAIN_SCHEMA)) for run in RUNS}
    check_predict_only(REGIONS, Path(config["regions"] or config["areas"]), RUN_SOURCE)
    RUN_FILES = {
        run: train_config.run_config_files(
            run,
            [
                *([DEMO_OVERLAY] if TABLE.is_demo_data(RUN_SOURCE[run]) else []),
                *config["train_overlays"],
                *([str(CLUSTER_OVERLAY)] if CLUSTER_OVERLAY else []),
            ],
        )
        for run in RUNS
    }
    RUN_CONFIG = {
        run: train_config.resolve_run(
            run, RUN_FILES[run], Path(TRAIN_SCHEMA), RUN_SOURCE[run]
        )
        for run in RUNS
    }
except (ConfigError, RegionsError) as err:
    raise WorkflowError(str(err)) from None


# Prediction jobs' minutes, from their regions' megapixels (refused beyond the partition's).
try:
    PREDICT_MINUTES = {
        run: profile.predict_runtime(
            workflow.resource_settings,
            f"rule predict of run {run}",
            TABLE.megapixels_mapped(RUN_SOURCE[run], RASTER_PIXELS),
            len(TABLE.mapped_regions(RUN_SOURCE[run])),
        )
        for run in RUNS
    }
except profile.ProfileError as err:
    raise WorkflowError(str(err)) from None


def one_of(names):
    """A wildcard pattern matching exactly these names (escaped: region ids may hold dots)."""
    return "|".join(re.escape(str(name)) for name in names)


wildcard_constraints:
    source="aef|tessera",
    region=one_of(REGIONS.index),
    run=one_of(RUNS),


# Input functions and params: one-liners over the objects above.
def train_config_files(run):
    return RUN_FILES[run]


def data_settings(source, section):
    """config[section] (tiles, splits, shards) for ``source``'s regions: the schema's values
    for your own data, the demo's small ones (demo: overlay:) for the demo data only."""
    demo = (
        config["demo"]["overlay"].get(section, {}) if TABLE.is_demo_data(source) else {}
    )
    return {**config[section], **demo}


def get_emb(wildcards):
    return TABLE.job_raster(wildcards.region, wildcards.source)


def get_tessera_npy(wildcards):
    """The .npy tile's three files as inputs: a changed scales or landmask file reruns it."""
    npy = find_triple(TABLE.cell(wildcards.region, "tessera"))
    return {
        "npy": str(npy.embedding),
        "scales": str(npy.scales),
        "landmask": str(npy.landmask),
    }


def write_jobs_table(path, log, rows):
    """Rule regions_table's work (it runs where Snakemake runs)."""
    Path(path).write_text(rows, encoding="utf-8")
    Path(log).write_text(f"wrote {path}: {rows.count(chr(10)) - 1} regions\n")


def get_cdl(wildcards):
    return TABLE.cell(wildcards.region, "cdl")


def get_split(wildcards):
    return TABLE.split(wildcards.region) or "auto"


def split_group(wildcards):
    """The id the region's split blocks are drawn with, and the extent they are drawn over:
    shared by the years of one ground, so a block has one split in every year."""
    extent = CHECKS.split_extent(wildcards.source, wildcards.region)
    return {
        "key": CHECKS.split_key(wildcards.source, wildcards.region),
        "extent": ",".join(f"{v:.6f}" for v in extent) if extent else "",
    }


def get_region_indexes(wildcards):
    return [
        f"results/shards/{wildcards.source}/{region}/index.json"
        for region in TABLE.training_regions(wildcards.source)
    ]


def loader_workers(wildcards):
    """Reader threads per rank for the manifest's shard-count check."""
    return train_config.loader_workers(RUN_CONFIG.values(), wildcards.source)


def training_ranks(wildcards):
    """Processes of one training job as the profile submits it (nodes x tasks_per_node of
    the train job's resources), for the manifest's shard-count check."""
    resources = rules.train.rule.resources
    counts = {key: resources[key].raw for key in ("nodes", "tasks_per_node")}
    if not all(isinstance(v, int) for v in counts.values()):
        raise WorkflowError(
            f"train job's resources nodes and tasks_per_node: expected integers, found {counts}"
        )
    return counts["nodes"] * counts["tasks_per_node"]


def get_run_inputs(wildcards):
    source = RUN_SOURCE[wildcards.run]
    return {
        "config": f"results/runs/{wildcards.run}/config.yaml",
        "manifest": f"results/shards/{source}/manifest.json",
        "stats": f"results/stats/{source}/stats.json",
    }


def predict_runtime(wildcards):
    return PREDICT_MINUTES[wildcards.run]


def get_run_rasters(wildcards):
    """The embedding rasters of every region the run maps (prediction-only ones included)."""
    source = RUN_SOURCE[wildcards.run]
    return [TABLE.job_raster(r, source) for r in TABLE.mapped_regions(source)]


def get_run_cdls(wildcards):
    return TABLE.labelled_cdls(RUN_SOURCE[wildcards.run])


def predict_options(wildcards):
    """predict's options from config predict:, shell-quoted."""
    cfg = config["predict"]
    options = [
        f"--overlap={cfg['overlap']}",
        f"--block={cfg['block']}",
        f"--batch-size={cfg['batch_size']}",
        *([f"--tile={cfg['tile']}"] if cfg.get("tile") else []),
        *(["--with-probabilities"] if cfg["probabilities"] else []),
    ]
    return shlex.join(options)


def map_category(wildcards):
    """The report's section of a region's map: scored regions, or the prediction-only ones."""
    if is_predict_only(TABLE.split(wildcards.region)):
        return "Maps, unscored (prediction-only regions)"
    return "Maps"


def map_labels(wildcards):
    """The report's labels of a map: run, region and whether it was ever scored."""
    only = is_predict_only(TABLE.split(wildcards.region))
    scored = f"no (split {PREDICT})" if only else "test tiles"
    return {"run": wildcards.run, "region": wildcards.region, "scored": scored}


def report_targets():
    """What the report shows beyond the summary: maps, curves, data manifests."""
    sources = sorted(set(RUN_SOURCE.values()))
    return [
        *expand("results/maps/{run}", run=RUNS),
        *expand("results/runs/{run}/curves.png", run=RUNS),
        *expand("results/data/{source}.{ext}", source=sources, ext=["png", "html"]),
    ]


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
    """CPU threads of each launched process: the profile's cpus_per_task, else the rule's
    threads shared by the processes of a node."""
    given = resources.get("cpus_per_task")
    return given if given else max(1, threads // resources.tasks_per_node)


def launch_options(wildcards, resources):
    """The launcher's options from the rule's resources (set by the profiles)."""
    return rule_options(
        dict(resources.items()), CONTAINER, workflow.deployment_settings.apptainer_args
    )
