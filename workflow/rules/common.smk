# Validation, the parsed tables and the input functions. Runs before any job starts.
import os
import re
import shlex
from pathlib import Path

import pandas as pd

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

from emb.training.config import ConfigError
from emb.training.train_config import resolve
from emb.prep.demo_region import DEMO_REGIONS
from emb.cluster.launch import rule_options
from emb.cluster.profile import (
    ProfileError,
    check_runtime,
    positive_number,
    predict_minutes,
)
from emb.prep.region_rows import PREDICT, RegionsError, check_predict_only
from emb.prep.regions import check_regions, read_regions
from emb.rasters import SOURCES
from emb.areas import AreasError
from emb.areas.config import empty_regions, plan_from_config, planned_footprints
from emb.prep.tessera_npy import find_triple

validate(config, "../schemas/config.schema.yaml")

try:
    REGIONS = read_regions(config["regions"]) if config["regions"] else empty_regions()
except (ValueError, KeyError, OSError) as err:  # RegionsError, pandas, decoding
    raise WorkflowError(f"regions table {config['regions']}: {err}") from None
# Areas (workflow/rules/areas.smk): the regions planned from config areas: over the tile
# collections join the table; rule areas writes their VRTs, the planner checks their tiles.
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
# the areas' VRTs, not written yet: their parts' extents
RASTER_PIXELS.update(AREAS.pixels() if AREAS else {})

RUNS = config["runs"]
TRAIN_SCHEMA = str(Path(workflow.basedir) / "workflow/schemas/train.schema.yaml")
DEMO_OVERLAY = "config/train/demo.yaml"


def profile_resource(rule, name):
    """A resource of ``rule`` as the profile sets it (set-resources, default-resources), or
    None: read while the workflow is parsed, so its files are checked before any job."""
    settings = workflow.resource_settings
    for given in (
        settings.overwrite_resources.get(rule, {}),
        settings.default_resources or {},
    ):
        if name in given:
            return getattr(given[name], "raw", given[name])
    return None


def wants_gpus(rule):
    """The profile gives ``rule`` GPUs (gpus_per_node, a gpu gres or --gpus in slurm_extra)."""
    gpus = profile_resource(rule, "gpus_per_node")
    gres = str(profile_resource(rule, "gres") or "")
    extra = str(profile_resource(rule, "slurm_extra") or "")
    return bool(
        isinstance(gpus, int) and gpus > 0 or "gpu" in gres or "--gpus" in extra
    )


def check_gpu_partitions():
    """A rule asking for GPUs on the profile's default partition (its CPU partition) would wait
    in a queue that has no GPU, or be refused by sbatch after the earlier jobs ran."""
    default = (workflow.resource_settings.default_resources or {}).get(
        "slurm_partition"
    )
    cpu = getattr(default, "raw", default)
    for rule, given in workflow.resource_settings.overwrite_resources.items():
        partition = profile_resource(rule, "slurm_partition")
        if cpu and partition == cpu and wants_gpus(rule):
            raise WorkflowError(
                f"profile: rule {rule} asks for GPUs on partition {partition!r}, the profile's "
                f"CPU partition (default-resources); expected a GPU partition in its "
                f"set-resources"
            )


def run_source(run):
    """The run's ``data.source``, from its own file (what decides the demo overlay)."""
    files = [Path("config/train/defaults.yaml"), Path(f"config/train/{run}.yaml")]
    try:
        return resolve(files, [], Path(TRAIN_SCHEMA))["data"]["source"]
    except (ConfigError, FileNotFoundError, WorkflowError) as err:
        raise WorkflowError(f"train config of run {run!r}: {err}") from None


def is_demo_data(source):
    """Every region with a ``source`` raster is a synthesized demo region."""
    return DEMO_DATA[source]


def data_settings(source, section):
    """config[section] (tiles, splits, shards) for ``source``'s regions: the schema's full-size
    values for your own data, the demo's small ones (demo: overlay:) for the demo data only,
    as the demo's training overlay is applied."""
    settings = dict(config[section])
    if is_demo_data(source):
        settings.update(config["demo"]["overlay"].get(section, {}))
    return settings


def train_config_files(run):
    """defaults <- run <- the demo overlay (demo data only) <- train_overlays <- the profile's
    cluster overlay (its ``train_config: train_overlay`` resource)."""
    demo = [DEMO_OVERLAY] if is_demo_data(RUN_SOURCE[run]) else []
    cluster = profile_resource("train_config", "train_overlay")
    files = [
        "config/train/defaults.yaml",
        f"config/train/{run}.yaml",
        *demo,
        *config["train_overlays"],
        *([str(cluster)] if cluster else []),
    ]
    # A file listed twice (the demo overlay in train_overlays too) is merged once.
    return list(dict.fromkeys(files))


def resolved_train_config(run):
    """The run's config as the train_config job will resolve it: every file checked against
    the schema (errors name the file and the key) before any job starts."""
    try:
        return resolve(
            [Path(f) for f in train_config_files(run)], [], Path(TRAIN_SCHEMA)
        )
    except (ConfigError, FileNotFoundError, WorkflowError) as err:
        raise WorkflowError(f"train config of run {run!r}: {err}") from None


SPLIT_COLUMN = REGIONS["split"] if "split" in REGIONS else pd.Series("", REGIONS.index)
# per source, once: input functions run for every job of a 1,000-region DAG
NONE = pd.Series(False, REGIONS.index)
HAS = {s: REGIONS[s] != "" if s in REGIONS else NONE for s in SOURCES}
MAPPED_REGIONS = {s: list(REGIONS.index[HAS[s]]) for s in SOURCES}
TRAINING_REGIONS = {
    s: list(REGIONS.index[HAS[s] & (SPLIT_COLUMN != PREDICT)]) for s in SOURCES
}


def regions_of(source):
    """The training regions with a ``source`` raster: labelled, tiled, sharded and scored."""
    return TRAINING_REGIONS[source]


def mapped_regions_of(source):
    """Every region a run of ``source`` maps: the training regions and the prediction-only
    ones (split predict: mapped, never labelled or scored)."""
    return MAPPED_REGIONS[source]


DEMO_DATA = {
    s: bool(regions_of(s))
    and all(REGIONS.loc[r, s] in DEMO_FILES for r in regions_of(s))
    for s in SOURCES
}


check_gpu_partitions()
RUN_SOURCE = {run: run_source(run) for run in RUNS}


try:
    check_predict_only(REGIONS, Path(config["regions"] or config["areas"]), RUN_SOURCE)
except RegionsError as err:
    raise WorkflowError(str(err)) from None
RUN_CONFIG = {run: resolved_train_config(run) for run in RUNS}
for run, cfg in RUN_CONFIG.items():
    if cfg["data"]["source"] != RUN_SOURCE[run]:
        raise WorkflowError(
            f"train config of run {run!r}: data.source: expected the run file's "
            f"{RUN_SOURCE[run]!r} (config/train/{run}.yaml), found "
            f"{cfg['data']['source']!r} after the overlays {train_config_files(run)[2:]}"
        )


def one_of(names):
    """A wildcard pattern matching exactly these names (escaped: region ids may hold dots)."""
    return "|".join(re.escape(str(name)) for name in names)


wildcard_constraints:
    source="aef|tessera",
    region=one_of(REGIONS.index),
    run=one_of(RUNS),


def is_tessera_npy(path):
    """geotessera's native tile (.npy + scales + landmask), converted by rule tessera_npy."""
    return str(path).lower().endswith(".npy")


def job_raster(region, source):
    """The raster the jobs read for a region's ``source`` cell: the cell's own file, or the
    GeoTIFF a geotessera .npy tile is converted into."""
    path = REGIONS.loc[region, source]
    if source == "tessera" and is_tessera_npy(path):
        return f"results/converted/tessera/{region}.tif"
    return path


def get_emb(wildcards):
    return job_raster(wildcards.region, wildcards.source)


def get_tessera_npy(wildcards):
    """The .npy tile's three files as inputs: a changed scales or landmask file reruns it."""
    triple = find_triple(REGIONS.loc[wildcards.region, "tessera"])
    return {
        "npy": str(triple.embedding),
        "scales": str(triple.scales),
        "landmask": str(triple.landmask),
    }


def write_jobs_table(path, log, rows):
    """Rule regions_table's work (it runs where Snakemake runs)."""
    Path(path).write_text(rows, encoding="utf-8")
    Path(log).write_text(f"wrote {path}: {rows.count(chr(10)) - 1} regions\n")


def jobs_table_rows():
    """The regions table as the jobs read it (results/regions.tsv): converted rasters in
    place of .npy tiles."""
    table = REGIONS.copy()
    for region in table.index:
        for source in SOURCES:
            if table.loc[region, source]:
                table.loc[region, source] = job_raster(region, source)
    return table


def get_cdl(wildcards):
    return REGIONS.loc[wildcards.region, "cdl"]


def get_split(wildcards):
    return REGIONS.loc[wildcards.region, "split"] or "auto"


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
        for region in regions_of(wildcards.source)
    ]


def loader_workers(wildcards):
    """The most reader threads per rank any run of this source asks for, cluster overlay
    included (the manifest's shard-count check)."""
    return max(
        [
            c["train"]["num_workers"]
            for c in RUN_CONFIG.values()
            if c["data"]["source"] == wildcards.source
        ],
        default=0,
    )


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


CPU_MPX_PER_MINUTE = 3  # one CPU thread (bench/predict.py: 0.06 megapixels/s)


def predict_runtime_of(run):
    """Minutes the run's prediction job asks for, from its regions' megapixels and the
    profile's ``mpx_per_minute`` per process (a CPU thread's rate without one); refused when
    more than the profile's ``max_runtime`` (the partition's limit)."""
    rate = profile_resource("predict", "mpx_per_minute")
    limit = profile_resource("predict", "max_runtime")
    processes = profile_resource("predict", "nodes") or 1
    processes *= profile_resource("predict", "tasks_per_node") or 1
    source = RUN_SOURCE[run]
    regions = mapped_regions_of(source)
    megapixels = (
        sum(RASTER_PIXELS.get(REGIONS.loc[r, source], 0) for r in regions) / 1e6
    )
    try:
        rate = (
            CPU_MPX_PER_MINUTE
            if rate is None
            else positive_number(rate, "mpx_per_minute", "predict")
        )
        limit = (
            None if limit is None else positive_number(limit, "max_runtime", "predict")
        )
        minutes = predict_minutes(megapixels, rate, processes)
        check_runtime(
            minutes,
            limit,
            f"rule predict of run {run}",
            f"{len(regions)} regions, {megapixels:.0f} megapixels at {rate:g} megapixels/min "
            f"on each of {processes} processes",
            "give predict more nodes (set-resources: predict: nodes) or split the regions table",
        )
    except ProfileError as err:
        raise WorkflowError(str(err)) from None
    return minutes


PREDICT_MINUTES = {run: predict_runtime_of(run) for run in RUNS}


def predict_runtime(wildcards):
    return PREDICT_MINUTES[wildcards.run]


def get_run_rasters(wildcards):
    """The embedding rasters of every region the run maps (prediction-only ones included)."""
    source = RUN_SOURCE[wildcards.run]
    return [job_raster(region, source) for region in mapped_regions_of(source)]


def get_run_cdls(wildcards):
    source = RUN_SOURCE[wildcards.run]
    return [
        REGIONS.loc[region, "cdl"]
        for region in mapped_regions_of(source)
        if REGIONS.loc[region, "cdl"]
    ]


def predict_options(wildcards):
    """predict's options from config predict:, shell-quoted."""
    cfg = config["predict"]
    options = [
        f"--overlap={cfg['overlap']}",
        f"--block={cfg['block']}",
        f"--batch-size={cfg['batch_size']}",
    ]
    if cfg.get("tile"):
        options.append(f"--tile={cfg['tile']}")
    if cfg["probabilities"]:
        options.append("--with-probabilities")
    return shlex.join(options)


def is_predict_only(region):
    return region in REGIONS.index and SPLIT_COLUMN[region] == PREDICT


def map_category(wildcards):
    """The report's section of a region's map: scored regions, or the prediction-only ones."""
    if is_predict_only(wildcards.region):
        return "Maps, unscored (prediction-only regions)"
    return "Maps"


def map_labels(wildcards):
    """The report's labels of a map: run, region and whether it was ever scored."""
    scored = "no (split predict)" if is_predict_only(wildcards.region) else "test tiles"
    return {"run": wildcards.run, "region": wildcards.region, "scored": scored}


def map_targets():
    """Every run's folder of maps (one per region that has the run's source)."""
    return expand("results/maps/{run}", run=RUNS)


def report_targets():
    """What the report shows beyond the summary: maps, curves, data manifests."""
    sources = sorted(set(RUN_SOURCE.values()))
    return [
        *map_targets(),
        *expand("results/runs/{run}/curves.png", run=RUNS),
        *expand("results/data/{source}.{ext}", source=sources, ext=["png", "html"]),
    ]
