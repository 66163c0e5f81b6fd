"""A disk that fills up during a checkpoint save (a real tmpfs, a real ENOSPC): the previous
checkpoint stays byte-identical and the job exits non-zero saying the disk is full."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TinyDemo
from fault_runs import run, small_tmpfs, tree_hashes, worker_exit_codes
from training_runs import resolve_config
from trials import pytest_generate_tests  # noqa: F401 - parametrizes `trial`

from emb.training import checkpoint_file
from emb.training.train import EXIT_DISK_FULL

pytestmark = pytest.mark.reliability

QUIET = ("train.checkpoint_every_updates=1", "train.val_every_updates=1000", "logging.log_every=1")


@pytest.fixture
def small_disk(tmp_path: Path):
    with small_tmpfs(tmp_path / "disk", "64m") as disk:
        yield disk


def fill(folder: Path, leave: int) -> None:
    """Allocate a file that leaves ``leave`` bytes free on ``folder``'s file system."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with open(folder / "filler", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, free - leave)


@pytest.mark.check("disk_full")
def test_disk_full_during_a_save_keeps_the_previous_checkpoint_and_says_so(
    tiny_demo: TinyDemo, small_disk: Path, trial: int
) -> None:
    run_dir = small_disk / f"run{trial}"
    first = run(resolve_config(tiny_demo, run_dir, *QUIET, "train.max_updates=2"))
    assert first.returncode == 0, first.stderr[-3000:]
    resume = f"train.resume_from={run_dir / 'last.pt'}"  # continue the finished short run
    resolve_config(tiny_demo, run_dir, *QUIET, "train.max_updates=6", resume)  # resubmitted
    before = tree_hashes(run_dir)
    fill(small_disk, leave=(run_dir / "last.pt").stat().st_size // 2)  # < one checkpoint
    second = run(run_dir / "config.yaml")
    output = second.stdout + second.stderr
    assert second.returncode != 0, output[-3000:]
    said = f"ERROR emb.training.train: disk full: cannot write {run_dir / 'last.pt'}"
    assert said in output, output[-3000:]
    assert worker_exit_codes(output).get(0) == EXIT_DISK_FULL, output[-3000:]
    after = tree_hashes(run_dir)
    assert {k: after.get(k) for k in before} == before  # nothing written before was changed
    assert checkpoint_file.load(run_dir / "last.pt")["step"] == 2
    assert not list(run_dir.glob(".*.tmp-*")), "a temporary file was left on the full disk"
