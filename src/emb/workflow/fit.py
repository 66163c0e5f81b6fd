"""Whether a SLURM job, or a group of jobs submitted as one, fits a node of its partition.

SLURM keeps a job that asks for more than any node of its partition has pending for ever
(``Reason=PartitionConfig``), and the SLURM executor plugin waits with it. The workflow checks
every job and every group while it is parsed, before anything is submitted, against the node
sizes the profile states, and refuses with one line naming the job, the figures and the fix.

A group is submitted as Snakemake sums it (``snakemake.resources.GroupResources``, no global
``--resources`` limits): the jobs of one level of the group's graph run side by side, so their
cores and memory add up, and the widest level is the request; runtimes are the longest job of
each level, added over the levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
