"""Stopping and resuming the real trainer under torchrun (2 ranks, gloo): SIGKILL at a random
step, SIGUSR1 to one rank, a time limit. Resumed runs must end bitwise equal to uninterrupted
ones."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import TinyDemo, venv_env
from training_runs import (
    assert_bitwise_equal,
    manifest_with_val,
    resolve_config,
    resumable_state,
    run_to_end,
    start,
    unstamped,
    wait_for_step,
    workers,
)

from emb.training import checkpoint_file
from emb.training.stop_request import EXIT_STOPPED

# drop_path draws from torch's RNG every step, EMA and the schedule carry state: a resume
# that lost any of them, or drew one random number more, would not end bitwise equal.
RESUMABLE = ("train.epochs=3", "model.drop_path=0.2", "ema.enabled=true", "ema.decay=0.9",
             "train.checkpoint_every_updates=1", "logging.log_every=1",
             "schedule.warmup_steps=3")  # fmt: skip


@pytest.fixture(scope="module")
def reference(tiny_demo: TinyDemo, tmp_path_factory) -> dict:
    """An uninterrupted 2-rank run: its final state and step count."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    config = resolve_config(tiny_demo, run_dir, *RESUMABLE)
    result = run_to_end(config)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    state = resumable_state(run_dir / "last.pt")
    return {"state": state, "steps": state["step"]}


def test_sigkill_at_a_random_step_then_resume_ends_bitwise_equal(
    tiny_demo: TinyDemo, reference: dict, tmp_path: Path
) -> None:
    total = reference["steps"]
    kill_at = random.Random().randint(2, total - 2)  # random on purpose; printed on failure
    config = resolve_config(tiny_demo, tmp_path / "run", *RESUMABLE)
    proc = start(config, tmp_path / "killed.log")
    try:
        wait_for_step(tmp_path / "killed.log", kill_at, proc)
        workers(proc, 2)[random.Random().choice([0, 1])].send_signal(signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        proc.kill()
    saved = checkpoint_file.load(tmp_path / "run" / "last.pt")["step"]
    assert 0 < saved < total, f"killed at step {kill_at}: last.pt is at step {saved}"
    resumed = run_to_end(config)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"resumed from {tmp_path / 'run' / 'last.pt'}" in resumed.stdout
    final = resumable_state(tmp_path / "run" / "last.pt")
    assert_bitwise_equal(final, reference["state"], f"killed at step {kill_at}")


def test_sigusr1_to_one_rank_stops_every_rank_at_the_same_step(
    tiny_demo: TinyDemo, reference: dict, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    config = resolve_config(tiny_demo, run_dir, *RESUMABLE)
    proc = start(config, tmp_path / "usr1.log")
    try:
        wait_for_step(tmp_path / "usr1.log", 2, proc)
        workers(proc, 2)[1].send_signal(signal.SIGUSR1)  # rank 1 only
        proc.wait(timeout=120)
    finally:
        proc.kill()
    log = (tmp_path / "usr1.log").read_text()
    assert f"exitcode  : {EXIT_STOPPED}" in log or f"exitcode: {EXIT_STOPPED}" in log, log[-3000:]
    stops = [json.loads((run_dir / "ranks" / f"rank{r}.stopped.json").read_text()) for r in (0, 1)]
    saved = checkpoint_file.load(run_dir / "last.pt")
    assert stops[0]["step"] == stops[1]["step"] == saved["step"] < reference["steps"]
    assert stops[0]["loader"] == stops[1]["loader"]
    assert "signal SIGUSR1" in stops[1]["reason"] and "another rank" in stops[0]["reason"]
    resumed = run_to_end(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_bitwise_equal(resumable_state(run_dir / "last.pt"), reference["state"], "after USR1")


def test_time_limit_stops_with_a_checkpoint_and_a_rerun_completes(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    endless = ("train.max_updates=100000", "logging.log_every=1", "train.patience=100000")
    config = resolve_config(
        tiny_demo, run_dir, *endless, "train.time_limit_s=6", "train.stop_margin_s=0"
    )
    cmd = ["python", "-m", "emb.training.train", "--config", str(config)]
    first = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == EXIT_STOPPED, first.stdout[-2000:] + first.stderr[-2000:]
    stopped_at = checkpoint_file.load(run_dir / "last.pt")["step"]
    assert f"stopping at step {stopped_at} (deadline in" in first.stdout
    assert 0 < stopped_at < 100000
    # The retry: same run, no time limit, a few more updates, still no early stopping (the
    # early-stopping count is resumed: a fast first run would otherwise stop the retry early).
    resolve_config(tiny_demo, run_dir, f"train.max_updates={stopped_at + 5}", *endless[1:])
    second = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"resumed from {run_dir / 'last.pt'}" in second.stdout
    logged = [int(line.split()[1]) for line in unstamped(first.stdout + second.stdout)
              if line.startswith("step ")]  # fmt: skip
    assert logged == list(range(1, stopped_at + 6))  # continuous: nothing lost, nothing twice
    assert json.loads((run_dir / "train.json").read_text())["steps"] == stopped_at + 5


def test_time_limit_stops_before_a_validation_that_would_run_past_it(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """A validation split ~300 times the training epoch: the end-of-epoch validation takes far
    longer than the 12 s limit. The stop must come before it, not after it (an overrun)."""
    manifest = manifest_with_val(tiny_demo, tmp_path / "long_val.json", [0, 1] * 1000)
    run_dir = tmp_path / "run"
    config = resolve_config(
        tiny_demo, run_dir, "train.max_updates=100000", "train.patience=100000",
        f"data.manifest={manifest}", "train.time_limit_s=12", "train.stop_margin_s=0",
    )  # fmt: skip
    cmd = ["python", "-m", "emb.training.train", "--config", str(config)]
    done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == EXIT_STOPPED, done.stdout[-2000:] + done.stderr[-2000:]
    reason = json.loads((run_dir / "ranks" / "rank0.stopped.json").read_text())["reason"]
    assert not (run_dir / "history.csv").exists(), reason  # no validation was started ...
    left = re.match(
        r"deadline in (-?\d+) s \((\d+) steps of ([\d.]+) s to the next check, "
        r"validation ([\d.]+) s", reason
    )  # fmt: skip
    assert left, reason
    left_s, steps, step_s, val_s = (float(g) for g in left.groups())
    assert 0 <= left_s < steps * step_s + val_s and val_s > steps * step_s, reason  # for want
    # of time: the validation (which alone outlasts the check interval) would not have fitted
