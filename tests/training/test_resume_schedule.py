"""A resume that changes the run's length keeps the learning rate continuous: the remaining
cosine is re-planned from the LR at the resume step (never a jump to the LR the new length
gives there); the loader keys that decide the batch order are resume keys."""

from __future__ import annotations

import csv
import math
import signal
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TinyDemo
from training_runs import resolve_config, run_to_end, start, wait_for_step, workers

from emb.training import checkpoint_file
from emb.training.checkpoint_file import CheckpointError, check_resumable
from emb.training.schedule import lr_factor, replan, warmup_cosine

BASE, FLOOR, WARMUP = 1e-3, 1e-5, 2


def scheduler(total: int) -> torch.optim.lr_scheduler.LambdaLR:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=BASE)
    return warmup_cosine(opt, WARMUP, total, BASE, FLOOR, 0)


def stepped(total: int, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    sched = scheduler(total)
    for _ in range(steps):
        sched.optimizer.step()
        sched.step()
    return sched


def resumed(state: dict, opt_state: dict, total: int, step: int, legacy: bool = False):
    sched = scheduler(total)
    sched.optimizer.load_state_dict(opt_state)
    sched.load_state_dict(state)
    return sched, replan(sched, step, total, legacy)


@pytest.mark.parametrize("new_total", [40, 12, 20])
def test_a_longer_or_shorter_run_continues_from_the_current_lr(new_total: int) -> None:
    old = stepped(20, 10)
    before = old.get_last_lr()[0]
    sched, moved = resumed(old.state_dict(), old.optimizer.state_dict(), new_total, 10)
    assert sched.get_last_lr()[0] == before
    lrs = [before]
    for _ in range(new_total - 10):
        sched.optimizer.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    assert lrs == sorted(lrs, reverse=True), "the LR rose after the resume"
    assert lrs[-1] == pytest.approx(FLOOR)  # the re-planned cosine ends at min_lr
    if new_total == 20:
        assert moved is None  # same length: nothing re-planned, bit for bit the old schedule
        assert lrs == [BASE * lr_factor(s, WARMUP, 20, FLOOR / BASE, 0) for s in range(10, 21)]
    else:
        kept, jump = moved
        assert kept == pytest.approx(before) and not math.isclose(jump, before)


def test_the_replanned_schedule_is_saved_and_a_second_resume_continues_it() -> None:
    old = stepped(20, 10)
    sched, _ = resumed(old.state_dict(), old.optimizer.state_dict(), 40, 10)
    for _ in range(5):
        sched.optimizer.step()
        sched.step()
    again, moved = resumed(sched.state_dict(), sched.optimizer.state_dict(), 40, 15)
    assert moved is None
    for _ in range(10):
        sched.optimizer.step(), sched.step()
        again.optimizer.step(), again.step()
        assert again.get_last_lr() == sched.get_last_lr()


def test_a_checkpoint_without_a_saved_schedule_continues_from_its_optimizer_lr() -> None:
    old = stepped(20, 10)
    state = old.state_dict()
    state["lr_lambdas"] = [None]  # as written when the schedule was a plain lambda
    sched, moved = resumed(state, old.optimizer.state_dict(), 40, 10, legacy=True)
    assert moved is not None and sched.get_last_lr()[0] == pytest.approx(old.get_last_lr()[0])
    sched.optimizer.step()
    sched.step()
    assert sched.get_last_lr()[0] < old.get_last_lr()[0]


@pytest.mark.parametrize("key", ["num_workers", "shuffle_buffer"])
def test_loader_keys_that_order_the_batches_are_resume_keys(key: str) -> None:
    config = {"model": {"arch": "segformer"}, "train": {"num_workers": 2, "shuffle_buffer": 8}}
    changed = {**config, "train": {**config["train"], key: 3}}
    state = {"config": config, "global_batch": 8, "provenance": {"precision": "fp32"}}
    with pytest.raises(CheckpointError, match=rf"train\.{key}: checkpoint \d+, config 3"):
        check_resumable(state, changed, 8, "fp32", Path("last.pt"))
    check_resumable(state, config, 8, "fp32", Path("last.pt"))  # unchanged: resumable


def history(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "history.csv") as fh:
        return {int(row["step"]): float(row["lr"]) for row in csv.DictReader(fh)}


def test_two_ranks_resumed_with_a_longer_run_log_a_continuous_lr(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """torchrun, 2 ranks (gloo): stopped by SIGUSR1 in a 12-step run, resumed as 30 steps.
    history.csv (a validation after every step) holds the LR after each step."""
    run_dir = tmp_path / "run"
    common = ("train.val_every_updates=1", "logging.log_every=1", "train.patience=1000",
              f"schedule.warmup_steps={WARMUP}", "schedule.min_lr=1.0e-6")  # fmt: skip
    config = resolve_config(tiny_demo, run_dir, "train.max_updates=12", *common)
    proc = start(config, tmp_path / "first.log")
    try:
        wait_for_step(tmp_path / "first.log", 5, proc)
        workers(proc, 2)[1].send_signal(signal.SIGUSR1)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    stopped = checkpoint_file.load(run_dir / "last.pt")["step"]
    assert WARMUP < stopped < 11, (tmp_path / "first.log").read_text()[-2000:]
    first = history(run_dir)
    resolve_config(tiny_demo, run_dir, "train.max_updates=30", *common)
    result = run_to_end(config)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"re-planned from the current lr {first[stopped]:.3e} at step {stopped}" in (
        result.stdout
    )
    lrs = history(run_dir)
    assert sorted(lrs) == list(range(1, 31))
    assert lrs[stopped] == first[stopped]  # rows before the stop are kept
    after = [lrs[s] for s in range(WARMUP, 31)]
    assert after == sorted(after, reverse=True), f"LR jumped at the resume (step {stopped})"
    base = float(yaml.safe_load(config.read_text())["optimizer"]["lr"])  # lr_scaling none
    anchor = (stopped, first[stopped] / base)
    expected = [base * lr_factor(s, WARMUP, 30, 1e-6 / base, 0, anchor) for s in range(stopped, 31)]
    assert [lrs[s] for s in range(stopped, 31)] == pytest.approx(expected, rel=1e-9)
