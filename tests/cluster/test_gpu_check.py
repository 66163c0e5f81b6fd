"""gpu_check: a step that sees other GPUs (or fewer CPUs) than its rule asked for fails loudly.

GPU machines are faked by replacing ``torch.cuda.device_count`` in the subprocess that runs the
real command line (CI has no GPU); Snakemake's own parser builds the resource settings."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, venv_env
from fake_gpus import fake_gpu_command
from snakemake.cli import parse_set_resources
from snakemake.resources import Resources
from snakemake.settings.types import ResourceSettings

from emb.cluster.gpu_check import DeviceMismatch, check_devices
from emb.workflow.stage_options import checked_shape, gpu_request


def test_matching_devices_pass_and_each_mismatch_is_named() -> None:
    check_devices(4, 4, 32, 64)
    with pytest.raises(DeviceMismatch, match="expected 2 GPU\\(s\\) per node, found 1"):
        check_devices(2, 1, 1, 1)  # the symptom of plugin issue #459
    check_devices(None, 3, 1, 1)  # auto: whatever the machine has
    with pytest.raises(DeviceMismatch, match="2 processes per node but 1 visible GPU"):
        check_devices(None, 1, 1, 1, processes=2)
    check_devices(None, 0, 1, 1, processes=2)  # CPU processes share the cores
    with pytest.raises(DeviceMismatch, match="expected at least 16 CPU\\(s\\), found 8"):
        check_devices(0, 0, 16, 8)


def run_check(tmp_path: Path, *args: str, gpus: int | None = None) -> subprocess.CompletedProcess:
    """The real gpu_check command line; ``gpus``: fake that many visible GPUs."""
    args = ("--out", str(tmp_path / "check.json"), *args)
    if gpus is None:
        cmd = [sys.executable, "-m", "emb.cluster.gpu_check", *args]
    else:
        cmd = fake_gpu_command(gpus, "emb.cluster.gpu_check", *args)
    return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=120)


def test_cpu_machine_asked_for_no_gpu_records_what_it_sees(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--gpus", "0", "--processes", "1", "--threads", "1")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["gpus_found"] == 0
    assert report["cpus_found"] == len(os.sched_getaffinity(0))


def test_cpu_machine_asked_for_gpus_fails_before_training(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--gpus", "4", "--processes", "4", "--threads", "1")
    assert result.returncode == 1
    assert "expected 4 GPU(s) per node, found 0" in result.stderr
    assert not (tmp_path / "check.json").exists()


def rule_gpus(*set_resources: str) -> list[str]:
    """gpu_check's GPU options as the rule computes them from Snakemake's resource settings."""
    settings = ResourceSettings(overwrite_resources=parse_set_resources(list(set_resources)))
    return shlex.split(gpu_request(settings))


def test_rule_default_on_a_one_gpu_machine_passes(tmp_path: Path) -> None:
    """The issue's first symptom: plain ``snakemake --cores N`` on a machine with one GPU."""
    options = rule_gpus()
    assert options == ["--gpus=auto"]
    result = run_check(tmp_path, *options, "--processes", "1", "--threads", "1", gpus=1)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "check.json").read_text())
    assert (report["gpus_expected"], report["gpus_found"]) == ("auto", 1)
    assert report["devices"] == ["fake GPU 0"]


def test_auto_refuses_more_processes_than_gpus(tmp_path: Path) -> None:
    result = run_check(tmp_path, "--gpus=auto", "--processes", "2", "--threads", "1", gpus=1)
    assert result.returncode == 1
    assert "2 processes per node but 1 visible GPU(s)" in result.stderr
    assert "cuda:1" in result.stderr


def test_a_profile_setting_stays_strict_and_is_named(tmp_path: Path) -> None:
    """A cluster profile sets the number: a node showing another count fails, naming the
    setting and where a number comes from (never a profile the user did not name)."""
    options = rule_gpus("gpu_check:gpus_per_node=2")
    assert options[0] == "--gpus=2"
    result = run_check(tmp_path, *options, "--processes", "2", "--threads", "1", gpus=1)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert "expected 2 GPU(s) per node, found 1" in line
    assert "gpu_check:gpus_per_node, set by the profile or --set-resources" in line
    assert not (tmp_path / "check.json").exists()


def test_a_zero_setting_stays_strict_on_a_gpu_node(tmp_path: Path) -> None:
    """slurm-localhost's gpus_per_node: 0 is a number the profile set, not auto."""
    options = rule_gpus("gpu_check:gpus_per_node=0")
    result = run_check(tmp_path, *options, "--processes", "1", "--threads", "1", gpus=1)
    assert result.returncode == 1
    assert "expected 0 GPU(s) per node, found 1" in result.stderr
    assert "the profile or --set-resources" in result.stderr


def test_a_non_integer_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="gpu_check:gpus_per_node: expected an integer >= 0"):
        rule_gpus("gpu_check:gpus_per_node=auto")


def rule_check_args(tmp_path: Path, *extra: str) -> list[str]:
    """gpu_check's arguments in the rule's shell command, as ``snakemake -n -p`` prints it."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
           "-n", "-p", "--cores", "2", "results/gpu_check.json", *extra]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=tmp_path, env=venv_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shell = next(line for line in done.stdout.splitlines() if "emb.cluster.gpu_check" in line)
    words = shlex.split(shell.split(">")[0])
    return words[words.index("emb.cluster.gpu_check") + 1 : -1]  # less --out=


def test_the_rule_expects_the_machines_gpus_unless_a_number_is_set(tmp_path: Path) -> None:
    """Plain ``snakemake`` (the rule's default resources) passes on a one-GPU machine; a number
    set with --set-resources (as a profile sets it) is checked strictly and named."""
    default = rule_check_args(tmp_path / "default")
    assert default[0] == "--gpus=auto"
    assert run_check(tmp_path, *default, gpus=1).returncode == 0
    strict = rule_check_args(tmp_path / "set", "--set-resources", "gpu_check:gpus_per_node=2")
    result = run_check(tmp_path, *strict, gpus=1)
    assert result.returncode == 1
    assert "expected 2 GPU(s) per node, found 1" in result.stderr
    assert "set by the profile or --set-resources" in result.stderr


def test_the_checked_shape_comes_from_the_rules_resources_as_set() -> None:
    resources = Resources.from_mapping({"nodes": 1, "tasks_per_node": 3, "cpus_per_task": 4})
    assert checked_shape(resources) == "--nodes=1 --processes=3 --threads=4"
    given = parse_set_resources(["gpu_check:tasks_per_node=2", "gpu_check:nodes=2"])
    resources.update(given["gpu_check"])  # as Snakemake applies --set-resources to the rule
    assert checked_shape(resources) == "--nodes=2 --processes=2 --threads=4"
    with pytest.raises(ValueError, match=r"gpu_check:tasks_per_node: expected an integer >= 1"):
        checked_shape(Resources.from_mapping({"tasks_per_node": "2 if attempt else 1"}))


def gpu_check_job(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    # the target before args: --configfile takes every word after it
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
           "--cores", "2", "results/gpu_check.json", *args]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=workdir, env=venv_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_changed_count_of_nodes_processes_or_threads_reruns_the_check(tmp_path: Path) -> None:
    """Issue 41, item 3: launch.nproc_per_node 1 -> 2 left the check of 1 process in place
    (the count reached the rule through resources only). Each count now reruns it."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    two = tmp_path / "two.yaml"
    two.write_text("launch:\n  nproc_per_node: 2\n  threads: 1\n")
    gpu_check_job(tmp_path)
    report = tmp_path / "results/gpu_check.json"
    assert json.loads(report.read_text())["processes"] == 1
    assert "Nothing to be done" in gpu_check_job(tmp_path, "-n").stdout  # a stable param
    for change in (
        ("--configfile", "config/config.yaml", str(two)),
        ("--set-resources", "gpu_check:tasks_per_node=3"),
        ("--set-resources", "gpu_check:cpus_per_task=2"),
        ("--set-resources", "gpu_check:nodes=2"),
    ):
        plan = gpu_check_job(tmp_path, "-n", *change).stdout
        assert "rule gpu_check:" in plan and "Params have changed" in plan, (change, plan)
    gpu_check_job(tmp_path, "--configfile", "config/config.yaml", str(two))
    checked = json.loads(report.read_text())
    assert (checked["processes"], checked["threads"], checked["cpus_expected"]) == (2, 1, 2)
    plan = gpu_check_job(tmp_path, "-n", "--configfile", "config/config.yaml", str(two))
    assert "Nothing to be done" in plan.stdout
