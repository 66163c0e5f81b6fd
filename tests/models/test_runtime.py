"""One device module (issue 43): precision, channels_last and compile resolved once per run by
the measured rules, applied to model and inputs, the same for training, evaluation and
prediction of one run config, and recorded in train.json, the checkpoint, metrics.json and the
maps; the training tile size travels with the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rasterio
import torch
from conftest import CLASSES_CSV, TinyDemo
from training_runs import resolve_config, train_here

from emb.classes import load_class_map
from emb.evaluation.evaluate import main as evaluate_main
from emb.evaluation.predict import main as predict_main
from emb.evaluation.runs import RunError, open_run
from emb.models import ModelConfig, build_model
from emb.models.flat_tensors import flats_of
from emb.models.runtime import Runtime, claim_device, resolve_channels_last, resolve_precision
from emb.training import checkpoint_file
from emb.training.loop import build_trainer, runtime_of
from emb.training.run_config import LoopConfig, load
from emb.training.schedule import build_plan

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
RUNTIME_KEYS = ("device_type", "precision", "channels_last", "compile")

# train.channels_last: auto, as measured (issue 31, H200): DeepLab 1.10-1.28x faster in
# channels_last on CUDA, SegFormer 0.97-1.03x; ROCm's NHWC kernels slow; CPUs not measured
AUTO_CHANNELS_LAST = {
    ("deeplab", "cuda", False): True,
    ("segformer", "cuda", False): False,
    ("deeplab", "cuda", True): False,
    ("segformer", "cuda", True): False,
    ("deeplab", "cpu", False): False,
    ("segformer", "cpu", False): False,
}
# train.precision: as set on a GPU (CUDA or ROCm), fp32 on a CPU (CPU autocast is slower)
PRECISION = {("cuda", s): s for s in ("bf16", "fp16", "fp32")} | {
    ("cpu", s): "fp32" for s in ("bf16", "fp16", "fp32")
}


@pytest.mark.parametrize(("arch", "device_type", "hip"), list(AUTO_CHANNELS_LAST))
@pytest.mark.parametrize("channels_last", ["auto", True, False])
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("compile", [False, True])
def test_resolution_is_the_measured_rule(
    arch: str, device_type: str, hip: bool, channels_last: bool | str, precision: str,
    compile: bool,
) -> None:  # fmt: skip
    """Every architecture x device type x ROCm x setting; true/false are taken as set."""
    settings = LoopConfig(precision=precision, channels_last=channels_last, compile=compile)
    device = torch.device(device_type)
    wanted_cl = AUTO_CHANNELS_LAST[arch, device_type, hip] if channels_last == "auto" \
        else channels_last  # fmt: skip
    for training in (True, False):
        runtime = Runtime.resolve(settings, arch, device, training=training, hip=hip)
        assert runtime == Runtime(device, PRECISION[device_type, precision], wanted_cl,
                                  compile and training)  # fmt: skip
        assert resolve_channels_last(channels_last, arch, device_type, hip) is wanted_cl
        assert resolve_precision(precision, device_type) == PRECISION[device_type, precision]


def test_default_is_auto_and_other_words_refused() -> None:
    assert LoopConfig().channels_last == "auto"
    with pytest.raises(ValueError, match=r"train.channels_last: expected auto.*'yes'"):
        resolve_channels_last("yes", "deeplab", "cuda")
    with pytest.raises(ValueError, match=r"train.precision: expected one of .*'fp8'"):
        Runtime.resolve(LoopConfig(precision="fp8"), "deeplab", CPU, training=True)
    with pytest.raises(ValueError, match=r"channels_last: expected the resolved true or false"):
        Runtime(CPU, "fp32", "auto")  # type: ignore[arg-type]


TINY_DEEPLAB = ModelConfig(
    arch="deeplab", in_dim=64, widths=(8, 8, 16, 16), depths=(1, 1, 1, 1), decoder_dim=8,
    aspp_rates=(1, 2),
)  # fmt: skip


def is_channels_last(model: torch.nn.Module) -> bool:
    """Whether the 4-D weights are in channels_last (a 1x1 kernel is in both formats)."""
    four_d = [p for p in model.parameters() if p.dim() == 4]
    in_cl = all(p.is_contiguous(memory_format=torch.channels_last) for p in four_d)
    return in_cl and any(not p.is_contiguous() for p in four_d)


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("compile", [False, True])
def test_prepare_applies_it_to_the_model_and_inputs(channels_last: bool, compile: bool) -> None:
    """Memory format of weights and inputs; training: one flat tensor per dtype unless the
    model will be compiled (never flattened for evaluation), train mode kept; else eval."""
    runtime = Runtime(CPU, "fp32", channels_last, compile)
    trained = runtime.prepare(build_model(TINY_DEEPLAB), training=True)
    assert is_channels_last(trained) is channels_last and trained.training
    flat = flats_of(list(trained.parameters())) is not None
    assert flat is not compile
    assert flats_of(list(trained.buffers())) is not None or compile
    evaluated = runtime.prepare(build_model(TINY_DEEPLAB))
    assert is_channels_last(evaluated) is channels_last and not evaluated.training
    assert flats_of(list(evaluated.parameters())) is None
    x = runtime.inputs(torch.zeros(2, 64, 8, 8))
    assert x.is_contiguous(memory_format=runtime.memory_format)
    assert x.is_contiguous() is not channels_last


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("fp32", None)])
def test_autocast_is_the_resolved_precision(precision: str, dtype: torch.dtype | None) -> None:
    layer = torch.nn.Linear(4, 4)
    with Runtime(CPU, precision).autocast():
        out = layer(torch.ones(2, 4))
    assert out.dtype == (dtype or torch.float32)


def test_record_names_what_ran() -> None:
    assert Runtime(CUDA, "bf16", True, False).record() == {
        "device_type": "cuda", "precision": "bf16", "channels_last": "true", "compile": "false",
    }  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU process claims a GPU instead")
def test_a_cpu_process_runs_on_the_threads_its_rule_gave_it() -> None:
    before = torch.get_num_threads()
    try:
        assert claim_device(threads=3) == CPU and torch.get_num_threads() == 3
        assert claim_device(threads=0) == CPU and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def runtime_of_record(record: dict) -> dict:
    return {key: record[key] for key in RUNTIME_KEYS}


@pytest.fixture(scope="module")
def channels_last_run(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DeepLab run trained by the loop with train.channels_last: true (bf16 asked for)."""
    run_dir = tmp_path_factory.mktemp("runtime") / "aef_deeplab"
    config = resolve_config(tiny_demo, run_dir, "train.max_updates=2", "train.channels_last=true",
                            "train.precision=bf16", arch="deeplab")  # fmt: skip
    summary = train_here(config)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_training_evaluate_and_predict_resolve_the_same(
    channels_last_run: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """One run config on one device: the trainer's runtime, train.json's and the checkpoint's
    provenance, evaluate's (metrics.json) and predict's (the map's tags) agree, with the tile
    size predict takes from the run."""
    cfg = load(channels_last_run / "config.yaml")
    plan = build_plan(cfg, tiny_demo.manifest("aef")["splits"]["train"], 1)
    trainer, _ = build_trainer(cfg, plan, [1] * 61, 1, runtime_of(cfg, CPU))
    expected = Runtime(CPU, "fp32", True, False)  # bf16 and channels_last asked, on a CPU
    assert trainer.runtime == expected and is_channels_last(trainer.model)

    summary = json.loads((channels_last_run / "summary.json").read_text())
    state = checkpoint_file.load(channels_last_run / "best.pt")
    assert runtime_of_record(summary["provenance"]) == expected.record()
    assert runtime_of_record(state["provenance"]) == expected.record()
    tile = tiny_demo.manifest("aef")["tile_size"]
    assert summary["tile_size"] == state["tile_size"] == tile

    run = open_run(channels_last_run, load_class_map(CLASSES_CSV), CLASSES_CSV)
    assert run.runtime(CPU) == expected and run.tile_size == tile
    evaluate_main([f"--run-dir={channels_last_run}", f"--classes={CLASSES_CSV}",
                   f"--out-dir={tmp_path / 'eval'}", "--threads=1"])  # fmt: skip
    record = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert runtime_of_record(record["provenance"]) == expected.record()

    out = tmp_path / "demo_a.tif"
    raster = tiny_demo.rasters["demo_a"]["aef"]
    predict_main([f"--run-dir={channels_last_run}", f"--raster={raster}", "--region=demo_a",
                  f"--classes={CLASSES_CSV}", f"--out={out}", f"--png={out.with_suffix('.png')}",
                  "--overlap=0.5", "--block=1024", "--batch-size=16", "--threads=1"])  # fmt: skip
    with rasterio.open(out) as src:
        tags = src.tags()
    assert {k: tags[f"PROVENANCE_{k.upper()}"] for k in RUNTIME_KEYS} == expected.record()


def test_predict_refuses_a_run_without_its_tile_size(
    channels_last_run: Path, tmp_path: Path, tiny_demo: TinyDemo
) -> None:
    """A checkpoint written before the tile size travelled with the run: refused naming the
    file and the key, not guessed from the shards manifest; --tile (config predict.tile) maps it."""
    old = tmp_path / "runs" / channels_last_run.name
    old.mkdir(parents=True)
    (old / "config.yaml").write_bytes((channels_last_run / "config.yaml").read_bytes())
    state = checkpoint_file.load(channels_last_run / "best.pt")
    del state["tile_size"]
    checkpoint_file.save(old / "best.pt", state)
    out = tmp_path / "map.tif"
    args = [f"--run-dir={old}", f"--raster={tiny_demo.rasters['demo_a']['aef']}",
            "--region=demo_a", f"--classes={CLASSES_CSV}", f"--out={out}",
            f"--png={out.with_suffix('.png')}", "--overlap=0.5", "--block=1024",
            "--batch-size=16", "--threads=1"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        predict_main(args)
    assert f"{old / 'best.pt'}: no 'tile_size'" in str(exc.value)
    assert "predict.tile" in str(exc.value) and not out.exists()
    run = open_run(old, load_class_map(CLASSES_CSV), CLASSES_CSV)
    with pytest.raises(RunError, match="no 'tile_size'"):
        _ = run.tile_size
    predict_main([*args, "--tile=32"])
    assert out.is_file()
