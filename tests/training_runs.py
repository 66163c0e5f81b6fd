"""Helpers for tests that run the real trainer: resolve a tiny config, launch torchrun, find,
signal or kill one rank, and compare checkpoints bitwise."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import REPO, TinyDemo, venv_env

from emb.models.runtime import CPU_HOST, Runtime
from emb.training import checkpoint_file
from emb.training.loop import Stopped, run
from emb.training.run_config import TrainConfig, load
from emb.training.stop_request import StopRequest
from emb.training.train_config import main as resolve_config_main

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "  # what starts each line of the run log


def unstamped(text: str) -> list[str]:
    """The run log's lines without their time stamps."""
    return [re.sub(rf"^{STAMP}", "", line) for line in text.splitlines()]


def resolve_config(
    demo: TinyDemo, run_dir: Path, *overrides: str, arch: str = "segformer", source: str = "aef"
) -> Path:
    """The standard run file + demo and test overlays, pointed at the tiny demo's shards."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "config.yaml"
    sets = [
        f"data.manifest={demo.manifests[source]}",
        f"data.classes={REPO / 'config/classes.csv'}",
        f"data.stats_dir={demo.root / 'stats' / source}",
        *overrides,
    ]
    resolve_config_main([
        str(REPO / "config/train/defaults.yaml"), str(REPO / f"config/train/{source}_{arch}.yaml"),
        str(REPO / "config/train/demo.yaml"), str(REPO / ".test/train.yaml"),
        "--schema", str(REPO / "workflow/schemas/train.schema.yaml"), "--out", str(config),
        *[arg for s in sets for arg in ("--set", s)],
    ])  # fmt: skip
    return config


def cpu_runtime(cfg: TrainConfig) -> Runtime:
    """The runtime a training process on a CPU resolves for ``cfg`` (as emb.training.train)."""
    return Runtime.resolve(cfg.train, cfg.model.arch, CPU_HOST, training=True)


def train_here(config: Path, stop: StopRequest | None = None) -> dict:
    """Train ``config`` in this process (world size 1); returns the ``train.json`` summary."""
    cfg = load(config)
    return run(cfg, config.parent, 0, 1, cpu_runtime(cfg), stop)


def interrupt(config: Path) -> int:
    """Start ``config`` in this process and stop it after its first step as SIGUSR1 would:
    an interrupted run (``last.pt`` written, not finished). Returns the step it stopped at."""
    stop = StopRequest(check_every=1)  # at the first step boundary
    stop.signal = signal.SIGUSR1
    with pytest.raises(Stopped):
        train_here(config, stop)
    return checkpoint_file.load(config.parent / "last.pt")["step"]


def manifest_with_val(demo: TinyDemo, out: Path, shards: list[int], source: str = "aef") -> Path:
    """The tiny demo's manifest with its validation split made of the val shards at positions
    ``shards`` (repeats allowed): one shard for two ranks, or a validation longer than an
    epoch of training."""
    manifest = demo.manifest(source)
    val = manifest["splits"]["val"]
    picked = {key: [val[key][i] for i in shards] for key in ("shards", "shard_samples",
                                                              "shard_keys")}  # fmt: skip
    val.update(picked, samples=sum(picked["shard_samples"]), tiles=sum(picked["shard_samples"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest))
    return out


def torchrun(config: Path, nproc: int = 2) -> list[str]:
    return ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "-m", "emb.training.train",
            "--config", str(config)]  # fmt: skip


def run_to_end(config: Path, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        torchrun(config, nproc), env=venv_env(), capture_output=True, text=True, timeout=timeout
    )
    return result


def start(config: Path, log: Path, nproc: int = 2) -> subprocess.Popen:
    with open(log, "w") as fh:
        return subprocess.Popen(torchrun(config, nproc), env=venv_env(), stdout=fh, stderr=fh)


def wait_for_step(log: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Block until rank 0 has logged optimizer step ``step`` (needs logging.log_every=1)."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(rf"^{STAMP}step {step} ", re.M)
    while time.monotonic() < deadline:
        if pattern.search(log.read_text()):
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended before step {step}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout} s:\n{log.read_text()[-3000:]}")


def workers(
    proc: subprocess.Popen, expected: int, timeout: float = 60
) -> dict[int, psutil.Process]:
    """{rank: process} of torchrun's training workers (rank from their environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "emb.training.train" in " ".join(child.cmdline()):
                    found[int(child.environ()["RANK"])] = child
            except (psutil.Error, KeyError):
                continue
        if len(found) == expected:
            return found
        time.sleep(0.1)
    raise AssertionError(f"did not find {expected} training workers of torchrun {proc.pid}")


def resumable_state(path: Path) -> dict:
    """The parts of a checkpoint that a resumed run must reproduce bitwise."""
    state = checkpoint_file.load(path)
    return {k: state[k] for k in ("model", "optimizer", "ema", "scheduler", "step", "loader")}


def assert_bitwise_equal(a, b, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: tensors differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys differ"
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
