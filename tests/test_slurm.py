"""The cluster path on a real SLURM: a single-node cluster on localhost (scripts/slurm/start.sh
installs Debian's slurm-wlm and munge when missing and starts the daemons; they are stopped by
PID at the end). Every rule runs as a SLURM job through profiles/slurm-localhost; training is a
2-process DDP job started by the launcher inside its srun step.

Deselect locally with ``pytest -m "not slurm"``; CI (root, Debian) runs them.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, corrupt_copy, venv_env, wait_for

from emb.workflow.profile import local_node

pytestmark = pytest.mark.slurm

PROFILE = REPO / "profiles" / "slurm-localhost"
RUN_LIMIT_S = 1200  # one Snakemake run on the local SLURM, ended by `timeout -k 30`
# Tiny-demo epochs take 0.1 s each on a quiet 2-core machine (2026-11-25), up to 0.6 s under
# load: 120 outlast the ~1 s between the first job's second epoch and its signal.
LIMIT_EPOCHS = 120


@pytest.fixture(scope="session")
def slurm() -> None:
    """A running single-node SLURM; stopped at the end if this session started it."""
    start = subprocess.run(
        ["timeout", "-k", "10", "600", str(REPO / "scripts/slurm/start.sh")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert start.returncode == 0, (
        "scripts/slurm/start.sh failed (it needs root and apt on Debian; deselect these tests "
        f"with -m 'not slurm'):\n{start.stdout[-3000:]}{start.stderr[-3000:]}"
    )
    started = "starting " in start.stdout
    yield
    if started:
        subprocess.run(["timeout", "-k", "10", "120", str(REPO / "scripts/slurm/stop.sh")])


def snakemake_command(
    workdir: Path, profile: Path, *args: str, configfiles: tuple[str, ...] = ()
) -> list[str]:
    """One Snakemake run on the local SLURM, from ``workdir``, ended by a timeout in any case;
    ``configfiles`` are merged over the tests' ``.test/config.yaml``."""
    # targets and --config go before --configfile: both options take lists of values
    return ["timeout", "-k", "30", str(RUN_LIMIT_S), "snakemake", "-s", str(REPO / "Snakefile"),
            "-d", str(workdir), "--profile", str(profile), *args,
            "--configfile", ".test/config.yaml", *configfiles]  # fmt: skip


def snakemake(
    workdir: Path, profile: Path, *args: str, configfiles: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """:func:`snakemake_command` run to its end; its output kept in ``workdir``."""
    cmd = snakemake_command(workdir, profile, *args, configfiles=configfiles)
    started = time.time()
    result = subprocess.run(cmd, cwd=workdir, env=venv_env(), capture_output=True, text=True,
                            timeout=RUN_LIMIT_S + 60)  # fmt: skip
    (workdir / f"snakemake-{int(started)}.log").write_text(result.stdout + result.stderr)
    print(f"snakemake {' '.join(args)}: {time.time() - started:.0f} s")
    return result


def profile_with(tmp: Path, name: str, train: dict) -> Path:
    """A copy of profiles/slurm-localhost whose train resources are updated with ``train``."""
    profile = yaml.safe_load((PROFILE / "config.v8+.yaml").read_text())
    profile["set-resources"]["train"] = {**profile["set-resources"]["train"], **train}
    path = tmp / name
    path.mkdir()
    (path / "config.v8+.yaml").write_text(yaml.safe_dump(profile))
    return path


def slurm_job_logs(workdir: Path, rule: str, wildcards: str = "") -> list[Path]:
    return sorted((workdir / ".snakemake" / "slurm_logs" / f"rule_{rule}" / wildcards).glob(
        "*.log"))  # fmt: skip


def rank_records(run_dir: Path) -> list[dict]:
    return [json.loads((run_dir / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def workdir(slurm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo with both sources (as the README's default runs), end to end on SLURM,
    then the same data for more."""
    path = tmp_path_factory.mktemp("slurm")
    shutil.copytree(REPO / "config", path / "config")
    shutil.copytree(REPO / ".test", path / ".test")
    for run in ("aef_c10d", "aef_limit"):  # more runs of the same recipe, trained later
        shutil.copy(path / "config/train/aef_segformer.yaml", path / f"config/train/{run}.yaml")
    result = snakemake(path, PROFILE, "--config", "runs=[aef_segformer,tessera_deeplab]")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return path


LOCAL_RULES = {"all", "regions_table", "train_config", "manifest", "summary", "curves",
               "data_report"}  # fmt: skip


def test_every_rule_of_the_demo_runs_as_a_slurm_job_or_group_but_bookkeeping(
    workdir: Path,
) -> None:
    log = next(workdir.glob("snakemake-*.log")).read_text()
    rules = set(re.findall(r"^\s*rule (\w+):", log, re.M))  # grouped jobs are indented
    assert {"demo_region", "shards", "gpu_check", "train", "evaluate", "predict"} <= rules
    assert set(re.findall(r"^\s*localrule (\w+):", log, re.M)) <= LOCAL_RULES
    # shards (labels aligned, then shards cut) of 4 (source, region) pairs, as many side by side
    # per job as the node has cores (2 here: 2 jobs; SLURM's node is this machine,
    # scripts/slurm/start.sh)
    per_job = min(4, local_node()["cores"])
    groups = re.findall(r"Group job (\w+)", log)
    assert groups == ["prep"] * math.ceil(4 / per_job)
    assert list((workdir / ".snakemake/slurm_logs").glob("group_prep*/**/*.log"))
    alone = rules - LOCAL_RULES - {"shards"}
    assert all(
        slurm_job_logs(workdir, rule)
        or list((workdir / ".snakemake/slurm_logs" / f"rule_{rule}").rglob("*.log"))
        for rule in alone
    )
    # sbatch calls: 2 demo regions, the prep groups, and per source (2) stats, then gpu_check,
    # and per run (2) train, evaluate, one map job, its area check
    submitted = re.findall(r"has been submitted with SLURM jobid", log)
    assert len(submitted) == 2 + len(groups) + 2 + 1 + 4 * 2, log[-3000:]
    fits = re.findall(r"cluster fit: group prep \((\d+) jobs of shards\): (\d+) cores, (\d+) MB",
                      log)  # fmt: skip
    assert fits and all(int(n) == per_job and int(c) == per_job for n, c, _ in fits), fits


def test_a_group_wider_than_the_node_is_refused_in_one_line_before_any_job(
    slurm, tmp_path: Path
) -> None:
    """The issue's run: a prep group of the 4 demo pairs side by side on a 2-core node, which
    SLURM would keep pending for ever (Reason=PartitionConfig)."""
    cores = local_node()["cores"]
    profile = yaml.safe_load((PROFILE / "config.v8+.yaml").read_text())
    profile["group-components"]["prep"] = cores + 1
    (tmp_path / "wide").mkdir()
    (tmp_path / "wide" / "config.v8+.yaml").write_text(yaml.safe_dump(profile))
    shutil.copytree(REPO / "config", tmp_path / "work" / "config")
    shutil.copytree(REPO / ".test", tmp_path / "work" / ".test")

    result = snakemake(tmp_path / "work", tmp_path / "wide", "--config",
                       "runs=[aef_segformer,tessera_deeplab]")  # fmt: skip

    out = result.stdout + result.stderr
    assert result.returncode != 0
    line = next(x for x in out.splitlines() if x.startswith("profile: group prep"))
    assert re.fullmatch(
        rf"profile: group prep \({cores + 1} jobs of shards\) asks for "
        rf"{cores + 1} cores, \d+ MB, \d+ min, more than a node of partition 'debug' has "
        rf"\({cores + 1} cores > {cores}\): SLURM would keep it pending for ever; set "
        rf"group-components: prep: {cores} \(or less\) in the profile",
        line,
    ), line
    assert "submitted with SLURM jobid" not in out
    assert not (tmp_path / "work" / ".snakemake" / "slurm_logs").exists()


def test_maps_are_one_job_of_two_processes_in_the_launchers_srun_step(workdir: Path) -> None:
    log = (workdir / "logs/predict/aef_segformer.log").read_text()
    assert "launch: srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=2" in log
    assert "torchrun --standalone --nnodes=1 --nproc_per_node=2" in log
    assert "rank 0 of 2: 1 of 2 regions" in log and "rank 1 of 2: 1 of 2 regions" in log
    maps = workdir / "results/maps/aef_segformer"
    assert sorted(p.name for p in maps.glob("*.tif")) == ["demo_a.tif", "demo_b.tif"]
    assert not (workdir / "results/maps/.partial").exists()


def test_training_is_a_two_rank_ddp_job_in_the_launchers_srun_step(workdir: Path) -> None:
    log = (workdir / "logs/train/aef_segformer.log").read_text()
    assert "launch: srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=2" in log
    assert "torchrun --standalone --nnodes=1 --nproc_per_node=2" in log
    records = rank_records(workdir / "results/runs/aef_segformer")
    assert [r["world"] for r in records] == [2, 2]
    assert not set(records[0]["shards"]) & set(records[1]["shards"])
    assert json.loads((workdir / "results/runs/aef_segformer/train.json").read_text())["world"] == 2


def test_gpu_check_ran_inside_a_job_step_and_saw_the_requested_cpus(workdir: Path) -> None:
    report = json.loads((workdir / "results/gpu_check.json").read_text())
    assert report["env"]["SLURM_STEP_ID"] == "0"  # the launcher's srun step, not the batch step
    assert report["gpus_expected"] == report["gpus_found"] == 0
    assert report["cpus_found"] >= report["cpus_expected"] == 2


def test_srun_per_node_form_meets_through_c10d_on_the_first_node(workdir: Path, tmp_path) -> None:
    profile = profile_with(tmp_path, "c10d", {"rendezvous": "c10d"})
    result = snakemake(workdir, profile, "results/runs/aef_c10d/train.json",
                       "--config", "runs=[aef_c10d]")  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    log = (workdir / "logs/train/aef_c10d.log").read_text()
    assert re.search(r"launch: srun .*--rdzv_backend=c10d --rdzv_endpoint=localhost:\d+", log)
    records = rank_records(workdir / "results/runs/aef_c10d")
    assert [r["world"] for r in records] == [2, 2]
    assert records[0]["digest"] == records[1]["digest"]


def test_a_training_signalled_as_at_its_time_limit_checkpoints_is_retried_and_resumes(
    workdir: Path,
) -> None:
    """At its time limit SLURM signals a training job's steps, not its batch shell (the
    profiles' ``--signal=USR1@N``, no ``B:``); ``scancel --signal=USR1`` delivers the same
    signal the same way. Sent once the first job trains (its second epoch is in the history),
    not at a time: no periodic time-limit check of slurmctld is raced, on a machine of any
    load. The stopped job exits 75, the profile's retry resubmits it, and it resumes."""
    overlay = workdir / ".test/limit.yaml"
    overlay.write_text(yaml.safe_dump({"train": {"epochs": LIMIT_EPOCHS,
                                                 "patience": LIMIT_EPOCHS}}))  # fmt: skip
    overlays = "train_overlays=[config/train/demo.yaml,.test/train.yaml,.test/limit.yaml]"
    cmd = snakemake_command(workdir, PROFILE, "results/runs/aef_limit/train.json",
                            "--config", "runs=[aef_limit]", overlays)  # fmt: skip
    run_dir = workdir / "results/runs/aef_limit"
    history = run_dir / "history.csv"
    with subprocess.Popen(cmd, cwd=workdir, env=venv_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as running:  # fmt: skip
        first_job = wait_for(lambda: slurm_job_logs(workdir, "train", "aef_limit"), RUN_LIMIT_S,
                             running, "the first training job started")[0].stem  # fmt: skip
        wait_for(lambda: history.exists() and len(history.read_text().splitlines()) > 2,
                 RUN_LIMIT_S, running, "two epochs were trained")  # fmt: skip
        subprocess.run(["scancel", "--signal=USR1", first_job], check=True)
        out, _ = running.communicate(timeout=RUN_LIMIT_S + 60)
    (workdir / "snakemake-limit.log").write_text(out)
    assert running.returncode == 0, out[-5000:]
    log = (workdir / "logs/train/aef_limit.log").read_text()
    assert len(slurm_job_logs(workdir, "train", "aef_limit")) >= 2, "not retried as a new job"
    # Snakemake drops the failed attempt's log before the retry; the ranks' stop records stay.
    stops = [json.loads((run_dir / f"ranks/rank{r}.stopped.json").read_text()) for r in (0, 1)]
    assert [stop["reason"] for stop in stops] == ["signal SIGUSR1"] * 2
    assert stops[0]["step"] == stops[1]["step"] and stops[0]["loader"] == stops[1]["loader"]
    epoch, batch = stops[0]["loader"]
    assert f"resumed from results/runs/aef_limit/last.pt at epoch {epoch}, batch {batch}" in log
    with open(history) as fh:
        rows = list(csv.DictReader(fh))
    epochs = [int(row["epoch"]) for row in rows]
    steps = [int(row["step"]) for row in rows]
    per_epoch = steps[0]
    assert epochs == list(range(1, LIMIT_EPOCHS + 1))
    assert steps == [per_epoch * e for e in epochs], "step counter not continuous across jobs"
    assert json.loads((run_dir / "train.json").read_text())["steps"] == per_epoch * LIMIT_EPOCHS


def test_a_training_with_a_bad_config_costs_one_allocation_and_its_retries_end_at_once(
    workdir: Path,
) -> None:
    run = yaml.safe_load((workdir / "config/train/aef_segformer.yaml").read_text())
    run.setdefault("train", {})["resume_from"] = "no_such_checkpoint.pt"  # fails in training
    (workdir / "config/train/aef_bad.yaml").write_text(yaml.safe_dump(run))

    # one retry shows what the profile's two would: it ends at once, starting nothing
    result = snakemake(workdir, PROFILE, "results/runs/aef_bad/train.json", "--retries", "1",
                       "--config", "runs=[aef_bad]")  # fmt: skip

    assert result.returncode != 0
    out = result.stdout + result.stderr
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid", out)
    assert len(submitted) == 2, out[-3000:]  # the first attempt and its retry
    # Snakemake drops a failed attempt's log before the retry: the retry repeats the reason
    # (torchrun reports a worker's exit 2 as 1)
    log = (workdir / "logs/train/aef_bad.log").read_text()
    assert re.search(r"attempt 2: attempt 1 of this job failed with exit code [12] at", log)
    assert "train.resume_from: expected an existing checkpoint" in log, log
    assert len(re.findall(r"^launch: ", log, re.M)) <= 1, log  # one attempt started anything


def test_a_failed_region_in_a_grouped_job_is_named_in_its_logs(workdir: Path) -> None:
    """A raster the regions check passes (its first pixel reads) that fails in the group."""
    demo = workdir / "resources/demo/demo_a"
    aef = corrupt_copy(demo / "aef.tif", workdir / "inputs/bad_region/aef.tif")
    table = workdir / "inputs/regions.tsv"
    table.write_text("region\tyear\taef\ttessera\tcdl\tsplit\n"
                     f"bad_region\t2024\t{aef}\t\t{demo / 'cdl.tif'}\tauto\n")  # fmt: skip

    blocks = workdir / ".test/blocks.yaml"  # blocks small enough for the 1.28 km region
    blocks.parent.mkdir(exist_ok=True)
    blocks.write_text("splits:\n  block_m: 320\n")
    # one attempt: the profile's retries would only fail the same way twice more
    result = snakemake(workdir, PROFILE, "results/shards/aef/bad_region/index.json",
                       "--retries", "0", "--config", "runs=[aef_segformer]", f"regions={table}",
                       configfiles=(str(blocks),))  # fmt: skip

    assert result.returncode != 0
    assert "Error in group prep" in result.stdout + result.stderr
    group_logs = sorted((workdir / ".snakemake/slurm_logs").glob("group_prep*/**/*.log"))
    failed = [p.read_text() for p in group_logs if "Error in rule shards" in p.read_text()]
    assert failed and "region=bad_region" in failed[-1], [str(p) for p in group_logs]
    log = (workdir / "logs/shards/aef/bad_region.log").read_text()  # its own log: why
    assert f"ERROR emb.prep.align_labels: {aef}: cannot read it" in log, log


@pytest.fixture
def two_nodes(slurm) -> None:
    """The local SLURM as two nodes of this machine (two slurmd, scripts/slurm/start.sh
    --nodes 2); back to one node afterwards, for the tests after this one."""
    cmd = ["timeout", "-k", "10", "300", str(REPO / "scripts/slurm/start.sh")]
    start = subprocess.run([*cmd, "--nodes", "2"], capture_output=True, text=True)
    assert start.returncode == 0, start.stdout[-3000:] + start.stderr[-3000:]
    yield
    subprocess.run(cmd, capture_output=True, text=True)


def test_training_on_two_nodes_runs_one_srun_task_per_node_meeting_through_c10d(
    two_nodes, workdir: Path, tmp_path: Path
) -> None:
    """``nodes: 2`` for gpu_check and train through the profile (2 processes each: the plugin
    refuses an ``mpi`` job of 1 task per node): srun starts one task on each node, the check
    runs on both, the two torchrun agents meet at the first node; rank 0 alone logs. In a copy
    of the finished demo: its data is made, the check (its node count changed) and a new run
    of the same recipe run on the two nodes."""
    profile = yaml.safe_load((PROFILE / "config.v8+.yaml").read_text())
    for rule in ("gpu_check", "train"):
        profile["set-resources"][rule] = {**profile["set-resources"][rule], "nodes": 2}
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "config.v8+.yaml").write_text(yaml.safe_dump(profile))
    work = tmp_path / "work"
    shutil.copytree(workdir, work, symlinks=True)
    shutil.copy(work / "config/train/aef_segformer.yaml", work / "config/train/aef_two.yaml")
    result = snakemake(work, tmp_path / "two", "results/gpu_check.json",
                       "results/runs/aef_two/train.json", "--config", "runs=[aef_two]")  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    out = result.stdout + result.stderr
    assert {"gpu_check", "train"} <= set(re.findall(r"^\s*rule (\w+):", out, re.M)), out[-3000:]
    log = (work / "logs/train/aef_two.log").read_text()
    assert "launch: srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in log
    assert re.search(r"--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=127\.0\.0\.1:\d+", log)
    run_dir = work / "results/runs/aef_two"
    records = [json.loads((run_dir / f"ranks/rank{r}.json").read_text()) for r in range(4)]
    assert [r["world"] for r in records] == [4] * 4
    assert len({r["digest"] for r in records}) == 1
    assert log.count("world size 4, batch") == 1  # rank 0's log, once for the job
    report = json.loads((work / "results/gpu_check.json").read_text())
    assert report["env"]["SLURM_STEP_ID"] == "0"
