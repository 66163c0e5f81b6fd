"""A NaN tile or an Inf loss on one rank at a random step, under torchrun (2 ranks, a DeepLab
with BatchNorm and EMA): every rank skips that step; its weights, BatchNorm buffers, EMA and
optimizer state are what they were before it; the skip is counted and logged; training goes on.
``fault_launcher.py`` injects the fault and records digests around every step."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import TinyDemo
from fault_runs import run
from training_runs import resolve_config
from trials import pytest_generate_tests  # noqa: F401 - parametrizes `trial`

pytestmark = pytest.mark.reliability

STEPS = 8
CONFIG = (f"train.max_updates={STEPS}", "train.val_every_updates=1000", "logging.log_every=1",
          "ema.enabled=true", "ema.decay=0.9", "train.collective_timeout_s=60")  # fmt: skip


def step_records(run_dir: Path, rank: int) -> list[dict]:
    lines = (run_dir / "ranks" / f"steps{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.check("nonfinite_step")
def test_nan_tile_or_inf_loss_on_one_rank_is_skipped_by_all_and_changes_nothing(
    tiny_demo: TinyDemo, tmp_path: Path, trial: int
) -> None:
    rng = random.Random()
    kind = ("nan_tile", "inf_loss")[trial % 2]  # both kinds, whatever the count
    rank, call = rng.choice([0, 1]), rng.randint(2, STEPS)
    where = f"trial {trial}: {kind} on rank {rank} at step attempt {call}"
    run_dir = tmp_path / "run"
    config = resolve_config(tiny_demo, run_dir, *CONFIG, arch="deeplab")
    result = run(config, fault=f"{kind}:{rank}:{call}")
    assert result.returncode == 0, f"{where}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    records = {r: step_records(run_dir, r) for r in (0, 1)}
    assert len(records[0]) == len(records[1]) == STEPS, where  # a skipped step is a step
    bad = {r: records[r][call - 1] for r in (0, 1)}
    assert bad[rank]["injected"] and not bad[1 - rank]["injected"], where
    for r in (0, 1):
        assert not bad[r]["applied"], f"{where}: rank {r} applied the bad step"
        assert bad[r]["after"] == bad[r]["before"], f"{where}: rank {r} changed by the bad step"
        assert [x["applied"] for x in records[r]].count(False) == 1, where
        assert records[r][-1]["skipped"] == 1, where
        assert bad[r]["before"]["buffers"] != records[r][0]["before"]["buffers"], where
    for part in ("weights", "optimizer"):  # BatchNorm buffers are per rank until validation
        assert bad[0]["after"][part] == bad[1]["after"][part], f"{where}: ranks' {part} differ"
    assert f"step {call} skipped: gradient norm" in result.stderr, f"{where}: skip not logged"
    assert "(skipped 1 in all, 1 in a row)" in result.stderr, where
    assert f"step {STEPS} loss" in result.stdout and "skipped 1" in result.stdout, where
    assert json.loads((run_dir / "train.json").read_text())["skipped_steps"] == 1, where
