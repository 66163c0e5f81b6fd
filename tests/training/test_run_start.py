"""Where a run starts (emb.training.run_start): a rerun of a finished run trains from scratch, an
interrupted run resumes only under the same math, ``train.resume_from`` picks the checkpoint.
Runs are trained in this process (world size 1)."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
from conftest import TinyDemo
from training_runs import (
    assert_bitwise_equal,
    interrupt,
    resolve_config,
    resumable_state,
    train_here,
)

from emb.training import checkpoint_file
from emb.training.checkpoint_file import CheckpointError
from emb.training.run_config import ConfigError
from emb.training.stop_request import StopRequest
from emb.training.train import train


def history(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "history.csv") as fh:
        return list(csv.DictReader(fh))


def test_a_rerun_of_a_finished_run_trains_from_scratch_keeping_the_old_run_aside(
    tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    run_dir = tmp_path / "run"
    config = resolve_config(tiny_demo, run_dir, "train.epochs=2")
    first = train_here(config)
    old = {name: (run_dir / name).read_bytes() for name in ("last.pt", "best.pt", "history.csv")}
    assert checkpoint_file.load(run_dir / "last.pt")["finished"]
    capsys.readouterr()
    second = train_here(config)  # what `snakemake --forcerun train` runs: the same job again
    out = capsys.readouterr().out
    assert f"{run_dir / 'last.pt'} is a finished run: starting over" in out
    assert "resumed from" not in out
    assert [int(row["epoch"]) for row in history(run_dir)] == [1, 2]  # no row twice
    assert second["steps"] == first["steps"]
    # trained again from the seed, so bitwise the run it replaces; that one is kept aside
    assert_bitwise_equal(
        checkpoint_file.load(run_dir / "last.pt")["model"],
        checkpoint_file.load(next((run_dir / "previous").iterdir()) / "last.pt")["model"],
    )
    (aside,) = (run_dir / "previous").iterdir()
    assert {name: (aside / name).read_bytes() for name in old} == old


def test_an_interrupted_run_resumes_only_when_its_math_is_unchanged(
    tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    run_dir = tmp_path / "run"
    stopped_at = interrupt(resolve_config(tiny_demo, run_dir, "train.epochs=2"))
    saved = (run_dir / "last.pt").read_bytes()
    changed = resolve_config(
        tiny_demo, run_dir, "train.epochs=2", "optimizer.lr=0.002", "loss.label_smoothing=0.1"
    )
    with pytest.raises(CheckpointError) as err:
        train_here(changed)
    message = str(err.value)
    assert f"{run_dir / 'last.pt'}: cannot resume" in message
    assert "optimizer.lr: checkpoint 0.001, config 0.002" in message
    assert "loss.label_smoothing: checkpoint 0.05, config 0.1" in message
    assert (run_dir / "last.pt").read_bytes() == saved
    # run length, patience and logging may change: the run resumes where it stopped
    longer = resolve_config(
        tiny_demo, run_dir, "train.epochs=3", "train.patience=50", "logging.log_every=1"
    )
    capsys.readouterr()
    train_here(longer)
    out = capsys.readouterr().out
    assert f"resumed from {run_dir / 'last.pt'} at epoch 0, batch {stopped_at}" in out
    assert [int(row["epoch"]) for row in history(run_dir)] == [1, 2, 3]


def test_resume_from_an_epoch_checkpoint_replays_the_rest_of_the_run(
    tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    run_dir = tmp_path / "run"
    sets = ("train.epochs=3", "train.save_every=1")
    train_here(resolve_config(tiny_demo, run_dir, *sets))
    reference = resumable_state(run_dir / "last.pt")
    old_last = (run_dir / "last.pt").read_bytes()
    capsys.readouterr()
    train_here(resolve_config(tiny_demo, run_dir, *sets, "train.resume_from=epoch_1"))
    out = capsys.readouterr().out
    assert f"resumed from {run_dir / 'epoch_0001.pt'} at epoch 1, batch 0" in out
    assert_bitwise_equal(resumable_state(run_dir / "last.pt"), reference, "replayed run")
    assert [int(row["epoch"]) for row in history(run_dir)] == [1, 2, 3]
    (aside,) = (run_dir / "previous").iterdir()  # the run so far, kept before it is replaced
    assert (aside / "last.pt").read_bytes() == old_last


def test_resume_from_best_or_a_path_and_a_retry_continues_from_last(
    tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    source = tmp_path / "source"
    train_here(resolve_config(tiny_demo, source, "train.epochs=2"))
    best_step = checkpoint_file.load(source / "best.pt")["step"]
    run_dir = tmp_path / "run"
    sets = ("train.epochs=3", f"train.resume_from={source / 'best.pt'}")
    config = resolve_config(tiny_demo, run_dir, *sets)
    capsys.readouterr()
    stopped_at = interrupt(config)  # resumed from the path, then stopped after one step
    assert f"resumed from {source / 'best.pt'}" in capsys.readouterr().out
    assert stopped_at == best_step + 1
    train_here(config)  # the retry: from this run's last.pt, not from best.pt again
    out = capsys.readouterr().out
    assert f"resumed from {run_dir / 'last.pt'}" in out and "best.pt" not in out
    best = resolve_config(tiny_demo, source, "train.epochs=3", "train.resume_from=best")
    train_here(best)
    assert f"resumed from {source / 'best.pt'} at epoch" in capsys.readouterr().out


def test_resume_from_a_checkpoint_that_does_not_exist_is_an_error_naming_the_key(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    interrupt(resolve_config(tiny_demo, run_dir, "train.epochs=2"))
    saved = (run_dir / "last.pt").read_bytes()
    config = resolve_config(tiny_demo, run_dir, "train.epochs=2", "train.resume_from=epoch_7")
    with pytest.raises(ConfigError, match=r"train\.resume_from: expected an existing checkpoint"
                       r", found 'epoch_7' -> .*epoch_0007\.pt.*holds last\.pt"):  # fmt: skip
        train_here(config)
    assert (run_dir / "last.pt").read_bytes() == saved
    with pytest.raises(SystemExit, match="train.resume_from"):
        resolve_config(tiny_demo, run_dir, "train.restart=false", "train.resume_from=best")


def test_a_forced_rerun_keeps_the_train_json_snakemake_deleted(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """``--forcerun train``: Snakemake deletes the declared train.json, then starts the stage;
    the earlier run's train.json is still kept in previous/<time>/ with its checkpoints."""
    run_dir = tmp_path / "run"
    config = resolve_config(tiny_demo, run_dir, "train.max_updates=2")
    train(config, {}, time.time(), StopRequest())
    first = (run_dir / "train.json").read_bytes()
    (run_dir / "train.json").unlink()  # what Snakemake does before it reruns the job
    train(config, {}, time.time(), StopRequest())
    (aside,) = (run_dir / "previous").iterdir()
    assert (aside / "train.json").read_bytes() == first
    assert (aside / "best.pt").is_file() and (aside / "history.csv").is_file()
    assert json.loads((run_dir / "train.json").read_text())["steps"] == 2  # the new run's
