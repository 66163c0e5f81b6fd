"""What a SLURM job or group asks for, and the check of it against a node
(emb.workflow.cluster_fit), and the measured memory and time of the CPU stages
(emb.workflow.resources)."""

from __future__ import annotations

import pytest

from emb.workflow.cluster_fit import (
    FitError,
    Node,
    Request,
    check_fits,
    group_request,
    largest_group_fix,
    members_per_group,
)
from emb.workflow.resources import launched_mem_mb, mem_mb, runtime

NODE = Node("debug", cores=2, mem_mb=20000, max_runtime=60)


def test_the_dry_run_estimate_sums_side_by_side_jobs_and_adds_the_levels_times() -> None:
    """bench/dry_run.py's estimate of a listed group (a dry run shows no group resources);
    what Snakemake itself sums is checked in test_scale_dry_run.py."""
    convert, shards = Request(1, 500, 10), Request(1, 800, 20)
    # 4 TESSERA regions of .npy tiles: 4 tessera_npy side by side, then 4 shards
    assert group_request([[convert] * 4, [shards] * 4]) == Request(4, 3200, 30)


def test_a_group_wider_than_the_node_is_refused_in_one_line_with_the_fitting_size() -> None:
    members = [Request(1, 500, 10), Request(1, 800, 20)]
    wide = Request(4, 3200, 30)  # 4 pairs, as the group job's resources give them
    with pytest.raises(FitError) as err:
        check_fits("group prep (8 jobs)", wide, NODE, largest_group_fix("prep", NODE, members))
    assert str(err.value) == (
        "profile: group prep (8 jobs) asks for 4 cores, 3200 MB, 30 min, more than a node of "
        "partition 'debug' has (4 cores > 2): SLURM would keep it pending for ever; set "
        "group-components: prep: 2 (or less) in the profile"
    )
    assert "\n" not in str(err.value)


def test_memory_and_time_beyond_the_node_are_named_and_a_fitting_job_passes() -> None:
    check_fits("rule x", Request(2, 20000, 60), NODE, "fix")
    with pytest.raises(FitError, match=r"\(20001 MB > 20000 MB; 61 min > 60 min\)"):
        check_fits("rule x", Request(1, 20001, 61), NODE, "fix")


def test_a_member_that_alone_outgrows_the_node_asks_for_other_resources() -> None:
    fix = largest_group_fix("prep", NODE, [Request(1, 30000, 10)])
    assert fix.startswith("one job of group prep alone does not fit")


@pytest.mark.parametrize(("configured", "cores", "expected"),
                         [(50, 128, 50), (4, 2, 2), (50, 1, 1), (1, 64, 1)])  # fmt: skip
def test_group_size_is_the_configured_one_where_the_nodes_cores_run_it(
    configured: int, cores: int, expected: int
) -> None:
    assert members_per_group(configured, cores) == expected


def test_memory_grows_with_the_raster_doubles_per_retry_and_has_a_floor() -> None:
    # shards on AEF: 146 MiB + 1.1 MiB/Mpx, x1.5 margin, in MB, rounded up to 100 MB:
    # 1 Mpx -> 231 MB -> the 500 MB floor; 400 Mpx -> 922 MB -> 1000; 1000 Mpx -> 1960 -> 2000.
    small, large = mem_mb("shards", 1e6, "aef"), mem_mb("shards", 400e6, "aef")
    assert (small, large) == (500, 1000)
    assert mem_mb("shards", 1000e6, "aef") == 2000
    assert mem_mb("shards", 400e6, "aef", attempt=2) == 2 * large
    assert mem_mb("shards", 400e6, "aef", attempt=3) == 4 * large


def test_runtime_grows_with_the_raster_from_a_floor() -> None:
    assert runtime("shards", 0, "aef") == 10
    assert runtime("shards", 67e6, "aef") > runtime("shards", 4e6, "aef")


def test_launched_jobs_ask_per_process_and_predict_for_its_block_and_raster() -> None:
    one = launched_mem_mb("predict", 1, block=1024, pixels=128 * 128)
    assert launched_mem_mb("predict", 2, block=1024, pixels=128 * 128) == 2 * one
    assert launched_mem_mb("predict", 1, block=256, pixels=128 * 128) < one
    assert launched_mem_mb("predict", 1, block=1024, pixels=67e6) > one
    assert launched_mem_mb("evaluate", 1, attempt=2) == 2 * launched_mem_mb("evaluate", 1)
