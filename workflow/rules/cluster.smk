# What the SLURM jobs ask for, and whether it fits: memory and time of the per-region and
# per-source stages from measured peaks (emb.workflow.resources, bench/memory.py), and a check of
# every job and every group job of the DAG, with the resources Snakemake submits them with,
# against the node sizes the profile states (resources node_cores, node_mem_mb, max_runtime):
# emb.workflow.cluster_fit. The check runs once the DAG is built, before the first job is
# submitted (onstart; a dry run submits nothing and lists every job's resources instead:
# bench/dry_run.py sums its groups).
from snakemake.logging import logger

from emb.workflow import cluster_fit
from emb.workflow import resources as measured

# Pixels of each (source, region)'s raster, once: the resource functions run for every job.
REGION_PIXELS = TABLE.raster_pixels(RASTER_PIXELS)


def region_mem_mb(*stages):
    """The largest peak of the stages a per-region rule runs one after another."""
    return measured.region_mem_mb(stages, REGION_PIXELS)


def region_runtime(*stages):
    """The summed time of the stages a per-region rule runs one after another."""
    return measured.region_runtime(stages, REGION_PIXELS)


def source_mem_mb(stage):
    return measured.source_mem_mb(stage)


def profile_strings(rule):
    """The profile's account and partition of a per-region rule as plain values, found once
    (emb.workflow.profile.fixed_strings), not evaluated per job."""
    names = ("slurm_account", "slurm_partition")
    return profile.fixed_strings(workflow.resource_settings, rule, names)


def launched_mem_mb(stage):
    """evaluate reads a run's training regions, predict maps its prediction-only ones too."""
    regions = TABLE.mapped_regions if stage == "predict" else TABLE.training_regions
    block = config["predict"]["block"] if stage == "predict" else 0
    processes = profile_resource(stage, "tasks_per_node")
    return measured.run_mem_mb(
        stage, processes, RUN_SOURCE, regions, REGION_PIXELS, block
    )


onstart:
    cluster_fit.check_dag(workflow.dag, logger.info)
