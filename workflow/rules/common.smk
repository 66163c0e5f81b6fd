# Validation, the parsed tables and the input functions. Runs before any job starts.
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from emb.config import ConfigError, resolve
from emb.demo import DEMO_REGIONS
from emb.regions import RegionsError, check_regions, read_regions

validate(config, "../schemas/config.schema.yaml")

REGIONS = read_regions(config["regions"])
validate(REGIONS, "../schemas/regions.schema.yaml")
DEMO_NAMES = [r.name for r in DEMO_REGIONS]
DEMO_FILES = [
    f"resources/demo/{name}/{kind}.tif"
    for name in DEMO_NAMES
    for kind in ("aef", "tessera", "cdl")
]
try:
    check_regions(REGIONS, Path(config["regions"]), generated=DEMO_FILES)
except RegionsError as err:
    raise WorkflowError(str(err)) from None

RUNS = config["runs"]
TRAIN_SCHEMA = str(Path(workflow.basedir) / "workflow/schemas/train.schema.yaml")


def train_config_files(run):
    return [
        "config/train/defaults.yaml",
        f"config/train/{run}.yaml",
        *config["train_overlays"],
    ]


def resolved_train_config(run):
    try:
        return resolve(
            [Path(f) for f in train_config_files(run)], [], Path(TRAIN_SCHEMA)
        )
    except (ConfigError, FileNotFoundError, WorkflowError) as err:
        raise WorkflowError(f"train config of run {run!r}: {err}") from None


RUN_CONFIG = {run: resolved_train_config(run) for run in RUNS}
RUN_SOURCE = {run: cfg["data"]["source"] for run, cfg in RUN_CONFIG.items()}


wildcard_constraints:
    source="aef|tessera",
    region="|".join(REGIONS.index),
    run="|".join(RUNS),


def regions_of(source):
    return [r for r in REGIONS.index if REGIONS.loc[r, source]]


def get_emb(wildcards):
    return REGIONS.loc[wildcards.region, wildcards.source]


def get_cdl(wildcards):
    return REGIONS.loc[wildcards.region, "cdl"]


def get_split(wildcards):
    return REGIONS.loc[wildcards.region, "split"] or "auto"


def get_region_indexes(wildcards):
    return [
        f"results/shards/{wildcards.source}/{region}/index.json"
        for region in regions_of(wildcards.source)
    ]


def loader_workers(wildcards):
    """The most data-loader workers any run of this source asks for (shard-count warning)."""
    return max(
        [
            c["train"]["num_workers"]
            for c in RUN_CONFIG.values()
            if c["data"]["source"] == wildcards.source
        ],
        default=0,
    )


def get_run_inputs(wildcards):
    source = RUN_SOURCE[wildcards.run]
    return {
        "config": f"results/runs/{wildcards.run}/config.yaml",
        "manifest": f"results/shards/{source}/manifest.json",
        "stats": f"results/stats/{source}/stats.json",
    }
