"""Tests of emb.models: shapes, gradients, input-norm invariance, stem cost, config handling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from emb.models import ModelConfig, build_model, count_parameters
from emb.models.blocks import conv_macs

ARCHS = ("segformer", "deeplab")
TINY = {"widths": (8, 16, 32, 64), "depths": (1, 1, 1, 1), "decoder_dim": 32}
SHAPES = {"l1": 2, "l2": 7, "l3": 61}


def tiny(arch: str, in_dim: int = 64, **kw: object) -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(arch=arch, in_dim=in_dim, **{**TINY, **kw}))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("in_dim", [64, 128])
@pytest.mark.parametrize("hw", [(64, 64), (32, 96)])
def test_output_shapes(arch: str, in_dim: int, hw: tuple[int, int]) -> None:
    model = tiny(arch, in_dim).eval()
    with torch.no_grad():
        out = model(torch.randn(2, in_dim, *hw))
    assert set(out) == set(SHAPES)
    for key, n in SHAPES.items():
        assert out[key].shape == (2, n, *hw)
        assert out[key].dtype == torch.float32
        assert torch.isfinite(out[key]).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_reach_every_parameter(arch: str) -> None:
    model = tiny(arch, 128, input_norm=True).train()
    x = torch.randn(2, 128, 32, 32)
    out = model(x)
    loss = sum(F.cross_entropy(out[k], torch.randint(0, n, (2, 32, 32))) for k, n in SHAPES.items())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    assert next(model.stem.parameters()).grad.abs().sum() > 0
    for key in SHAPES:
        assert model.heads.heads[key].weight.grad.abs().sum() > 0, key


@pytest.mark.parametrize("arch", ARCHS)
def test_input_norm_scale_invariance(arch: str) -> None:
    x = torch.randn(2, 64, 32, 32)
    scale = torch.rand(2, 1, 32, 32) * 9.9 + 0.1  # one positive factor per pixel
    with torch.no_grad():
        normed = tiny(arch, input_norm=True).eval()
        a, b = normed(x), normed(x * scale)
        for key in SHAPES:
            assert torch.allclose(a[key], b[key], atol=1e-4), key
        plain = tiny(arch, input_norm=False).eval()
        a, b = plain(x), plain(x * scale)
        assert not torch.allclose(a["l3"], b["l3"], atol=1e-4)


def test_deeplab_batch_sizes() -> None:
    model = tiny("deeplab").train()
    out = model(torch.randn(2, 64, 32, 32))
    assert out["l3"].shape == (2, 61, 32, 32)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(1, 64, 32, 32))
    assert out["l3"].shape == (1, 61, 32, 32)


@pytest.mark.parametrize("arch", ARCHS)
def test_drop_path_train_random_eval_deterministic(arch: str) -> None:
    model = tiny(arch, drop_path=0.5)
    x = torch.randn(4, 64, 32, 32)
    with torch.no_grad():
        # Residual branches start (near) zero by design (layer scale 1e-6, zero-init last BN);
        # open them up so dropping one visibly changes the output.
        for name, p in model.named_parameters():
            if name.endswith(("gamma", "bn2.weight")):
                p.fill_(1.0)
        model.eval()
        assert torch.equal(model(x)["l3"], model(x)["l3"])
        model.train()
        torch.manual_seed(1)
        a = model(x)["l3"]
        b = model(x)["l3"]
    assert not torch.equal(a, b)


@pytest.mark.parametrize("arch", ARCHS)
def test_stem_is_cheap(arch: str) -> None:
    """Whole-stem conv MACs per input pixel at in_dim 128 vs a 7x7 conv 128->64 on the input.

    A 7x7/2 conv costs 128*64*49 MACs per output pixel, i.e. a quarter of that per input pixel;
    even at stride 4 (a sixteenth) it would cost more than our stem.
    """
    model = build_model(ModelConfig(arch=arch, in_dim=128)).eval()
    h = w = 64
    stem_out = model.stem(torch.randn(1, 128, h, w))
    assert stem_out.shape == (1, 64, h // 4, w // 4)  # stage 1 at stride 4
    first_conv = next(m for m in model.stem.modules() if isinstance(m, nn.Conv2d))
    assert first_conv.kernel_size == (1, 1) and first_conv.in_channels == 128
    per_pixel = conv_macs(model.stem, torch.randn(1, 128, h, w)) / (h * w)
    if arch == "segformer":  # 1x1 128->64 + 4x4/4 64->64: 128*64 + 64*64*16/16
        assert per_pixel == 128 * 64 + 64 * 64
    else:  # 1x1 128->64 + 3x3/2 64->64 + 3x3/2 64->64
        assert per_pixel == 128 * 64 + 64 * 64 * 9 / 4 + 64 * 64 * 9 / 16
    assert per_pixel < 128 * 64 * 49 / 4
    assert per_pixel < 128 * 64 * 49 / 16


def test_conv_macs_counts_a_known_conv() -> None:
    conv = nn.Conv2d(128, 64, 7, stride=2, padding=3)
    assert conv_macs(conv, torch.randn(1, 128, 64, 64)) == 32 * 32 * 64 * 128 * 49


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"arch": "unet"}, "arch"),
        ({"widths": (8, 16, 32), "depths": (1, 1, 1, 1)}, "widths"),
        ({"in_dim": 0}, "in_dim"),
        ({"num_classes": (2, 7)}, "num_classes"),
        ({"aspp_rates": ()}, "aspp_rates"),
        ({"drop_path": 1.5}, "drop_path"),
    ],
)
def test_invalid_config_raises(overrides: dict, field: str) -> None:
    cfg = ModelConfig(**{"arch": "segformer", "in_dim": 64, **TINY, **overrides})
    with pytest.raises(ValueError, match=field) as err:
        build_model(cfg)
    if field == "arch":
        assert "segformer" in str(err.value) and "deeplab" in str(err.value)
    if field == "widths":
        assert "depths" in str(err.value)


def test_config_from_yaml_like_dict() -> None:
    data = {
        "arch": "deeplab",
        "in_dim": 128,
        "widths": [16, 32, 64, 128],
        "depths": [1, 1, 2, 1],
        "decoder_dim": 64,
        "aspp_rates": [1, 2, 3],
        "input_norm": True,
        "num_classes": [2, 7, 61],
        "drop_path": 0.1,
    }
    from_lists = ModelConfig(**data)
    from_tuples = ModelConfig(
        arch="deeplab",
        in_dim=128,
        widths=(16, 32, 64, 128),
        depths=(1, 1, 2, 1),
        decoder_dim=64,
        aspp_rates=(1, 2, 3),
        input_norm=True,
        num_classes=(2, 7, 61),
        drop_path=0.1,
    )
    assert from_lists == from_tuples
    assert hash(from_lists) == hash(from_tuples)
    assert isinstance(from_lists.widths, tuple) and isinstance(from_lists.num_classes, tuple)
    build_model(from_lists)


def test_count_parameters_ignores_frozen() -> None:
    model = tiny("segformer")
    total = count_parameters(model)
    assert total == sum(p.numel() for p in model.parameters())
    for p in model.heads.parameters():
        p.requires_grad_(False)
    assert count_parameters(model) == total - sum(p.numel() for p in model.heads.parameters())
