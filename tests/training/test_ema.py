"""The fused EMA update gives the values of the per-tensor loop it replaced, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from emb.models import ModelConfig, build_model
from emb.training.ema import ModelEma

TINY_DEEPLAB = ModelConfig(
    arch="deeplab", in_dim=8, widths=(8, 8, 16, 16), depths=(1, 1, 1, 1), decoder_dim=8,
    aspp_rates=(1, 2),
)  # fmt: skip


def loop_update(shadow: nn.Module, model: nn.Module, weight: float) -> None:
    """The update as it was before it was fused: one ``lerp_`` / ``copy_`` per tensor."""
    with torch.no_grad():
        for s, v in zip(shadow.parameters(), model.parameters(), strict=True):
            s.lerp_(v.detach(), weight)
        for s, v in zip(shadow.buffers(), model.buffers(), strict=True):
            s.copy_(v)


def train_a_little(model: nn.Module, step: int) -> None:
    """One SGD step on a random batch: parameters and BatchNorm buffers both change."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(2, 8, 16, 16, generator=g)
    model.train()
    loss = sum(out.square().mean() for out in model(x).values())
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
            p.grad = None


def assert_bitwise_equal(a: nn.Module, b: nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert x.dtype == y.dtype and x.numpy().tobytes() == y.numpy().tobytes(), name


@pytest.mark.parametrize("decay", [0.9, 0.9999])
def test_fused_update_equals_the_per_tensor_loop_bit_for_bit(decay: float) -> None:
    torch.manual_seed(0)
    model = build_model(TINY_DEEPLAB)
    ema = ModelEma(model, decay)
    reference = copy.deepcopy(ema.module)
    assert any(b.dtype == torch.int64 for b in reference.buffers())  # num_batches_tracked
    for step in range(6):
        train_a_little(model, step)
        loop_update(reference, model, 1.0 - ema.current_decay())
        ema.update(model)
        assert_bitwise_equal(ema.module, reference)
    assert ema.updates == 6
    params = dict(model.named_parameters())
    assert any(not torch.equal(v, params[k]) for k, v in ema.module.named_parameters())


def test_update_refuses_a_model_with_other_tensors() -> None:
    torch.manual_seed(0)
    ema = ModelEma(build_model(TINY_DEEPLAB), 0.9)
    with pytest.raises(ValueError, match="shorter|longer"):
        ema.update(nn.Linear(2, 2))
