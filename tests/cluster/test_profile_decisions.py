"""What the workflow decides from the profile while it parses (emb.workflow.profile), asked
with Snakemake's own resource settings: GPU rules on a GPU partition, and the prediction job's
minutes within the partition's limit. Before, only dry runs with a profile reached these."""

from __future__ import annotations

import pytest
from snakemake.resources import Resources
from snakemake.settings.types import ResourceSettings

from emb.workflow import profile
from emb.workflow.profile import ProfileError


def settings(default: dict, **rules: dict) -> ResourceSettings:
    """Resources as Snakemake parses a profile's default-resources and set-resources."""
    return ResourceSettings(
        overwrite_resources={rule: Resources.from_mapping(r) for rule, r in rules.items()},
        default_resources=Resources.from_mapping(default),
    )


def test_a_rule_set_resource_wins_over_the_default_and_unset_is_none() -> None:
    given = settings({"slurm_partition": "small"}, train={"slurm_partition": "gpu"})
    assert profile.profile_resource(given, "train", "slurm_partition") == "gpu"
    assert profile.profile_resource(given, "shards", "slurm_partition") == "small"
    assert profile.profile_resource(given, "train", "nodes") is None


@pytest.mark.parametrize(
    "gpus",
    [{"gpus_per_node": 2}, {"gres": "gpu:4"}, {"slurm_extra": "--gpus=8"}],
)
def test_a_gpu_rule_on_the_cpu_partition_is_refused_naming_rule_and_partition(gpus) -> None:
    given = settings({"slurm_partition": "small"}, train={"slurm_partition": "small", **gpus})
    with pytest.raises(ProfileError, match=r"rule train asks for GPUs on partition 'small'"):
        profile.check_gpu_partitions(given)
    profile.check_gpu_partitions(
        settings({"slurm_partition": "small"}, train={"slurm_partition": "gpu", **gpus})
    )
    profile.check_gpu_partitions(settings({"slurm_partition": "small"}, shards={"mem_mb": 9}))


def test_predict_minutes_follow_the_profiles_rate_and_processes() -> None:
    cpu = profile.predict_runtime(settings({}), "rule predict of run r", 300.0, 3)
    assert cpu == profile.predict_minutes(300.0, profile.CPU_MPX_PER_MINUTE, 1) == 210
    given = settings({}, predict={"mpx_per_minute": 100, "nodes": 2, "tasks_per_node": 4})
    assert profile.predict_runtime(given, "rule predict of run r", 300.0, 3) == 11
    as_string = settings({}, predict={"mpx_per_minute": "1e-06", "max_runtime": 1e12})
    assert profile.predict_runtime(as_string, "job", 1.0, 1) == 2_000_010


def test_a_prediction_beyond_the_partitions_limit_is_refused_with_its_work() -> None:
    given = settings({}, predict={"mpx_per_minute": 1, "max_runtime": 60})
    with pytest.raises(ProfileError, match=r"rule predict of run aef_x: 7 regions, 100 megapix"):
        profile.predict_runtime(given, "rule predict of run aef_x", 100.0, 7)
    with pytest.raises(ProfileError, match=r"mpx_per_minute: expected a number > 0"):
        profile.predict_runtime(settings({}, predict={"mpx_per_minute": 0}), "job", 1.0, 1)


@pytest.mark.parametrize(
    ("value", "as_is"),
    [("small", True), ("project_465000123", True), ("standard-g", False), ("<EMB_ACCOUNT>", True),
     ("nn1234k", True), ("2 * attempt", False), ("attempt", False), ("max", False),
     ("None", False), ("'small'", False), ("lookup", False), ("$EMB_ACCOUNT", False),
     ("~x", False), (4000, False)],
)  # fmt: skip
def test_a_profile_string_is_fixed_only_where_snakemake_would_pass_it_as_it_is(
    value: object, as_is: bool
) -> None:
    """Snakemake evaluates a profile's string resource per job and keeps the string where that
    fails: 'max' is Python's, 'lookup' Snakemake's, '2 * attempt' the job's; 'standard-g' fails
    too (an undefined name), but not on its face, so it stays evaluated per job."""
    assert profile.passed_as_is(value) is as_is
    if as_is:  # what Snakemake itself makes of it, evaluated as for a job
        parsed = Resources.parse([f"slurm_partition={value}"], allow_expressions=True)
        assert parsed["slurm_partition"].is_evaluable()


def test_a_per_region_rule_gets_the_profiles_plain_account_and_partition_once() -> None:
    given = settings(
        {"slurm_account": "project_1", "slurm_partition": "small", "mem_mb": 4000},
        shards={"slurm_partition": "bigmem"}, train={"slurm_partition": "2 * attempt"},
    )  # fmt: skip
    names = ("slurm_account", "slurm_partition", "mem_mb", "gres")
    assert profile.fixed_strings(given, "shards", names) == {
        "slurm_account": "project_1", "slurm_partition": "bigmem"
    }  # fmt: skip
    assert profile.fixed_strings(given, "train", names) == {"slurm_account": "project_1"}
