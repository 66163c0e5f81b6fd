"""Predict's window settings refused where they are set (issue 51, items 1, 2 and 10): the
stage's options in one line with exit 2, the model's downsampling per architecture, a stride
that rounds to 0 named as such; by hand, the options the rule always passes take the schema's
defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import rasterio
import torch
from conftest import CLASSES_CSV, TINY, TinyDemo
from tiny_runs import resolved_config, write_run

from emb import stage_runner
from emb.config_schema import config_default
from emb.evaluation.evaluate import main as evaluate_main
from emb.evaluation.predict import main as predict_main
from emb.evaluation.predict_spec import PredictSettingsError, PredictSpec, model_downsampling
from emb.models import ModelConfig, build_model


@pytest.fixture(scope="module")
def untrained(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AEF SegFormer run folder (untrained weights: these tests map nothing worth reading)
    recorded with the tiny demo's 32-px tile."""
    root = tmp_path_factory.mktemp("settings")
    config = resolved_config(tiny_demo, root, "aef", "segformer")
    torch.manual_seed(0)
    model = build_model(ModelConfig(**config["model"]))
    return write_run(root / "run", config, model.state_dict(), tile_size=TINY["tile"])


def by_hand(run_dir: Path, raster: Path, out: Path, *options: str) -> list[str]:
    """predict's command line for one raster, as a person types it: no rule's options."""
    return ["--run-dir", str(run_dir), "--raster", str(raster), "--region", "demo_a",
            "--classes", str(CLASSES_CSV), "--out", str(out), "--png",
            str(out.with_suffix(".png")), *options]  # fmt: skip


def refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The stage's one ERROR line for ``argv``; its exit code must be 2 (bad input)."""
    with pytest.raises(SystemExit) as exc:
        predict_main(argv)
    assert exc.value.code == stage_runner.EXIT_INPUT, exc.value
    lines = [line for line in capsys.readouterr().err.splitlines() if " ERROR " in line]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize(
    ("option", "needles"),
    [
        ("--batch-size=0", ["--batch-size 0", "expected a whole number >= 1", "e.g. 16"]),
        ("--block=0", ["--block 0", "expected a whole number >= 1", "e.g. 1024"]),
        ("--overlap=1.5", ["--overlap 1.5", "expected a fraction of the window in [0, 1)"]),
        (
            "--overlap=0.99",
            [
                "--overlap 0.99",
                "at 32-px windows the stride",
                "is 0 px",
                "never advance",
                "at most 0.96875",
            ],
        ),  # fmt: skip
        ("--tile=48", ["--tile 48", "multiple of 32", "e.g. 32 or 64"]),
    ],
)
def test_a_setting_that_cannot_map_is_one_line_naming_the_option_and_exit_2(
    untrained: Path, tiny_demo: TinyDemo, tmp_path: Path, capsys: pytest.CaptureFixture,
    option: str, needles: list[str],
) -> None:  # fmt: skip
    out = tmp_path / "map.tif"
    line = refused(by_hand(untrained, tiny_demo.rasters["demo_a"]["aef"], out, option), capsys)
    for needle in needles:
        assert needle in line, (needle, line)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_the_training_tile_the_model_cannot_map_names_the_checkpoint(
    tiny_demo: TinyDemo, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A checkpoint of 40-px tiles (trained before the workflow refused them): the window is
    the run's training tile, so the line names where it came from."""
    config = resolved_config(tiny_demo, tmp_path, "aef", "segformer")
    model = build_model(ModelConfig(**config["model"]))
    run = write_run(tmp_path / "run40", config, model.state_dict(), tile_size=40)
    line = refused(by_hand(run, tiny_demo.rasters["demo_a"]["aef"], tmp_path / "m.tif"), capsys)
    assert f"the run's training tile ({run / 'best.pt'}) 40" in line and "multiple of 32" in line


def test_by_hand_the_rules_options_take_the_schemas_defaults(
    untrained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """No --overlap, --block, --batch-size or --threads: the map is written with the schema's
    predict settings (recorded in its tags), as any other stage run by hand."""
    out = tmp_path / "map.tif"
    predict_main(by_hand(untrained, tiny_demo.rasters["demo_a"]["aef"], out))
    with rasterio.open(out) as src:
        assert src.count == 1 and src.width == TINY["size"]
    defaults = [config_default(f"predict.{k}") for k in ("overlap", "block", "batch_size")]
    assert defaults == [0.5, 1024, 16]  # the schema's, as config.yaml documents them


@pytest.mark.parametrize(
    ("arch", "stages", "multiple"),
    [("segformer", 4, 32), ("segformer", 3, 16), ("deeplab", 4, 16), ("deeplab", 2, 8)],
)
def test_the_downsampling_is_the_architectures_own(arch: str, stages: int, multiple: int) -> None:
    """SegFormer halves at every stage; DeepLab stops at output stride 16 and dilates: a
    window of ``multiple`` px goes through the real model and comes back whole, and half of
    it does not divide (the check's reason)."""
    widths = [8, 8, 8, 8][:stages]
    cfg = ModelConfig(arch, 4, tuple(widths), (1,) * stages, decoder_dim=8)
    assert model_downsampling(arch, stages) == multiple
    model = build_model(cfg, tile_size=multiple).eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 4, multiple, multiple))["l3"]
    assert out.shape[-2:] == (multiple, multiple)
    with pytest.raises(PredictSettingsError, match=f"multiple of {multiple}"):
        PredictSpec(multiple + multiple // 2).check(multiple)


def test_a_stride_that_rounds_to_zero_is_named_and_the_largest_overlap_that_works_passes() -> None:
    with pytest.raises(PredictSettingsError, match=r"stride .* is 0 px"):
        PredictSpec(32, 0.99).check(32)
    PredictSpec(32, 31 / 32).check(32)  # the suggested at-most value: a stride of 1 px
    assert PredictSpec(32, 31 / 32).stride == 1


def test_evaluate_by_hand_says_what_is_wrong_with_the_checkpoint_without_threads(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """No --threads (the rule always passes it; by hand, the schema's launch.threads): the
    stage gets as far as the run and names its missing checkpoint, not a usage error."""
    run_dir = tmp_path / "runs" / "other"
    run_dir.mkdir(parents=True)
    with pytest.raises(SystemExit) as exc:
        evaluate_main(["--run-dir", str(run_dir), "--classes", str(CLASSES_CSV),
                       "--out-dir", str(tmp_path / "eval"), "--checkpoint", "best.pt"])  # fmt: skip
    err = capsys.readouterr().err
    assert "usage:" not in err and "required" not in err, err
    assert exc.value.code == stage_runner.EXIT_INPUT
    assert f"run 'other' has no checkpoint {run_dir / 'best.pt'}" in str(exc.value)
