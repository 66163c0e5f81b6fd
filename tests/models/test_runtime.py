"""One device module (issue 43, 52): the device, precision, channels_last and compile (with its
memory budget) resolved once per process by the measured rules from the config, the
architecture and what the process finds (its Host), applied to model and inputs, the same for
training, evaluation and prediction of one run config, and recorded in train.json, the
checkpoint, metrics.json and the maps; the training tile size travels with the run."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import rasterio
import torch
from conftest import CLASSES_CSV, REPO, TinyDemo
from training_runs import cpu_runtime, resolve_config, train_here

from emb.classes import load_class_map
from emb.evaluation.evaluate import main as evaluate_main
from emb.evaluation.predict import main as predict_main
from emb.evaluation.runs import RunError, open_run
from emb.models import ModelConfig, build_model
from emb.models.flat_tensors import flats_of
from emb.models.runtime import (
    CPU_HOST,
    Host,
    Runtime,
    pick_device,
    resolve_channels_last,
    resolve_precision,
)
from emb.training import checkpoint_file
from emb.training.distributed import wrap_model
from emb.training.loop import build_trainer
from emb.training.run_config import LoopConfig, load
from emb.training.schedule import build_plan

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
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
    """Every architecture x device type x ROCm x setting; true/false are taken as set; compile
    and its memory budget for training only."""
    settings = LoopConfig(precision=precision, channels_last=channels_last, compile=compile,
                          compile_memory_budget=0.5)  # fmt: skip
    host = Host(gpus=1, local_rank=0, hip=hip) if device_type == "cuda" else Host(0, hip=hip)
    device = CUDA if device_type == "cuda" else CPU
    wanted_cl = AUTO_CHANNELS_LAST[arch, device_type, hip] if channels_last == "auto" \
        else channels_last  # fmt: skip
    for training in (True, False):
        runtime = Runtime.resolve(settings, arch, host, training=training)
        compiled = compile and training
        assert runtime == Runtime(device, PRECISION[device_type, precision], wanted_cl,
                                  compiled, 0.5 if compiled else None)  # fmt: skip
        assert resolve_channels_last(channels_last, arch, device_type, hip) is wanted_cl
        assert resolve_precision(precision, device_type) == PRECISION[device_type, precision]


def test_default_is_auto_and_other_words_refused() -> None:
    assert LoopConfig().channels_last == "auto"
    with pytest.raises(ValueError, match=r"train.channels_last: expected auto.*'yes'"):
        resolve_channels_last("yes", "deeplab", "cuda")
    with pytest.raises(ValueError, match=r"train.precision: expected one of .*'fp8'"):
        Runtime.resolve(LoopConfig(precision="fp8"), "deeplab", CPU_HOST, training=True)
    with pytest.raises(ValueError, match=r"channels_last: expected the resolved true or false"):
        Runtime(CPU, "fp32", "auto", False, None)  # type: ignore[arg-type]


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
    runtime = Runtime(CPU, "fp32", channels_last, compile, None)
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
    with Runtime(CPU, precision, False, False, None).autocast():
        out = layer(torch.ones(2, 4))
    assert out.dtype == (dtype or torch.float32)


# train.grad_scaler at the resolved precision: as set, or with fp16 only when unset (None);
# an fp16 setting on a CPU resolves to fp32, so it gets none unless asked
GRAD_SCALER = {
    ("fp16", None): True, ("bf16", None): False, ("fp32", None): False,
    ("fp16", False): False, ("fp16", True): True, ("fp32", True): True, ("fp32", False): False,
}  # fmt: skip


@pytest.mark.parametrize(("precision", "setting"), list(GRAD_SCALER))
def test_the_grad_scaler_is_the_runtimes_rule_at_the_resolved_precision(
    precision: str, setting: bool | None
) -> None:
    scaler = Runtime(CPU, precision, False, False, None).grad_scaler(setting)
    assert (scaler is not None) is GRAD_SCALER[precision, setting]
    assert scaler is None or isinstance(scaler, torch.amp.GradScaler)


def test_a_runtime_states_no_precision_of_its_own() -> None:
    """train.precision's default is the schema's (bf16); a Runtime's fp32 default had restated
    one that differs from it, so a Runtime is built with its precision."""
    with pytest.raises(TypeError, match="precision"):
        Runtime(CPU)  # type: ignore[call-arg]


def test_a_runtime_states_no_setting_of_its_own() -> None:
    """Nor channels_last, compile or its memory budget: a channels_last=False default had
    posed as train.channels_last, whose default is auto (issue 56)."""
    with pytest.raises(TypeError, match="'channels_last', 'compile', and 'compile_memory_budget'"):
        Runtime(CPU, "fp32")  # type: ignore[call-arg]


def test_a_misspelt_precision_is_refused_where_the_setting_enters() -> None:
    """One check, in resolve_precision: on a CPU the setting resolves to fp32, so a misspelt
    one would otherwise run unseen."""
    for device_type in ("cpu", "cuda"):
        with pytest.raises(ValueError, match=r"train.precision: expected one of .*'fp8'"):
            resolve_precision("fp8", device_type)


def test_record_names_what_ran() -> None:
    assert Runtime(CUDA, "bf16", True, False, None).record() == {
        "device_type": "cuda", "precision": "bf16", "channels_last": "true", "compile": "false",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("host", "training", "device"),
    [
        (Host(gpus=4, local_rank=2), True, torch.device("cuda", 2)),  # a torchrun rank
        (Host(gpus=4), True, torch.device("cuda", 0)),  # plain python: the first GPU
        (Host(gpus=4, local_rank=3), False, torch.device("cuda", 3)),  # evaluate under torchrun
        (Host(gpus=0, local_rank=1), True, CPU),  # no GPU
        (Host(gpus=0), False, CPU),
    ],
)
def test_the_device_is_the_local_ranks_gpu_or_the_cpu(
    host: Host, training: bool, device: torch.device
) -> None:
    assert pick_device(host, training) == device


def test_the_host_is_read_from_the_environment_it_is_given() -> None:
    """Only the stage reads the environment; the rest take the Host as plain data."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    hip = bool(torch.version.hip)
    assert Host.here({"LOCAL_RANK": "3", "RANK": "7"}) == Host(gpus, 3, hip)
    assert Host.here({}) == Host(gpus, None, hip)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU process claims a GPU instead")
def test_a_cpu_process_runs_on_the_threads_its_rule_gave_it() -> None:
    before = torch.get_num_threads()
    try:
        Runtime(CPU, "fp32", False, False, None).occupy(threads=3)
        assert torch.get_num_threads() == 3
        Runtime(CPU, "fp32", False, False, None).occupy(threads=0)
        assert torch.get_num_threads() == 1
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
    trainer, _ = build_trainer(cfg, plan, [1] * 61, 1, cpu_runtime(cfg))
    expected = Runtime(CPU, "fp32", True, False, None)  # bf16 and channels_last asked, on a CPU
    assert trainer.runtime == expected and is_channels_last(trainer.model)

    summary = json.loads((channels_last_run / "summary.json").read_text())
    state = checkpoint_file.load(channels_last_run / "best.pt")
    assert runtime_of_record(summary["provenance"]) == expected.record()
    assert runtime_of_record(state["provenance"]) == expected.record()
    # the config a checkpoint records keeps the precision as set; what ran is its provenance
    # (a resume compares that: emb.training.checkpoint_file.check_resumable)
    assert state["config"]["train"]["precision"] == "bf16"
    assert load(channels_last_run / "config.yaml").resolved["train"] == state["config"]["train"]
    tile = tiny_demo.manifest("aef")["tile_size"]
    assert summary["tile_size"] == state["tile_size"] == tile

    run = open_run(channels_last_run, load_class_map(CLASSES_CSV), CLASSES_CSV)
    assert run.runtime(CPU_HOST) == expected and run.tile_size == tile
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


# Where each part of the runtime may be decided: the runtime module alone, entered once per
# process by a stage (train resolves for training, a trained run for evaluate and predict).
RESOLVERS = {"resolve_precision", "resolve_channels_last", "pick_device", "claim_gpu"}
RESOLVES = {"emb/training/train.py", "emb/evaluation/runs.py"}  # Runtime.resolve(...)


def runtime_decisions(path: Path) -> list[str]:
    """What ``path`` decides itself that the runtime decides: its resolver calls, a Runtime
    built or resolved, the CUDA device set, LOCAL_RANK read, a compile memory budget set."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            owner = getattr(func, "value", None)
            if name in RESOLVERS | {"Runtime", "set_device"}:
                found.append(f"{name}() at line {node.lineno}")
            elif name == "resolve" and getattr(owner, "id", "") == "Runtime":
                found.append(f"Runtime.resolve() at line {node.lineno}")
        elif isinstance(node, ast.Constant) and node.value == "LOCAL_RANK":
            found.append(f"'LOCAL_RANK' at line {node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr == "activation_memory_budget":
            found.append(f"activation_memory_budget at line {node.lineno}")
    return found


def test_only_the_runtime_decides_device_precision_format_and_compile() -> None:
    """No module but emb.models.runtime resolves or rebuilds a part of the runtime; the two
    stage entries resolve it once; wrap_model applies the budget the runtime holds."""
    src = REPO / "src"
    allowed = {
        "emb/models/runtime.py": None,
        "emb/training/distributed.py": ["activation_memory_budget"],
        **{path: ["Runtime.resolve()"] for path in RESOLVES},
    }
    wrong = {}
    for path in sorted((src / "emb").rglob("*.py")):
        name = path.relative_to(src).as_posix()
        found = runtime_decisions(path)
        if name in allowed and allowed[name] is None:
            continue
        kinds = [f.split(" at ")[0] for f in found]
        if kinds != (allowed.get(name) or []):
            wrong[name] = found
    assert wrong == {}


def test_wrap_model_compiles_with_the_runtimes_memory_budget() -> None:
    import torch._functorch.config as functorch_config

    before = functorch_config.activation_memory_budget
    try:
        runtime = Runtime(CPU, "fp32", False, True, 0.25)
        wrapped = wrap_model(torch.nn.Linear(2, 2), 1, runtime)
        assert functorch_config.activation_memory_budget == 0.25
        assert wrapped is not None and hasattr(wrapped, "_orig_mod")  # compiled, lazily
        eager = wrap_model(torch.nn.Linear(2, 2), 1, Runtime(CPU, "fp32", False, False, None))
        assert not hasattr(eager, "_orig_mod")
    finally:
        functorch_config.activation_memory_budget = before
