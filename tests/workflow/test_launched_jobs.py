"""What the workflow reads of a launched job's resources (emb.workflow.profile), asked with
Snakemake's own Resources: the training job's processes for the manifest's shard-count check,
and each process's CPU threads. Before, only dry runs with a profile reached these."""

from __future__ import annotations

import pytest
from snakemake.resources import Resources

from emb.workflow import profile
from emb.workflow.profile import ProfileError


def test_a_training_job_runs_nodes_times_tasks_per_node_processes() -> None:
    resources = Resources.from_mapping({"nodes": 2, "tasks_per_node": 8, "mem_mb": 9})
    assert profile.launched_processes(resources, "train") == 16
    assert profile.launched_processes({"nodes": 1, "tasks_per_node": 4}, "train") == 4


def test_processes_not_known_while_parsing_are_refused_naming_the_job_and_values() -> None:
    resources = Resources.from_mapping({"nodes": 1, "tasks_per_node": "4 if attempt else 2"})
    found = r"found \{'nodes': 1, 'tasks_per_node': '4 if attempt else 2'\}"
    with pytest.raises(ProfileError, match=rf"train job's resources .*expected integers, {found}"):
        profile.launched_processes(resources, "train")


def test_each_process_gets_the_profiles_cpus_else_a_share_of_the_rules_threads() -> None:
    assert profile.threads_per_process(8, 7, 8) == 7  # the profile's cpus_per_task
    assert profile.threads_per_process(8, None, 2) == 4  # a laptop: threads over processes
    assert profile.threads_per_process(2, 0, 4) == 1  # never below one
