"""train.channels_last through the loop: the runtime's resolution (tests/models/test_runtime.py)
is the format the model trains in, the inputs follow it, and train.json records it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TinyDemo
from training_runs import resolve_config

from emb.classes import ClassMap
from emb.loading.dequantize import Dequantize
from emb.models import ModelConfig, build_model
from emb.models.runtime import CPU_HOST, Host, Runtime
from emb.training.loop import build_loop, run
from emb.training.loss import HierarchyTargets, MultiHeadLoss
from emb.training.run_config import LoopConfig, load
from emb.training.schedule import warmup_cosine
from emb.training.stop_request import StopRequest
from emb.training.trainer import Trainer


def model_is_channels_last(model: torch.nn.Module) -> bool:
    """Whether the model's 4-D weights are in channels_last."""
    return any(
        p.dim() == 4
        and not p.is_contiguous()
        and p.is_contiguous(memory_format=torch.channels_last)
        for p in model.parameters()
    )


TINY_DEEPLAB = ModelConfig(
    arch="deeplab", in_dim=64, widths=(8, 8, 16, 16), depths=(1, 1, 1, 1), decoder_dim=8,
    aspp_rates=(1, 2),
)  # fmt: skip
CPU = torch.device("cpu")


def tiny_trainer(model: torch.nn.Module, class_map: ClassMap, runtime: Runtime) -> Trainer:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trainer(
        model, MultiHeadLoss({"l1": 0.1, "l2": 0.3, "l3": 1.0}, 0.0),
        HierarchyTargets(class_map), Dequantize("aef"), opt,
        warmup_cosine(opt, 1, 10, 1e-3, 1e-5, 0), runtime, LoopConfig(), None,
    )  # fmt: skip


@pytest.mark.parametrize("channels_last", [True, False])
def test_trainer_feeds_the_resolved_format(class_map: ClassMap, channels_last: bool) -> None:
    """A Trainer given the resolved format (the model prepared in it by the runtime) feeds its
    inputs, and so takes its steps, in that format."""
    torch.manual_seed(0)
    runtime = Runtime(CPU, "fp32", channels_last, False, None)
    model = runtime.prepare(build_model(TINY_DEEPLAB), training=True)
    assert model_is_channels_last(model) is channels_last
    trainer = tiny_trainer(model, class_map, runtime)
    assert trainer.runtime is runtime  # taken as given, never rebuilt
    wanted = torch.channels_last if channels_last else torch.contiguous_format
    g = torch.Generator().manual_seed(1)
    batch = {"emb": torch.randint(-127, 128, (2, 64, 16, 16), generator=g, dtype=torch.int8),
             "label": torch.randint(0, 61, (2, 16, 16), generator=g).to(torch.uint8)}  # fmt: skip
    x, _ = trainer.inputs(batch)
    assert x.is_contiguous(memory_format=wanted)
    assert x.is_contiguous() is not channels_last  # a (2, 64, 16, 16) NHWC tensor is not NCHW
    assert trainer.train_step([batch]).applied


def test_a_runtime_takes_no_auto() -> None:
    """Nothing resolves the setting a second time: a Runtime holds the resolved value only."""
    with pytest.raises(ValueError, match=r"channels_last: expected the resolved true or false"):
        Runtime(CPU, "fp32", "auto", False, None)  # type: ignore[arg-type]


def train_json_format(config: Path, host: Host) -> tuple[str, bool]:
    """train.json's recorded format, and whether the trained model was in channels_last."""
    cfg = load(config)
    runtime = Runtime.resolve(cfg.train, cfg.model.arch, host, training=True)
    loop = build_loop(cfg, config.parent, 0, 1, runtime, StopRequest())
    loop.log.close()
    used = model_is_channels_last(loop.trainer.model)
    return run(cfg, config.parent, 0, 1, runtime)["provenance"]["channels_last"], used


@pytest.mark.parametrize(("setting", "expected"), [("auto", "false"), ("true", "true")])
def test_train_json_records_the_resolved_format(
    tiny_demo: TinyDemo, tmp_path: Path, setting: str, expected: str
) -> None:
    """On a CPU, auto resolves to contiguous for DeepLab too (channels_last is a CUDA gain)
    through the loop; an explicit true runs channels_last; train.json says which ran."""
    config = resolve_config(
        tiny_demo, tmp_path / "run", "train.max_updates=2", f"train.channels_last={setting}",
        arch="deeplab",
    )  # fmt: skip
    recorded, used = train_json_format(config, CPU_HOST)
    assert recorded == expected and used is (expected == "true")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("arch", "expected"), [("deeplab", "true"), ("segformer", "false")])
def test_auto_resolves_per_architecture_on_cuda(
    tiny_demo: TinyDemo, tmp_path: Path, arch: str, expected: str
) -> None:
    """On an NVIDIA GPU auto runs DeepLab in channels_last, SegFormer contiguous."""
    if torch.version.hip:
        pytest.skip("ROCm keeps auto contiguous")
    config = resolve_config(
        tiny_demo, tmp_path / "run", "train.max_updates=2", "train.channels_last=auto", arch=arch
    )
    recorded, used = train_json_format(config, Host(gpus=1, local_rank=0))
    assert recorded == expected and used is (expected == "true")
