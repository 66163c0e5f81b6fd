"""A cluster dry run over many regions: few SLURM jobs (per-region CPU stages grouped, the
bookkeeping rules local), and the profile's checks of what it submits."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import REPO
from rasterio.transform import from_origin
from test_profiles import cluster_env, dry_run

LOCAL_RULES = {"train_config", "manifest", "summary", "curves", "data_report", "all"}
GROUPED = {"align_labels", "shards"}
PREP_PER_JOB = 50  # group-components prep in profiles/{lumi,betzy}


def many_regions(root: Path, n: int) -> Path:
    """``n`` regions of tiny real rasters, each on its own grid (no raster listed twice)."""
    rows = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    shape = {"driver": "GTiff", "width": 4, "height": 4, "crs": "EPSG:32615"}
    for i in range(n):
        folder = root / f"r{i:04d}"
        folder.mkdir(parents=True)
        transform = from_origin(500000 + i * 100, 4000000, 10, 10)
        for kind, count, dtype in (("aef", 64, "int8"), ("tessera", 128, "float32"),
                                   ("cdl", 1, "uint8")):  # fmt: skip
            with rasterio.open(folder / f"{kind}.tif", "w", count=count, dtype=dtype,
                               transform=transform, **shape) as dst:  # fmt: skip
                dst.write(np.ones((count, 4, 4), dtype))
        cells = [str(folder / f"{kind}.tif") for kind in ("aef", "tessera", "cdl")]
        rows.append("\t".join([f"r{i:04d}", "2024", *cells, "auto"]))
    table = root / "regions.tsv"
    table.write_text("\n".join(rows) + "\n")
    return table


def submitted(stdout: str) -> dict[str, int]:
    """SLURM jobs a dry run plans: group jobs, and the jobs of rules neither grouped nor local."""
    groups = re.findall(r"Group job (\w+)", stdout)
    rules = re.findall(r"^rule (\w+):", stdout, re.M)
    jobs = {f"group {g}": groups.count(g) for g in set(groups)}
    for rule in set(rules) - GROUPED - LOCAL_RULES:
        jobs[rule] = rules.count(rule)
    return jobs


@pytest.mark.parametrize("cluster", ["lumi", "betzy"])
def test_per_region_cpu_stages_run_as_grouped_jobs_and_bookkeeping_locally(
    tmp_path: Path, cluster: str
) -> None:
    regions = 60
    table = many_regions(tmp_path / "inputs", regions)
    env = cluster_env(tmp_path)

    result = dry_run(tmp_path, REPO / "profiles" / cluster, env, "--config", f"regions={table}")

    assert result.returncode == 0, result.stderr[-3000:]
    jobs = submitted(result.stdout)
    assert jobs.pop("group prep") == math.ceil(2 * regions / PREP_PER_JOB)  # 2 sources a region
    assert jobs == {"gpu_check": 1, "channel_stats": 2, "train": 4, "evaluate": 4,
                    "predict": 4 * regions}  # fmt: skip


def test_gpus_asked_on_the_profiles_cpu_partition_are_refused_before_any_job(
    tmp_path: Path,
) -> None:
    env = cluster_env(tmp_path)
    result = dry_run(tmp_path, REPO / "profiles" / "lumi", env, "--set-resources",
                     "predict:slurm_partition=small", "predict:gpus_per_node=1")  # fmt: skip
    assert result.returncode != 0
    assert ("rule predict asks for GPUs on partition 'small', the profile's CPU partition"
            in result.stdout + result.stderr)  # fmt: skip
    assert "Group job" not in result.stdout
