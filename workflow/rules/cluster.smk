# What the SLURM jobs ask for, and whether it fits: memory and time of the per-region and
# per-source stages from measured peaks (emb.workflow.resources, bench/memory.py), and a check of
# every job and every group job of the DAG, with the resources Snakemake submits them with,
# against the node sizes the profile states (resources node_cores, node_mem_mb, max_runtime).
# The check runs once the DAG is built, before the first job is submitted (onstart; a dry run
# submits nothing and lists every job's resources instead: bench/dry_run.py sums its groups).
from snakemake.logging import logger

from emb.workflow import resources as measured
from emb.workflow.fit import FitError, Node, Request, check_fits, largest_group_fix


def raster_pixels(source, region):
    """Pixels of the region's raster of ``source`` (0 for a demo raster not made yet)."""
    return RASTER_PIXELS.get(TABLE.cell(region, source), 0)


def region_mem_mb(stage):
    """``mem_mb`` of a per-(source, region) rule: from its raster's size, doubled per retry."""

    def mem_mb(wildcards, attempt):
        pixels = raster_pixels(wildcards.source, wildcards.region)
        return measured.mem_mb(stage, pixels, wildcards.source, attempt)

    return mem_mb


def region_runtime(stage):
    """``runtime`` (minutes) of a per-(source, region) rule: from its raster's size."""

    def runtime(wildcards):
        pixels = raster_pixels(wildcards.source, wildcards.region)
        return measured.runtime(stage, pixels, wildcards.source)

    return runtime


def source_mem_mb(stage):
    """``mem_mb`` of a per-source rule (its peak does not grow with the rasters)."""

    def mem_mb(wildcards, attempt):
        return measured.mem_mb(stage, 0, wildcards.source, attempt)

    return mem_mb


def launched_mem_mb(stage):
    """``mem_mb`` of ``evaluate`` or ``predict``: the measured peak of one process, times the
    processes of a node (the profile's tasks_per_node), doubled per retry."""
    processes = profile_resource(stage, "tasks_per_node") or 1

    def mem_mb(wildcards, attempt):
        source = RUN_SOURCE[wildcards.run]
        # predict maps the prediction-only regions too; evaluate reads the training ones
        regions = (
            TABLE.mapped_regions(source)
            if stage == "predict"
            else TABLE.training_regions(source)
        )
        pixels = max((raster_pixels(source, r) for r in regions), default=0)
        return measured.launched_mem_mb(
            stage,
            processes if isinstance(processes, int) else 1,
            attempt,
            block=config["predict"]["block"] if stage == "predict" else 0,
            pixels=pixels,
            source=source,
        )

    return mem_mb


def node_of(job):
    """The node of the job's partition as the profile states it, or None (a local run, or a
    profile that states no node sizes)."""
    get = job.resources.get
    if get("node_cores") is None or get("node_mem_mb") is None:
        return None
    return Node(
        partition=str(get("slurm_partition") or "default"),
        cores=int(get("node_cores")),
        mem_mb=int(get("node_mem_mb")),
        max_runtime=get("max_runtime"),
    )


def request_of(job):
    """Cores per node, memory (MB) and minutes as the SLURM plugin asks for them: tasks x
    cpus_per_task in the mpi form, else cpus_per_task or the job's threads (a group: the sum
    of its side-by-side members, which Snakemake hands over as its threads)."""
    get = job.resources.get
    cpus = get("cpus_per_task") or job.threads
    tasks = get("tasks_per_node") if get("mpi") else get("tasks")
    return Request(
        cores=int(cpus) * int(tasks or 1),
        mem_mb=int(get("mem_mb") or 0),
        runtime=int(get("runtime") or 0),
    )


def check_cluster_fit():
    """Every SLURM job and group job of the DAG fits a node of its partition, else one line
    naming it, the figures and the fix."""
    dag = workflow.dag
    checked = set()
    try:
        for job in dag.needrun_jobs():
            group = dag.get_job_group(job)
            if group is not None:
                if group in checked:
                    continue
                checked.add(group)
                members = list(group.jobs)
                node = node_of(members[0])
                if node is None:
                    continue
                rules = sorted({j.rule.name for j in members})
                widest = [request_of(j) for j in members]
                what = (
                    f"group {group.groupid} ({len(members)} jobs of {', '.join(rules)})"
                )
                asked = request_of(group)
                fix = largest_group_fix(group.groupid, node, widest)
                check_fits(what, asked, node, fix)
                limit = (
                    f"{node.max_runtime:g} min" if node.max_runtime else "no time limit"
                )
                logger.info(
                    f"cluster fit: {what}: {asked.cores} cores, {asked.mem_mb} MB, "
                    f"{asked.runtime} min; a node of {node.partition!r}: {node.cores} cores, "
                    f"{node.mem_mb} MB, {limit}"
                )
            elif not job.is_local:
                node = node_of(job)
                if node is not None:
                    check_fits(
                        f"rule {job.rule.name}",
                        request_of(job),
                        node,
                        "lower its resources (set-resources) or send it to a partition "
                        "with larger nodes",
                    )
    except FitError as err:
        raise WorkflowError(str(err)) from None


onstart:
    check_cluster_fit()
