"""Crash and stop trials under torchrun (2 ranks, gloo): SIGKILL of one rank at a random step
then resume, and SIGUSR1/SIGTERM to one rank. Each trial draws its own step, rank and signal
and prints them when it fails."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest
from conftest import TinyDemo
from fault_runs import launch, run, worker_exit_codes
from training_runs import (
    assert_bitwise_equal,
    resolve_config,
    resumable_state,
    wait_for_step,
    workers,
)
from trials import pytest_generate_tests  # noqa: F401 - parametrizes `trial`

from emb.training import checkpoint_file
from emb.training.stop_request import EXIT_STOPPED

pytestmark = pytest.mark.reliability

# drop_path draws from torch's RNG every step, EMA and the schedule carry state, the loader
# shuffles: a resume that lost any of them, or drew one random number more, would not end
# bitwise equal or would train other keys.
RESUMABLE = ("train.epochs=3", "model.drop_path=0.2", "ema.enabled=true", "ema.decay=0.9",
             "train.checkpoint_every_updates=1", "logging.log_every=1",
             "schedule.warmup_steps=3", "logging.record_keys=true",
             "train.collective_timeout_s=30")  # fmt: skip
EXIT_BOUND_S = 90  # a stop must end the job this soon after the signal (collectives: 30 s)


def read_keys(path: Path) -> list[tuple[int, int, list[str]]]:
    """``keys/rank{r}.tsv`` as (epoch, batch, keys) rows."""
    rows = []
    for line in Path(path).read_text().splitlines():
        epoch, batch, keys = line.split("\t")
        rows.append((int(epoch), int(batch), keys.split(",")))
    return rows


def keys_of(run_dir: Path) -> dict[int, list]:
    return {r: read_keys(run_dir / "keys" / f"rank{r}.tsv") for r in (0, 1)}


@pytest.fixture(scope="module")
def reference(tiny_demo: TinyDemo, tmp_path_factory) -> dict:
    """An uninterrupted 2-rank run: final state, step count and sample keys per rank."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = run(resolve_config(tiny_demo, run_dir, *RESUMABLE))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    state = resumable_state(run_dir / "last.pt")
    keys = keys_of(run_dir)
    assert len(keys[0]) == len(keys[1]) > 0 and keys[0] != keys[1]
    return {"state": state, "steps": state["step"], "keys": keys}


@pytest.mark.check("sigkill_resume")
def test_sigkill_of_one_rank_then_resume_ends_bitwise_equal_on_the_same_keys(
    tiny_demo: TinyDemo, reference: dict, tmp_path: Path, trial: int
) -> None:
    rng = random.Random()
    total = reference["steps"]
    for attempt in range(3):  # a kill that lands after the last step proves nothing: redraw
        kill_at, rank, extra = rng.randint(2, total - 3), rng.choice([0, 1]), rng.uniform(0, 0.2)
        where = f"trial {trial}: SIGKILL rank {rank} at step {kill_at} + {extra:.2f} s"
        run_dir = tmp_path / f"attempt{attempt}" / "run"
        config = resolve_config(tiny_demo, run_dir, *RESUMABLE)
        log = run_dir.parent / "killed.log"
        proc = launch(config, log)
        try:
            wait_for_step(log, kill_at, proc)
            time.sleep(extra)
            workers(proc, 2)[rank].send_signal(signal.SIGKILL)
            assert proc.wait(timeout=120) != 0, where
        finally:
            proc.kill()
        saved = checkpoint_file.load(run_dir / "last.pt")["step"]
        if saved < total:
            break
    assert 0 < saved < total, f"{where}: last.pt is at step {saved} of {total}"
    resumed = run(config)
    assert resumed.returncode == 0, where + resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"resumed from {run_dir / 'last.pt'}" in resumed.stdout, where
    assert_bitwise_equal(resumable_state(run_dir / "last.pt"), reference["state"], where)
    assert keys_of(run_dir) == reference["keys"], f"{where}: other sample keys were trained"


@pytest.mark.check("stop_signal")
def test_stop_signal_to_one_rank_saves_every_rank_at_one_step_and_exits_75(
    tiny_demo: TinyDemo, reference: dict, tmp_path: Path, trial: int
) -> None:
    rng = random.Random()
    sig = (signal.SIGUSR1, signal.SIGTERM)[trial % 2]  # both kinds, whatever the count
    rank, at = rng.choice([0, 1]), rng.randint(1, reference["steps"] - 3)
    where = f"trial {trial}: {sig.name} to rank {rank} at step {at}"
    run_dir = tmp_path / "run"
    proc = launch(resolve_config(tiny_demo, run_dir, *RESUMABLE), tmp_path / "stop.log")
    try:
        wait_for_step(tmp_path / "stop.log", at, proc)
        workers(proc, 2)[rank].send_signal(sig)
        sent = time.monotonic()
        proc.wait(timeout=EXIT_BOUND_S)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    log = (tmp_path / "stop.log").read_text()
    assert worker_exit_codes(log) == {0: EXIT_STOPPED, 1: EXIT_STOPPED}, f"{where}\n{log[-3000:]}"
    assert took < EXIT_BOUND_S, f"{where}: took {took:.1f} s"
    stops = [json.loads((run_dir / "ranks" / f"rank{r}.stopped.json").read_text()) for r in (0, 1)]
    saved = checkpoint_file.load(run_dir / "last.pt")
    assert stops[0]["step"] == stops[1]["step"] == saved["step"], where
    assert (
        stops[0]["loader"]
        == stops[1]["loader"]
        == [saved["loader"]["epoch"], saved["loader"]["batch"]]
    )
    assert f"signal {sig.name}" in stops[rank]["reason"], where
    assert "another rank" in stops[1 - rank]["reason"], where
