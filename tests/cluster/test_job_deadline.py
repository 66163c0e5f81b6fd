"""The job's deadline: the launcher asks SLURM for the job's end once and hands it to training
in ``SLURM_JOB_END_TIME``; training takes it from there and never asks SLURM itself (issue 43:
imports one way, training below cluster)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import REPO

from emb.cluster.launch import parse_args, prepare
from emb.training.run_config import TrainConfig
from emb.training.train import job_deadline
from emb.training.train_config import resolve


def squeue_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, end: str) -> Path:
    """A ``squeue`` that answers ``end`` for ``-o %e`` and records each call."""
    calls = tmp_path / "squeue.calls"
    tool = tmp_path / "bin" / "squeue"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho {end}\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    return calls


def config(time_limit_s: float | None) -> TrainConfig:
    files = [REPO / "config/train/defaults.yaml", REPO / "config/train/aef_segformer.yaml"]
    resolved = resolve(files, ["data.manifest=m.json"], REPO / "workflow/schemas/train.schema.yaml")
    return TrainConfig.from_dict(resolved).with_value("train", "time_limit_s", time_limit_s)


def test_the_launcher_hands_slurms_end_time_to_training(tmp_path, monkeypatch) -> None:
    calls = squeue_on_path(tmp_path, monkeypatch, "2031-05-04T03:02:01")
    args = parse_args(["--", "emb.training.train", "--config", "c.yaml"])
    _, _, env = prepare(args, {"SLURM_JOB_ID": "4242", "PATH": os.environ["PATH"]})
    end = int(time.mktime(time.strptime("2031-05-04T03:02:01", "%Y-%m-%dT%H:%M:%S")))
    assert env["SLURM_JOB_END_TIME"] == str(end)
    assert "-j 4242" in calls.read_text()
    assert job_deadline(config(None), env, started=0.0) == end
    assert job_deadline(config(60.0), env, started=100.0) == 160.0  # the earlier one wins


def test_training_never_asks_slurm(tmp_path, monkeypatch) -> None:
    calls = squeue_on_path(tmp_path, monkeypatch, "2031-05-04T03:02:01")
    inside_a_job = {"SLURM_JOB_ID": "4242"}  # no SLURM_JOB_END_TIME: not launched by emb
    assert job_deadline(config(None), inside_a_job, started=0.0) is None
    assert job_deadline(config(30.0), inside_a_job, started=5.0) == 35.0
    assert not calls.exists(), "training ran squeue; the launcher passes the deadline"
