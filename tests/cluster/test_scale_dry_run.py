"""A cluster dry run over 1,000 regions: few SLURM jobs (per-region CPU stages grouped, one
prediction job per run, the bookkeeping rules local), and the profile's checks of what it
submits: group jobs as Snakemake itself sums them, read from a real run stopped before its
first submission."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import REPO
from rasterio.transform import from_origin
from test_profiles import CPU_PARTITION, dry_run, jobs_of, real_run
from test_profiles import cluster_env as login_env

from emb.workflow.cluster_fit import Node, Request, check_fits

LOCAL_RULES = {"regions_table", "train_config", "manifest", "summary", "curves", "data_report",
               "all"}  # fmt: skip
GROUPED = {"tessera_npy", "shards"}
PREP_PER_JOB = 50  # group-components prep in profiles/{lumi,betzy}
REGIONS = 1000


def cluster_env(tmp_path: Path) -> dict[str, str]:
    """A login shell's settings (test_profiles.cluster_env) whose workflow imports this
    checkout's src, not whichever checkout the venv's editable install names (a worktree's
    new module would be missing, or an old one tested), as bench/dry_run.py does."""
    return {**login_env(tmp_path), "PYTHONPATH": str(REPO / "src")}


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


@pytest.fixture(scope="module")
def thousand_regions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return many_regions(tmp_path_factory.mktemp("inputs"), REGIONS)


@pytest.fixture(scope="module")
def hundred_regions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return many_regions(tmp_path_factory.mktemp("hundred"), 100)


FIT = re.compile(
    r"^cluster fit: group (\w+) \((\d+) jobs of [\w, ]+\): (\d+) cores, (\d+) MB, (\d+) min; "
    r"a node of '(\w+)': (\d+) cores, (\d+) MB, (\d+) min$",
    re.M,
)


def groups_as_snakemake_sums_them(
    workdir: Path, profile: Path, env: dict[str, str], *extra: str
) -> list[tuple[str, int, Request, Node]]:
    """Each group job of a real run with ``profile`` as Snakemake computed its resources
    (``GroupJob.resources``, what the SLURM plugin turns into --cpus-per-task and --mem): the
    workflow's onstart check logs them ("cluster fit: ...") before the scheduler's first
    submission. The run is killed there (its process group): no SLURM here to submit to."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "config", workdir / "config", dirs_exist_ok=True)
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--profile",
           str(profile), *extra]  # fmt: skip
    run = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    stop = threading.Timer(300, os.killpg, (run.pid, signal.SIGKILL))  # a hang fails, not waits
    stop.start()
    lines = []
    try:
        for line in run.stdout:
            lines.append(line)
            if line.startswith("Select jobs to execute"):  # the scheduler: onstart is done
                break
    finally:
        stop.cancel()
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        run.stdout.close()
    text = "".join(lines)
    assert "Select jobs to execute" in text, text[-3000:]
    return [
        (name, int(jobs), Request(int(cores), int(mem), int(minutes)),
         Node(partition, int(node_cores), int(node_mem), float(limit)))
        for name, jobs, cores, mem, minutes, partition, node_cores, node_mem, limit
        in FIT.findall(text)
    ]  # fmt: skip


@pytest.mark.parametrize("cluster", ["lumi", "betzy"])
def test_a_thousand_regions_and_four_runs_make_at_most_a_hundred_slurm_jobs(
    tmp_path: Path, cluster: str, thousand_regions: Path
) -> None:
    env = cluster_env(tmp_path)

    result = dry_run(tmp_path, REPO / "profiles" / cluster, env, "--config",
                     f"regions={thousand_regions}")  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    jobs = submitted(result.stdout)
    assert sum(jobs.values()) <= 100
    assert jobs.pop("group prep") == math.ceil(2 * REGIONS / PREP_PER_JOB)  # 2 sources a region
    # one predict job per run maps all 1,000 regions, on every GPU of a node
    assert jobs == {"gpu_check": 1, "channel_stats": 2, "train": 4, "evaluate": 4, "predict": 4,
                    "area_estimates": 4}  # fmt: skip
    predict = [job for job in jobs_of(result.stdout) if job["rule"] == "predict"]
    assert all("--regions=" in job["shell"] and "--nproc-per-node" in job["shell"]
               for job in predict)  # fmt: skip
    assert all("gpus_per_node=" in job["resources"] for job in predict)


@pytest.mark.parametrize("cluster", ["lumi", "betzy"])
def test_each_group_job_as_snakemake_sums_it_fits_a_node_of_its_partition(
    tmp_path: Path, cluster: str, hundred_regions: Path
) -> None:
    """The shipped profiles' prep groups, with the resources Snakemake itself gives each
    group job (not a sum of the listed members): 50 pairs side by side on 50 cores, within a
    node of the CPU partition. No --cores: the profiles' command line."""
    env = cluster_env(tmp_path)

    groups = groups_as_snakemake_sums_them(tmp_path / "work", REPO / "profiles" / cluster, env,
                                           "--config", f"regions={hundred_regions}")  # fmt: skip

    assert len(groups) == 2 * 100 // PREP_PER_JOB  # 2 sources a region
    for name, jobs, request, node in groups:
        assert name == "prep" and jobs == PREP_PER_JOB  # one shards job per pair
        assert request.cores == PREP_PER_JOB
        assert node.partition == CPU_PARTITION[cluster]
        check_fits(f"group {name}", request, node, "")


@pytest.mark.parametrize("cluster", ["lumi", "betzy"])
def test_a_real_run_whose_group_outgrows_the_node_stops_in_one_line_before_any_job(
    tmp_path: Path, cluster: str, hundred_regions: Path
) -> None:
    """200 pairs side by side: more cores than the CPU partition's nodes (128) have. No SLURM
    here: the check runs once the DAG is built, before the first sbatch. (``--cores N`` would
    make Snakemake run a group's jobs in layers of at most N cores: 1000 lifts that.)"""
    profile = tmp_path / f"wide-{cluster}"
    shutil.copytree(REPO / "profiles" / cluster, profile)
    config = profile / "config.v8+.yaml"
    text = config.read_text()
    assert "members_per_group(50," in text
    config.write_text(re.sub(r"prep: \?group_size\(.*\)", "prep: 200", text))
    env = cluster_env(tmp_path)

    result = real_run(tmp_path / "work", profile, env, "--cores", "1000", "--config",
                      f"regions={hundred_regions}")  # fmt: skip

    out = result.stdout + result.stderr
    assert result.returncode != 0
    line = next(x for x in out.splitlines() if x.startswith("profile: group prep"))
    assert re.fullmatch(
        r"profile: group prep \(200 jobs of shards\) asks for 200 cores, \d+ MB, "
        r"\d+ min, more than a node of partition '\w+' has \(200 cores > 128\): SLURM would "
        r"keep it pending for ever; set group-components: prep: 128 \(or less\) in the profile",
        line,
    ), line
    assert "submitted with SLURM jobid" not in out and "sbatch" not in out


def test_a_region_table_that_would_outrun_the_prediction_jobs_time_limit_is_refused(
    tmp_path: Path, thousand_regions: Path
) -> None:
    """At 0.001 megapixels/min per GCD, 1,000 regions of 16 px take far over 2 days."""
    profile = tmp_path / "slow-lumi"
    shutil.copytree(REPO / "profiles" / "lumi", profile)
    config = profile / "config.v8+.yaml"
    text = config.read_text()
    assert "mpx_per_minute: 200" in text
    config.write_text(text.replace("mpx_per_minute: 200", "mpx_per_minute: 0.000001"))
    env = cluster_env(tmp_path)

    result = dry_run(tmp_path, profile, env, "--config", f"regions={thousand_regions}")

    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "rule predict of run aef_segformer: 1000 regions" in out
    assert "more than the partition's limit max_runtime=2880 min" in out
    assert "Group job" not in result.stdout and "rule train" not in result.stdout


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
