"""Real multi-process DDP: ``torchrun --nproc_per_node=2`` (gloo on CPU) on tiny demo shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TinyDemo
from training_runs import resolve_config, run_to_end


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
