"""The precision a run used is the runtime's record (issue 56): the loop no longer writes the
resolved precision into the run's config, and a resume compares the precision the checkpoint
ran at with the one this process runs at. Checkpoints written before, whose config carries the
resolved precision (and, before the runtime was recorded, no ``precision`` in the provenance),
resume as they did."""

from __future__ import annotations

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
from emb.training.checkpoint_file import CheckpointError, check_resumable, ran_precision

CONFIG = {"model": {"arch": "segformer"}, "train": {"precision": "bf16", "seed": 0}}


def state(config_precision: str, ran: str | None) -> dict:
    """A checkpoint's resume keys: its config's train.precision and the runtime's record
    (None: written before the runtime was recorded)."""
    config = {**CONFIG, "train": {**CONFIG["train"], "precision": config_precision}}
    provenance = {} if ran is None else {"precision": ran}
    return {"config": config, "global_batch": 8, "provenance": provenance}


@pytest.mark.parametrize(
    ("config_precision", "ran", "expected"),
    [
        ("bf16", "fp32", "fp32"),  # now: the setting in the config, what ran in the provenance
        ("fp32", "fp32", "fp32"),  # before: the loop wrote the resolved one into the config
        ("fp32", None, "fp32"),  # before the runtime was recorded: the config's alone
        ("bf16", None, "bf16"),  # such a checkpoint of a GPU run
    ],
)
def test_the_precision_a_checkpoint_ran_at(config_precision: str, ran: str | None,
                                           expected: str) -> None:  # fmt: skip
    assert ran_precision(state(config_precision, ran)) == expected


@pytest.mark.parametrize("form", [("bf16", "fp32"), ("fp32", "fp32"), ("fp32", None)])
def test_a_cpu_run_resumes_a_cpu_checkpoint_of_either_form(form: tuple[str, str | None]) -> None:
    """train.precision bf16 on a CPU runs fp32: the math is unchanged whichever form the
    checkpoint's config has, and a changed setting that resolves alike changes nothing."""
    check_resumable(state(*form), CONFIG, 8, "fp32", Path("last.pt"))
    fp16 = {**CONFIG, "train": {**CONFIG["train"], "precision": "fp16"}}
    check_resumable(state(*form), fp16, 8, "fp32", Path("last.pt"))


@pytest.mark.parametrize("form", [("bf16", "bf16"), ("bf16", None)])
def test_a_checkpoint_that_ran_at_another_precision_is_refused(
    form: tuple[str, str | None],
) -> None:
    """A GPU run's bf16 checkpoint on a CPU (fp32), in either form: refused, naming both."""
    with pytest.raises(CheckpointError, match=r"precision: checkpoint ran 'bf16', this process "
                       r"runs 'fp32' \(train.precision 'bf16' on its device\)"):  # fmt: skip
        check_resumable(state(*form), CONFIG, 8, "fp32", Path("last.pt"))
    check_resumable(state(*form), CONFIG, 8, "bf16", Path("last.pt"))  # on a GPU: resumable


def rewrite(path: Path, edit) -> None:
    """``path``'s checkpoint with ``edit`` applied, saved as checkpoints are (digest kept)."""
    saved = checkpoint_file.load(path)
    edit(saved)
    checkpoint_file.save(path, saved)


def old_form(saved: dict) -> None:
    """As the loop wrote it before issue 56, on a CPU, before the runtime was recorded: the
    resolved precision in the config, none in the provenance."""
    saved["config"]["train"]["precision"] = "fp32"
    del saved["provenance"]["precision"]


def test_an_old_checkpoint_resumes_bitwise_and_one_that_ran_bf16_is_refused(
    tiny_demo: TinyDemo, tmp_path: Path, capsys
) -> None:
    sets = ("train.epochs=1", "train.max_updates=3", "train.precision=bf16")
    reference = tmp_path / "reference"
    train_here(resolve_config(tiny_demo, reference, *sets))
    ran = checkpoint_file.load(reference / "last.pt")
    assert ran["config"]["train"]["precision"] == "bf16"  # as set, not written back
    assert ran["provenance"]["precision"] == "fp32"  # what ran on the CPU

    run_dir = tmp_path / "run"
    config = resolve_config(tiny_demo, run_dir, *sets)
    stopped_at = interrupt(config)
    rewrite(run_dir / "last.pt", lambda s: s["provenance"].update(precision="bf16"))
    saved = (run_dir / "last.pt").read_bytes()
    with pytest.raises(CheckpointError, match=r"cannot resume.*precision: checkpoint ran 'bf16'"):
        train_here(config)  # a GPU run's checkpoint, resumed on a CPU
    assert (run_dir / "last.pt").read_bytes() == saved  # the good checkpoint untouched

    rewrite(run_dir / "last.pt", lambda s: (s["provenance"].update(precision="fp32"), old_form(s)))
    capsys.readouterr()
    train_here(config)
    out = capsys.readouterr().out
    assert f"resumed from {run_dir / 'last.pt'} at epoch 0, batch {stopped_at}" in out
    assert "differs from the checkpoint's" in out and "in train.precision" in out  # a note
    assert_bitwise_equal(
        resumable_state(run_dir / "last.pt"), resumable_state(reference / "last.pt"), "resumed"
    )
