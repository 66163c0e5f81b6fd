"""The training stage end to end on the tiny demo: what a run writes, how it starts again,
what it refuses. ``run`` is called in-process (world size 1) except where ranks matter."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import TinyDemo, venv_env
from training_runs import assert_bitwise_equal, cpu_runtime, interrupt, resolve_config, train_here

from emb.training import checkpoint_file
from emb.training.checkpoint_file import CheckpointError
from emb.training.loop import build_loop, run
from emb.training.run_config import load
from emb.training.stop_request import StopRequest

ALLOWED = (torch.Tensor, int, float, bool, str, type(None))


def plain_types_only(value, where: str = "state") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, (str, int)), f"{where}: key {key!r}"
            plain_types_only(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            plain_types_only(item, f"{where}[{i}]")
    else:
        assert isinstance(value, ALLOWED), f"{where}: {type(value).__name__}"


@pytest.fixture(scope="module")
def finished(tiny_demo: TinyDemo, tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    config = resolve_config(
        tiny_demo, run_dir, "train.epochs=2", "train.save_every=1", "train.accumulation=2",
        "train.lr_scaling=linear", "train.reference_batch=16", "ema.enabled=true",
    )  # fmt: skip
    return run_dir, train_here(config)


def test_a_run_writes_best_last_epoch_checkpoints_history_and_tensorboard(finished) -> None:
    run_dir, summary = finished
    for name in ("best.pt", "last.pt", "epoch_0001.pt", "epoch_0002.pt", "history.csv"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    rows = (run_dir / "history.csv").read_text().splitlines()
    assert len(rows) == 3 and "val_ema_miou_l3" in rows[0] and "val_raw_miou_l3" in rows[0]
    assert summary["steps"] == torch.load(run_dir / "last.pt", weights_only=True)["step"]


def test_checkpoints_hold_only_tensors_and_plain_types(finished) -> None:
    run_dir, _ = finished
    for name in ("best.pt", "last.pt", "epoch_0001.pt"):
        state = torch.load(run_dir / name, weights_only=True)
        plain_types_only(state, name)
        assert set(state["ema"]) == set(state["model"])
        assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])


def test_global_batch_and_lr_scaling_rule_are_applied_and_reported(finished) -> None:
    _, summary = finished
    # batch 4 per rank x accumulation 2 x 1 rank = 8; linear rule from reference 16: lr / 2
    assert summary["global_batch"] == 8
    assert summary["lr"] == pytest.approx(1e-3 * 8 / 16)  # the demo overlay's LR


def test_restart_false_with_init_from_loads_weights_only(finished, tiny_demo, tmp_path) -> None:
    source_dir, _ = finished
    config = resolve_config(
        tiny_demo, tmp_path / "tuned", "train.epochs=1", "train.restart=false",
        f"train.init_from={source_dir / 'best.pt'}",
    )  # fmt: skip
    cfg = load(config)
    (tmp_path / "tuned" / "last.pt").write_bytes(b"ignored: restart is false")
    loop = build_loop(cfg, config.parent, 0, 1, cpu_runtime(cfg), StopRequest())
    loop.log.close()
    source = checkpoint_file.load(source_dir / "best.pt")  # selected by its EMA weights
    assert_bitwise_equal(loop.trainer.model.state_dict(), source["ema"], "model")
    assert_bitwise_equal(loop.trainer.ema.module.state_dict(), source["ema"], "ema")
    assert loop.trainer.step == 0 and loop.trainer.optimizer.state_dict()["state"] == {}
    summary = run(cfg, config.parent, 0, 1, cpu_runtime(cfg))
    state = checkpoint_file.load(tmp_path / "tuned" / "last.pt")
    assert state["step"] == summary["steps"] < 2 * summary["steps"] + 1  # a fresh schedule
    assert state["loader"] == {"epoch": 1, "batch": 0}


@pytest.fixture(scope="module")
def interrupted(tiny_demo: TinyDemo, tmp_path_factory) -> Path:
    """A run stopped after its first step (as by SIGUSR1): its last.pt is to be resumed."""
    run_dir = tmp_path_factory.mktemp("interrupted") / "run"
    interrupt(resolve_config(tiny_demo, run_dir, "train.epochs=1"))
    return run_dir


def test_resume_refuses_a_checkpoint_of_another_model(interrupted, tiny_demo, tmp_path) -> None:
    source_dir = interrupted
    run_dir = tmp_path / "other"
    config = resolve_config(tiny_demo, run_dir, "train.epochs=1", "model.decoder_dim=24")
    run_dir.joinpath("last.pt").write_bytes((source_dir / "last.pt").read_bytes())
    with pytest.raises(CheckpointError, match=r"model\.decoder_dim: checkpoint 16, config 24"):
        train_here(config)
    assert (run_dir / "last.pt").read_bytes() == (source_dir / "last.pt").read_bytes()


def test_early_stopping_ends_the_run_after_patience_validations_without_gain(
    tiny_demo, tmp_path
) -> None:
    # An lr too small to move a weight: validation figures never rise after the first.
    config = resolve_config(
        tiny_demo, tmp_path / "run", "train.max_updates=50", "train.val_every_updates=1",
        "train.patience=3", "optimizer.lr=1.0e-12", "schedule.warmup_steps=0",
    )  # fmt: skip
    summary = train_here(config)
    steps = [int(r.split(",")[1]) for r in (tmp_path / "run/history.csv").read_text().split()[1:]]
    assert summary["steps"] == 4 and steps == [1, 2, 3, 4]
    state = checkpoint_file.load(tmp_path / "run" / "last.pt")
    assert state["early_stop"]["bad"] == 3 and state["finished"]


def test_max_updates_and_validation_every_n_updates(tiny_demo, tmp_path) -> None:
    config = resolve_config(
        tiny_demo, tmp_path / "run", "train.max_updates=7", "train.val_every_updates=3"
    )
    summary = train_here(config)
    steps = [int(r.split(",")[1]) for r in (tmp_path / "run/history.csv").read_text().split()[1:]]
    assert summary["steps"] == 7 and steps == [3, 6, 7]


def test_batch_of_one_per_gpu_warns(tiny_demo, tmp_path, capsys) -> None:
    config = resolve_config(tiny_demo, tmp_path / "run", "train.max_updates=1",
                            "train.batch_size=1", "train.val_min_batch=1")  # fmt: skip
    train_here(config)
    assert "train.batch_size is 1 per GPU" in capsys.readouterr().err


def test_wandb_offline_logs_without_network(tiny_demo, tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = resolve_config(tiny_demo, tmp_path / "run", "train.max_updates=2",
                            "logging.wandb=true", "logging.log_every=1")  # fmt: skip
    train_here(config)
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_compile_inside_ddp_trains_and_saves_unprefixed_weights(tiny_demo, tmp_path) -> None:
    config = resolve_config(
        tiny_demo, tmp_path / "run", "train.max_updates=2", "train.compile=true",
        "train.compile_memory_budget=0.5",
    )  # fmt: skip
    cmd = ["torchrun", "--standalone", "--nproc_per_node=2", "-m", "emb.training.train", "--config",
           str(config)]  # fmt: skip
    done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    state = checkpoint_file.load(tmp_path / "run" / "last.pt")
    assert state["step"] == 2
    raw_keys = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in raw_keys)


def test_two_rank_validation_equals_one_rank_validation(finished, tmp_path) -> None:
    run_dir, _ = finished
    figures = {}
    for world in (1, 2):
        out = tmp_path / f"val{world}.json"
        cmd = ["torchrun", "--standalone", f"--nproc_per_node={world}",
               str(Path(__file__).parents[1] / "validate_ranks.py"), str(run_dir / "best.pt"),
               str(out)]  # fmt: skip
        done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        figures[world] = json.loads(out.read_text())
    assert figures[1]["val_samples"] == figures[2]["val_samples"] > 0
    assert set(figures[1]) == set(figures[2])
    for key, value in figures[1].items():
        assert figures[2][key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
