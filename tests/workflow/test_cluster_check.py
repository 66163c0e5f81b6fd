"""The onstart check of every SLURM job and group job against its node (emb.workflow.cluster_fit),
over the DAG as plain data: what a job asks for (the SLURM plugin's arithmetic), which jobs are
checked, the refusals and the log lines tests/cluster/test_scale_dry_run.py reads."""

from __future__ import annotations

import pytest

from emb.workflow.cluster_fit import (
    FitError,
    Group,
    Job,
    Node,
    Request,
    check_jobs,
    node_of,
    request_of,
)

SMALL = {"slurm_partition": "small", "node_cores": 8, "node_mem_mb": 16000, "max_runtime": 60}


def prep_job(rule: str, mem_mb: int = 1000, runtime: int = 10) -> Job:
    return Job(rule, {**SMALL, "mem_mb": mem_mb, "runtime": runtime}, threads=1)


def prep_group(members: int, summed_cores: int, summed_mem_mb: int) -> Group:
    jobs = [prep_job("shards", runtime=20)] * members
    summed = {**SMALL, "mem_mb": summed_mem_mb, "runtime": 20}
    return Group("prep", jobs, summed, threads=summed_cores)


def test_the_node_is_the_profiles_figures_and_none_without_them() -> None:
    assert node_of(SMALL) == Node("small", 8, 16000, 60)
    assert node_of({"node_cores": 8, "node_mem_mb": 16000}) == Node("default", 8, 16000, None)
    assert node_of({"node_cores": 8}) is None
    assert node_of({}) is None


def test_a_job_asks_for_tasks_times_cpus_in_the_mpi_form_else_its_cpus_or_threads() -> None:
    mpi = {"mpi": "srun", "tasks_per_node": 8, "cpus_per_task": 7, "tasks": 2, "mem_mb": 480000}
    assert request_of(mpi, threads=1) == Request(56, 480000, 0)
    assert request_of({"tasks": 2, "cpus_per_task": 3, "runtime": 30}, 1) == Request(6, 0, 30)
    assert request_of({"mem_mb": 500}, threads=4) == Request(4, 500, 0)


def test_a_group_that_fits_logs_what_it_asks_next_to_its_node() -> None:
    lines = list(check_jobs([prep_group(4, summed_cores=4, summed_mem_mb=4000)]))
    assert lines == [
        "cluster fit: group prep (4 jobs of shards): 4 cores, 4000 MB, 20 min; "
        "a node of 'small': 8 cores, 16000 MB, 60 min"
    ]


def test_a_group_wider_than_its_node_is_refused_with_the_group_size_that_fits() -> None:
    with pytest.raises(FitError) as err:
        list(check_jobs([prep_group(20, summed_cores=10, summed_mem_mb=10000)]))
    assert str(err.value) == (
        "profile: group prep (20 jobs of shards) asks for 10 cores, 10000 MB, "
        "20 min, more than a node of partition 'small' has (10 cores > 8): SLURM would keep it "
        "pending for ever; set group-components: prep: 8 (or less) in the profile"
    )


def test_a_single_job_beyond_its_node_is_refused_naming_its_rule() -> None:
    too_big = Job("predict", {**SMALL, "mem_mb": 20000, "runtime": 90}, threads=2)
    with pytest.raises(FitError) as err:
        list(check_jobs([prep_job("shards"), too_big]))
    assert str(err.value) == (
        "profile: rule predict asks for 2 cores, 20000 MB, 90 min, more than a node of "
        "partition 'small' has (20000 MB > 16000 MB; 90 min > 60 min): SLURM would keep it "
        "pending for ever; lower its resources (set-resources) or send it to a partition with "
        "larger nodes"
    )


def test_local_jobs_and_jobs_without_node_sizes_are_not_checked() -> None:
    huge = {"mem_mb": 10**9, "runtime": 10**6}
    local = Job("summary", {**SMALL, **huge}, threads=64, local=True)
    laptop = Job("shards", huge, threads=64)  # a local run: no node sizes in the resources
    no_nodes = Group("prep", [laptop], huge, threads=64)
    assert list(check_jobs([local, laptop, no_nodes])) == []


def test_the_groups_lines_come_in_order_before_a_later_refusal() -> None:
    """onstart logs each group as it is checked: the ones before a refusal are in the log."""
    checked = check_jobs([prep_group(2, 2, 2000), prep_group(20, 10, 10000)])
    assert next(checked).startswith("cluster fit: group prep (2 jobs")
    with pytest.raises(FitError):
        next(checked)
