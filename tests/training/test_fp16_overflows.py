"""fp16 with a GradScaler (issue 42, item 6): an overflow while the scale is still >= 1 is the
scaler finding its level (the step is skipped, the scale halved), not divergence; only
non-finite steps at a scale below 1 count towards ``train.max_nonfinite_in_row``.

Real runs on the tiny demo (CPU autocast in fp16, torch's GradScaler): the scale is set as a
resume restores it (``GradScaler.load_state_dict``), high enough that the first steps truly
overflow in fp16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TinyDemo
from training_runs import resolve_config

from emb.models.runtime import Runtime
from emb.training.loop import build_loop
from emb.training.run_config import load
from emb.training.stop_request import StopRequest
from emb.training.trainer import Trainer, TrainingDiverged

IN_ROW = 3  # train.max_nonfinite_in_row of these runs


def fp16_run(demo: TinyDemo, run_dir: Path, scale: float) -> tuple[Trainer, list[dict]]:
    """A built fp16 run (its trainer, two epochs of batches) with its GradScaler at ``scale``."""
    config = resolve_config(
        demo, run_dir, "train.precision=fp16", f"train.max_nonfinite_in_row={IN_ROW}",
        "train.max_updates=20",
    )  # fmt: skip
    # fp16 on a CPU, which the runtime's rule (a CPU runs fp32) would not pick: set it here
    cpu_fp16 = Runtime(torch.device("cpu"), "fp16", False, False, None)
    loop = build_loop(load(config), run_dir, 0, 1, cpu_fp16, StopRequest())
    loop.log.close()
    trainer = loop.trainer
    assert trainer.scaler is not None, "fp16 runs with a GradScaler"
    trainer.scaler.load_state_dict({"scale": scale, "growth_factor": 2.0, "backoff_factor": 0.5,
                                    "growth_interval": 2000, "_growth_tracker": 0})  # fmt: skip
    return trainer, [batch for epoch in range(2) for batch in loop.epoch_batches(epoch)]


def test_early_overflows_at_a_scale_above_one_do_not_stop_a_healthy_run(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    trainer, batches = fp16_run(tiny_demo, tmp_path / "run", 2.0**20)
    applied, scales = [], []
    for batch in batches:
        scales.append(trainer.scaler.get_scale())
        applied.append(trainer.train_step([batch]).applied)
        trainer.check_nonfinite()  # raises TrainingDiverged where the run counts as diverged
    overflows = applied.index(True)
    assert overflows >= IN_ROW, f"the case needs {IN_ROW} overflows in a row, got {applied}"
    assert all(s >= 1 for s in scales[:overflows])
    assert sum(applied[overflows:]) >= len(batches) - overflows - 1  # then it trains
    counts = trainer.check_nonfinite()
    assert counts.skipped == applied.count(False) and counts.in_row == 0


def test_non_finite_steps_below_scale_one_still_stop_a_diverged_run(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """A weight gone infinite (every step non-finite): at scale 4 the steps at scales 4 and 2
    (halved to 2 and 1) are the scaler's; the next three, below 1, are divergence."""
    trainer, batches = fp16_run(tiny_demo, tmp_path / "run", 4.0)
    with torch.no_grad():
        next(p for p in trainer.model.parameters() if p.dim() == 4).fill_(float("inf"))
    for step in range(1, 2 + IN_ROW):
        assert not trainer.train_step([batches[step]]).applied
        trainer.check_nonfinite()
    assert trainer.scaler.get_scale() == 4.0 / 2 ** (IN_ROW + 1)  # 2 uncounted, 2 counted
    with pytest.raises(TrainingDiverged, match=rf"{IN_ROW} non-finite steps in a row"):
        trainer.train_step([batches[0]])
        trainer.check_nonfinite()
