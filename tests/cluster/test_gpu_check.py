"""gpu_check: a step that sees other GPUs (or fewer CPUs) than its rule asked for fails loudly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import venv_env

from emb.cluster.gpu_check import DeviceMismatch, check_devices


def test_matching_devices_pass_and_each_mismatch_is_named() -> None:
    check_devices(4, 4, 32, 64)
    with pytest.raises(DeviceMismatch, match="expected 2 GPU\\(s\\) per node, found 1"):
        check_devices(2, 1, 1, 1)  # the symptom of plugin issue #459
    with pytest.raises(DeviceMismatch, match="expected at least 16 CPU\\(s\\), found 8"):
        check_devices(0, 0, 16, 8)


def run_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "emb.cluster.gpu_check",
        "--out",
        str(tmp_path / "check.json"),
        *args,
    ]
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
