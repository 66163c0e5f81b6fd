"""SIGKILL while a checkpoint is being written (the writer slowed on purpose by
``fault_launcher.py``): the checkpoint under the final name always loads with
``weights_only=True`` and matches its recorded sha256, and the next start removes what the
killed write left behind.

The trials form a chain in one run folder: each launch resumes from what the previous kill
left, checks that its leftovers were removed, trains and is killed at a random moment of its
j-th save (the data, the checksum sidecar, or around the rename). One process per launch: the
property is the writer's, and rank 0 alone writes checkpoints.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import TinyDemo, wait_for
from fault_runs import launch, run
from training_runs import resolve_config
from trials import pytest_generate_tests, trials  # noqa: F401 - parametrizes `trial`

from emb.provenance import digest_file
from emb.training import checkpoint_file

pytestmark = pytest.mark.reliability

RATE = 4e6  # bytes/s while writing a checkpoint: the ~1.5 MB of this model take ~0.4 s
ENDLESS = (
    "train.max_updates=100000",
    "train.val_every_updates=100000",
    "train.checkpoint_every_updates=1",
    "logging.log_every=1",
    "ema.enabled=true",
)


@pytest.fixture(scope="module")
def chain(tiny_demo: TinyDemo, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("kill_during_save") / "run"
    config = resolve_config(tiny_demo, run_dir, *ENDLESS)
    return {"demo": tiny_demo, "run_dir": run_dir, "config": config, "leftovers": [], "step": 0}


def temporary_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob(".*.tmp-*"))


def check_latest(last: Path, where: str) -> int:
    """last.pt loads with weights_only=True and matches a recorded sha256; returns its step."""
    assert last.exists(), f"{where}: no last.pt"
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert isinstance(state, dict) and "model" in state, where
    recorded = checkpoint_file.recorded_checksums(last)
    assert recorded, f"{where}: no checksum recorded in {checkpoint_file.checksum_path(last)}"
    assert digest_file(last) in recorded, f"{where}: sha256 not recorded"
    return checkpoint_file.load(last)["step"]  # load() verifies the checksum itself, too


@pytest.mark.check("kill_during_save")
def test_sigkill_during_a_checkpoint_write_leaves_a_loadable_verified_checkpoint(
    chain: dict, tmp_path: Path, trial: int
) -> None:
    rng = random.Random()
    run_dir, last = chain["run_dir"], chain["run_dir"] / "last.pt"
    first = not last.exists()
    save = rng.randint(2 if first else 1, 3)  # the first launch needs a checkpoint to keep
    size = last.stat().st_size if last.exists() else 1.5e6
    delay = rng.uniform(0, size / RATE + 0.3)  # data, sidecar pause, rename, sidecar pause
    where = f"trial {trial}: SIGKILL {delay:.2f} s into save {save} of this launch"
    log = tmp_path / "launch.log"
    proc = launch(chain["config"], log, nproc=1, fault=f"slow_write:{RATE}")
    try:
        if not first:  # this start removed what the last kill left, before it resumed
            wait_for(lambda: "resumed from" in log.read_text(), 240, proc, "the resume")
            text = log.read_text()
            for leftover in chain["leftovers"]:
                assert not leftover.exists(), f"{where}: {leftover.name} was not removed"
                assert f"removed {leftover.name}" in text, f"{where}: removal not logged"
        tmp = run_dir / f".last.pt.tmp-{proc.pid}"
        for _ in range(save):
            wait_for(lambda: not tmp.exists(), 60, proc, "the end of a save")  # noqa: B023
            wait_for(tmp.exists, 240, proc, f"save {save}")
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"{where}: ended by itself\n{log.read_text()}"
    step = check_latest(last, where)
    assert step >= chain["step"], f"{where}: last.pt went back from {chain['step']} to {step}"
    chain["step"], chain["leftovers"] = step, temporary_files(run_dir)
    if trial == trials("kill_during_save") - 1:  # the chain's last trial: one clean start more
        config = resolve_config(chain["demo"], run_dir, *ENDLESS, f"train.max_updates={step}")
        result = run(config, nproc=1)  # resumes, validates, saves, exits 0
        assert result.returncode == 0, f"{where}: final start\n{result.stderr[-3000:]}"
        for leftover in chain["leftovers"]:
            assert f"removed {leftover.name}" in result.stdout, f"{where}: {leftover.name}"
        assert temporary_files(run_dir) == [], f"{where}: {temporary_files(run_dir)}"
        assert check_latest(last, where) == step
