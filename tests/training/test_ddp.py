"""Real multi-process DDP: ``torchrun --nproc_per_node=2`` (gloo on CPU) on tiny demo shards."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, TinyDemo, venv_env
from training_runs import manifest_with_val, resolve_config, run_to_end


def train_with_torchrun(tiny_demo: TinyDemo, run_dir: Path, arch: str, epochs: int = 2) -> dict:
    """Resolve a tiny config for ``arch`` on AEF, train it on 2 ranks, return rank records."""
    config = resolve_config(tiny_demo, run_dir, f"train.epochs={epochs}", arch=arch)
    result = run_to_end(config)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return {r: json.loads((run_dir / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)}


@pytest.fixture(scope="module", params=["segformer", "deeplab"])
def ranks(request, tiny_demo: TinyDemo, tmp_path_factory) -> tuple[dict, TinyDemo]:
    run_dir = tmp_path_factory.mktemp(f"ddp_{request.param}") / "run"
    return train_with_torchrun(tiny_demo, run_dir, request.param), tiny_demo


def test_ranks_read_disjoint_shards_covering_the_train_split(ranks) -> None:
    records, demo = ranks
    shards0, shards1 = set(records[0]["shards"]), set(records[1]["shards"])
    assert shards0 and shards1
    assert not shards0 & shards1
    assert shards0 | shards1 == set(demo.manifest("aef")["splits"]["train"]["shards"])


def test_ranks_run_the_same_number_of_batches_every_epoch(ranks) -> None:
    records, _ = ranks
    assert records[0]["world"] == records[1]["world"] == 2
    assert len(records[0]["batches"]) == 2
    assert records[0]["batches"] == records[1]["batches"]


def test_ranks_end_with_bitwise_equal_parameters_and_buffers(ranks) -> None:
    records, _ = ranks
    assert records[0]["steps"] > 0
    assert records[0]["digest"] == records[1]["digest"]


def test_rank_zero_writes_history_and_checkpoints(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train_with_torchrun(tiny_demo, run_dir, "segformer", epochs=1)
    assert (run_dir / "history.csv").read_text().count("\n") == 2  # header + one epoch
    assert (run_dir / "best.pt").is_file() and (run_dir / "last.pt").is_file()
    assert json.loads((run_dir / "train.json").read_text())["global_batch"] == 8


def validate_on_one_rank(checkpoint: Path, out: Path) -> dict:
    """The checkpoint validated as its run's validator does, by one process."""
    cmd = ["torchrun", "--standalone", "--nproc_per_node=1", str(REPO / "tests/validate_ranks.py"),
           str(checkpoint), str(out), "--as-trained"]  # fmt: skip
    done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_rank_without_validation_data_does_not_hang_validation(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """DeepLab (BatchNorm) on 2 ranks, a validation split of one shard: rank 1 has no batch.
    Validating through DDP would broadcast buffers that rank 1 never joins (it would wait for
    collective_timeout_s, then fail); the figures are those of one rank validating alone."""
    manifest = manifest_with_val(tiny_demo, tmp_path / "one_val_shard.json", [0])
    run_dir = tmp_path / "run"
    config = resolve_config(
        tiny_demo, run_dir, "train.max_updates=2", f"data.manifest={manifest}",
        "train.collective_timeout_s=30", arch="deeplab",
    )  # fmt: skip
    result = run_to_end(config)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    with open(run_dir / "history.csv") as fh:
        row = list(csv.DictReader(fh))[-1]
    alone = validate_on_one_rank(run_dir / "last.pt", tmp_path / "alone.json")
    assert alone["val_samples"] == int(row["val_samples"]) == 3
    assert {"val_ema_miou_l3", "val_raw_loss"} <= set(alone)
    for key, value in alone.items():
        assert float(row[key]) == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_a_rerun_of_a_finished_two_rank_run_trains_again(tiny_demo: TinyDemo, tmp_path) -> None:
    """Every rank decides to start over from the same files before rank 0 sets them aside."""
    run_dir = tmp_path / "run"
    config = resolve_config(tiny_demo, run_dir, "train.max_updates=2")
    for _ in range(2):
        result = run_to_end(config)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "is a finished run: starting over" in result.stdout
    assert (run_dir / "history.csv").read_text().count("\n") == 2  # header + this run's row
    (aside,) = (run_dir / "previous").iterdir()
    assert (aside / "last.pt").is_file() and (aside / "history.csv").is_file()
