"""A run that never validated must not look finished (issue 41, item 2): a validation split
that no rank can score is refused when the training job starts, before anything is trained or
set aside; a validation that scored nothing stops the run; ``train.json`` is never written
without the ``best.pt`` evaluate reads. ``val_min_batch > batch_size`` is refused while the
workflow parses (``TrainConfig``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TinyDemo, venv_env
from training_runs import manifest_with_val, resolve_config, train_here

from emb.loading.shard_manifest import ValidationTooSmall, check_validation_scored
from emb.training.run_config import ConfigError, LoopConfig
from emb.training.train import NotValidated, write_summary


def split(*samples: int) -> dict:
    """A manifest split of shards holding ``samples`` samples each."""
    shards = [f"shards/val-{i:02d}.tar" for i in range(len(samples))]
    return {"shards": shards, "shard_samples": list(samples), "samples": sum(samples)}


@pytest.mark.parametrize(
    ("samples", "batch", "min_batch", "world"),
    [
        ((1,), 4, 2, 1),  # the one-tile validation split
        ((1, 1, 1), 4, 2, 8),  # 8 processes, shards of one sample: no rank reads two
        ((3, 3), 4, 4, 2),  # 6 samples, but 3 per rank
    ],
)
def test_a_split_no_rank_can_score_is_refused_naming_split_samples_batch_and_ranks(
    samples: tuple[int, ...], batch: int, min_batch: int, world: int
) -> None:
    with pytest.raises(ValidationTooSmall) as err:
        check_validation_scored(split(*samples), "m.json", batch, min_batch, world)
    message = str(err.value)
    assert f"m.json: split 'val' holds {sum(samples)} sample(s) in {len(samples)} shard(s)" in (
        message
    )
    assert f"the busiest of {world} rank(s) reads {max(samples)}" in message
    assert f"train.batch_size {batch}" in message
    assert f"train.val_min_batch {min_batch}" in message


@pytest.mark.parametrize(
    ("samples", "batch", "min_batch", "world"),
    [
        ((1, 1), 4, 2, 1),  # two one-sample shards make one batch of 2 on one rank
        ((3,), 4, 2, 2),  # rank 1 reads nothing; rank 0 scores, and the ranks sum
        ((6,), 4, 4, 1),  # a full batch of 4 scores, the remainder of 2 is skipped
        ((2,), 2, 2, 1),
    ],
)
def test_a_split_one_rank_can_score_passes(
    samples: tuple[int, ...], batch: int, min_batch: int, world: int
) -> None:
    check_validation_scored(split(*samples), "m.json", batch, min_batch, world)


def test_val_min_batch_above_batch_size_is_refused_as_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"train.val_min_batch: 4 is larger than train"
                       r"\.batch_size 2.*never validate"):  # fmt: skip
        LoopConfig(batch_size=2, val_min_batch=4)
    LoopConfig(batch_size=2, val_min_batch=2)


def start_job(config: Path, world: int) -> subprocess.CompletedProcess:
    """The training stage as torchrun starts rank 0 of ``world`` (refused before the process
    group: no other rank needed)."""
    env = venv_env() | {"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"}
    cmd = [sys.executable, "-m", "emb.training.train", "--config", str(config)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_the_training_job_refuses_before_training_or_setting_anything_aside(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """The demo's val split (2 shards of 3 samples) with val_min_batch 4: one rank would score
    a batch of 4, two ranks read 3 each and would score nothing. An earlier finished run in
    the folder stays where it is."""
    manifest = tiny_demo.manifest("aef")["splits"]["val"]
    assert manifest["shard_samples"] == [3, 3]  # what the case below is built on
    run_dir = tmp_path / "run"
    config = resolve_config(tiny_demo, run_dir, "train.max_updates=1", "train.val_min_batch=4")
    earlier = {"best.pt": b"an earlier run", "history.csv": b"epoch\n1\n"}
    for name, data in earlier.items():
        (run_dir / name).write_bytes(data)

    done = start_job(config, world=2)

    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert f"{tiny_demo.manifests['aef']}: split 'val' holds 6 sample(s) in 2 shard(s)" in line
    assert "the busiest of 2 rank(s) reads 3" in line
    assert "train.batch_size 4" in line and "train.val_min_batch 4" in line
    assert {p.name for p in run_dir.iterdir()} == {"config.yaml", *earlier}  # nothing started
    assert {name: (run_dir / name).read_bytes() for name in earlier} == earlier


def test_a_validation_that_scores_nothing_stops_the_run_without_a_best_model(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """In-process (no job-start check): one val shard of 3 samples, val_min_batch 4."""
    manifest = manifest_with_val(tiny_demo, tmp_path / "one_val_shard.json", [0])
    run_dir = tmp_path / "run"
    config = resolve_config(
        tiny_demo, run_dir, "train.max_updates=2", "train.val_every_updates=1",
        "train.val_min_batch=4", f"data.manifest={manifest}",
    )  # fmt: skip
    with pytest.raises(ValidationTooSmall, match=r"validation at optimizer step 1 scored no "
                       r"sample.*train\.val_min_batch 4"):  # fmt: skip
        train_here(config)
    assert not (run_dir / "best.pt").exists() and not (run_dir / "train.json").exists()


def test_train_json_is_never_written_without_best_pt(tmp_path: Path) -> None:
    summary = {"steps": 7, "best_val_miou_l3": -1.0}
    with pytest.raises(NotValidated, match=r"step 7 without best\.pt.*train\.json is not written"):
        write_summary(tmp_path, summary)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "best.pt").write_bytes(b"weights")
    write_summary(tmp_path, summary)
    assert json.loads((tmp_path / "train.json").read_text()) == summary
