"""train.channels_last: auto picks the memory format measured fastest per architecture/device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TinyDemo
from training_runs import resolve_config

from emb.classes import ClassMap
from emb.loading.dequantize import Dequantize
from emb.models import ModelConfig, build_model
from emb.training.distributed import wrap_model
from emb.training.loop import build_loop, run
from emb.training.loss import HierarchyTargets, MultiHeadLoss
from emb.training.run_config import ConfigError, LoopConfig, load, resolve_channels_last
from emb.training.schedule import warmup_cosine
from emb.training.stop_request import StopRequest
from emb.training.trainer import Trainer, model_is_channels_last


@pytest.mark.parametrize(
    ("arch", "device_type", "hip", "expected"),
    [
        ("deeplab", "cuda", False, True),  # 1.10x / 1.28x faster on an H200
        ("segformer", "cuda", False, False),  # 0.97-1.03x: not worth it
        ("deeplab", "cuda", True, False),  # ROCm: MIOpen NHWC depthwise/grouped kernels slow
        ("segformer", "cuda", True, False),
        ("deeplab", "cpu", False, False),
        ("segformer", "cpu", False, False),
    ],
)
def test_auto_by_architecture_and_device(
    arch: str, device_type: str, hip: bool, expected: bool
) -> None:
    assert resolve_channels_last("auto", arch, device_type, hip) is expected


@pytest.mark.parametrize("setting", [True, False])
def test_explicit_setting_wins(setting: bool) -> None:
    for arch in ("deeplab", "segformer"):
        for device_type, hip in (("cuda", False), ("cuda", True), ("cpu", False)):
            assert resolve_channels_last(setting, arch, device_type, hip) is setting


def test_default_is_auto_and_other_words_refused() -> None:
    assert LoopConfig().channels_last == "auto"
    with pytest.raises(ConfigError, match=r"train.channels_last: expected auto.*'yes'"):
        resolve_channels_last("yes", "deeplab", "cuda")


TINY_DEEPLAB = ModelConfig(
    arch="deeplab", in_dim=64, widths=(8, 8, 16, 16), depths=(1, 1, 1, 1), decoder_dim=8,
    aspp_rates=(1, 2),
)  # fmt: skip
CPU = torch.device("cpu")


@pytest.mark.parametrize("channels_last", [True, False])
def test_trainer_auto_follows_the_models_format(class_map: ClassMap, channels_last: bool) -> None:
    """A Trainer left at channels_last="auto" feeds its inputs, and so takes its steps, in
    the format wrap_model gave the model."""
    torch.manual_seed(0)
    model = wrap_model(build_model(TINY_DEEPLAB), 1, CPU, channels_last=channels_last)
    assert model_is_channels_last(model) is channels_last
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = Trainer(
        model, MultiHeadLoss({"l1": 0.1, "l2": 0.3, "l3": 1.0}, 0.0),
        HierarchyTargets(class_map), Dequantize("aef"), opt,
        warmup_cosine(opt, 1, 10, 1e-3, 1e-5), CPU, precision="fp32",
    )  # fmt: skip
    wanted = torch.channels_last if channels_last else torch.contiguous_format
    assert trainer.memory_format == wanted
    g = torch.Generator().manual_seed(1)
    batch = {"emb": torch.randint(-127, 128, (2, 64, 16, 16), generator=g, dtype=torch.int8),
             "label": torch.randint(0, 61, (2, 16, 16), generator=g).to(torch.uint8)}  # fmt: skip
    x, _ = trainer.inputs(batch)
    assert x.is_contiguous(memory_format=wanted)
    assert x.is_contiguous() is not channels_last  # a (2, 64, 16, 16) NHWC tensor is not NCHW
    assert trainer.train_step([batch]).applied


def train_json_format(config: Path, device: torch.device) -> tuple[str, bool]:
    """train.json's recorded format, and whether the trained model was in channels_last."""
    cfg = load(config)
    loop = build_loop(cfg, config.parent, 0, 1, device, StopRequest())
    loop.log.close()
    used = model_is_channels_last(loop.trainer.model)
    return run(cfg, config.parent, 0, 1, device)["provenance"]["channels_last"], used


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
    recorded, used = train_json_format(config, CPU)
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
    recorded, used = train_json_format(config, torch.device("cuda"))
    assert recorded == expected and used is (expected == "true")
