"""train.channels_last: auto picks the memory format measured fastest per architecture/device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TinyDemo
from training_runs import resolve_config, train_here

from emb.training.config import ConfigError, LoopConfig, resolve_channels_last
from emb.training.trainer import model_is_channels_last


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


def test_trainer_auto_follows_the_models_format() -> None:
    """Trainer(channels_last="auto") feeds inputs in the format wrap_model gave the model."""
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.Conv2d(8, 2, 1))
    assert not model_is_channels_last(model)
    assert model_is_channels_last(model.to(memory_format=torch.channels_last))


def test_train_json_records_the_resolved_format(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    """An explicit true runs channels_last (on CPU too) and train.json's provenance says so."""
    config = resolve_config(
        tiny_demo, tmp_path / "run", "train.max_updates=2", "train.channels_last=true",
        arch="deeplab",
    )  # fmt: skip
    assert train_here(config)["provenance"]["channels_last"] == "true"
