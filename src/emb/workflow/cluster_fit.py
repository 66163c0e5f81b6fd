"""Whether a SLURM job, or a group of jobs submitted as one, fits a node of its partition.

SLURM keeps a job that asks for more than any node of its partition has pending for ever
(``Reason=PartitionConfig``), and the SLURM executor plugin waits with it. The workflow checks
every job and every group while it is parsed, before anything is submitted, against the node
sizes the profile states, and refuses with one line naming the job, the figures and the fix.

A group is submitted as Snakemake sums it (``snakemake.resources.GroupResources``, no global
``--resources`` limits): the jobs of one level of the group's graph run side by side, so their
cores and memory add up, and the widest level is the request; runtimes are the longest job of
each level, added over the levels.

The check reads the DAG as plain data (:class:`Job`, :class:`Group`: rule, resources, threads),
so that its decisions are tested without Snakemake; :func:`dag_jobs` is the one place that reads
Snakemake's DAG, and :func:`check_dag` is what the rules' ``onstart:`` calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class FitError(ValueError):
    """A job or group that no node of its partition can run."""


@dataclass(frozen=True)
class Node:
    """One node of a partition as jobs can use it: cores, memory (MB), time limit (minutes)."""

    partition: str
    cores: int
    mem_mb: int
    max_runtime: float | None = None


@dataclass(frozen=True)
class Request:
    """What one SLURM job asks for on one node."""

    cores: int
    mem_mb: int
    runtime: int


def group_request(levels: Sequence[Sequence[Request]]) -> Request:
    """The request of a group whose members run level by level (``levels``: the members of
    each level of the group's graph, in order), summed as Snakemake submits it."""
    levels = [level for level in levels if level]
    if not levels:
        raise ValueError("a group needs at least one member")
    return Request(
        cores=max(sum(r.cores for r in level) for level in levels),
        mem_mb=max(sum(r.mem_mb for r in level) for level in levels),
        runtime=sum(max(r.runtime for r in level) for level in levels),
    )


def members_that_fit(node: Node, member: Request) -> int:
    """How many ``member`` jobs side by side one ``node`` holds (0 when not even one)."""
    return min(node.cores // max(1, member.cores), node.mem_mb // max(1, member.mem_mb))


def members_per_group(configured: int, node_cores: int, member_cores: int = 1) -> int:
    """Jobs per group (``group-components``): the configured number, fewer where one node's
    cores cannot run that many side by side (at least 1)."""
    return max(1, min(configured, node_cores // max(1, member_cores)))


def check_fits(job: str, request: Request, node: Node, fix: str) -> None:
    """Refuse ``request`` of ``job`` (e.g. "rule train", "group prep (50 jobs)") when it
    exceeds ``node``: one line naming what was asked, what the node has, and ``fix``."""
    over = []
    if request.cores > node.cores:
        over.append(f"{request.cores} cores > {node.cores}")
    if request.mem_mb > node.mem_mb:
        over.append(f"{request.mem_mb} MB > {node.mem_mb} MB")
    if node.max_runtime is not None and request.runtime > node.max_runtime:
        over.append(f"{request.runtime} min > {node.max_runtime:g} min")
    if over:
        raise FitError(
            f"profile: {job} asks for {request.cores} cores, {request.mem_mb} MB, "
            f"{request.runtime} min, more than a node of partition {node.partition!r} has "
            f"({'; '.join(over)}): SLURM would keep it pending for ever; {fix}"
        )


def largest_group_fix(group: str, node: Node, member_levels: Sequence[Request]) -> str:
    """The fix for a group too wide for its node: the ``group-components`` that fits."""
    fits = min(members_that_fit(node, member) for member in member_levels)
    if fits < 1:
        return (
            f"one job of group {group} alone does not fit: lower its resources "
            f"(set-resources) or choose a partition with larger nodes"
        )
    return f"set group-components: {group}: {fits} (or less) in the profile"


SINGLE_JOB_FIX = "lower its resources (set-resources) or send it to a partition with larger nodes"


@dataclass(frozen=True)
class Job:
    """One job of the DAG as SLURM would get it: its rule, its resources (``node_cores``,
    ``mem_mb``, ... as the profile and the rule give them), its threads, and whether it runs
    where Snakemake runs (``localrules``: never submitted)."""

    rule: str
    resources: Mapping[str, Any]
    threads: int = 1
    local: bool = False


@dataclass(frozen=True)
class Group:
    """A group job: its members, and its resources and threads as Snakemake sums them for the
    one SLURM job it submits (the side-by-side members' cores: its threads)."""

    groupid: str
    members: Sequence[Job]
    resources: Mapping[str, Any]
    threads: int


def node_of(resources: Mapping[str, Any]) -> Node | None:
    """The node of the job's partition as the profile states it, or None (a local run, or a
    profile that states no node sizes)."""
    if resources.get("node_cores") is None or resources.get("node_mem_mb") is None:
        return None
    return Node(
        partition=str(resources.get("slurm_partition") or "default"),
        cores=int(resources["node_cores"]),
        mem_mb=int(resources["node_mem_mb"]),
        max_runtime=resources.get("max_runtime"),
    )


def request_of(resources: Mapping[str, Any], threads: int) -> Request:
    """Cores per node, memory (MB) and minutes as the SLURM plugin asks for them: tasks x
    cpus_per_task in the mpi form, else cpus_per_task or the job's ``threads`` (a group: the
    sum of its side-by-side members, which Snakemake hands over as its threads)."""
    get = resources.get
    cpus = get("cpus_per_task") or threads
    tasks = get("tasks_per_node") if get("mpi") else get("tasks")
    return Request(
        cores=int(cpus) * int(tasks or 1),
        mem_mb=int(get("mem_mb") or 0),
        runtime=int(get("runtime") or 0),
    )


def check_group(group: Group) -> str | None:
    """Refuse a group job no node of its partition holds (:class:`FitError`, with the
    ``group-components`` that fits); else the line the log shows: what it asks and the node's
    size (None without node sizes: nothing to check)."""
    node = node_of(group.members[0].resources)
    if node is None:
        return None
    rules = sorted({job.rule for job in group.members})
    what = f"group {group.groupid} ({len(group.members)} jobs of {', '.join(rules)})"
    asked = request_of(group.resources, group.threads)
    widest = [request_of(job.resources, job.threads) for job in group.members]
    check_fits(what, asked, node, largest_group_fix(group.groupid, node, widest))
    limit = f"{node.max_runtime:g} min" if node.max_runtime else "no time limit"
    return (
        f"cluster fit: {what}: {asked.cores} cores, {asked.mem_mb} MB, {asked.runtime} min; "
        f"a node of {node.partition!r}: {node.cores} cores, {node.mem_mb} MB, {limit}"
    )


def check_job(job: Job) -> None:
    """Refuse a SLURM job (not local, with node sizes) that no node of its partition holds."""
    node = None if job.local else node_of(job.resources)
    if node is not None:
        check_fits(f"rule {job.rule}", request_of(job.resources, job.threads), node, SINGLE_JOB_FIX)


def check_jobs(jobs: Iterable[Job | Group]) -> Iterator[str]:
    """Every SLURM job and group job of ``jobs`` fits a node of its partition, else
    :class:`FitError` for the first that does not; each checked group's log line, in order."""
    for job in jobs:
        if isinstance(job, Group):
            line = check_group(job)
            if line is not None:
                yield line
        else:
            check_job(job)


def _job_of(job: Any, read_resources: bool = True) -> Job:
    """A Snakemake job (or group job) as plain data."""
    resources = dict(job.resources.items()) if read_resources else {}
    return Job(job.rule.name, resources, int(job.threads), bool(job.is_local))


def dag_jobs(dag: Any) -> Iterator[Job | Group]:
    """The jobs of Snakemake's ``dag`` that will run, each group once, as plain data. A local
    job's resources are not read (it is never submitted), nor a group's sum where its first
    member states no node size (nothing to check it against)."""
    seen = set()
    for job in dag.needrun_jobs():
        group = dag.get_job_group(job)
        if group is None:
            yield _job_of(job, read_resources=not job.is_local)
        elif group not in seen:
            seen.add(group)
            members = [_job_of(member) for member in group.jobs]
            if node_of(members[0].resources) is not None:
                submitted = dict(group.resources.items())
                yield Group(str(group.groupid), members, submitted, int(group.threads))


def check_dag(dag: Any, log: Callable[[str], object]) -> None:
    """The rules' ``onstart`` check (workflow/rules/cluster.smk): every SLURM job and group job
    of ``dag`` fits a node of its partition, else Snakemake's ``WorkflowError`` with the one
    line; each group's figures go to ``log``. Runs once the DAG is built, before the first job
    is submitted (a dry run submits nothing and lists every job's resources instead)."""
    from emb.workflow.errors import as_workflow_error  # here: the profiles import this module

    with as_workflow_error((FitError,)):
        for line in check_jobs(dag_jobs(dag)):
            log(line)
