"""The fused EMA update gives the values of the per-tensor loop it replaced, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from emb.models import ModelConfig, build_model
from emb.models.flat_tensors import flats_of, flatten_
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
    x = torch.randn(2, 8, 16, 16, generator=g).to(next(model.parameters()).device)
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
    ema = ModelEma(model, decay, warmup=True)
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
    ema = ModelEma(build_model(TINY_DEEPLAB), 0.9, warmup=True)
    with pytest.raises(ValueError, match="shorter|longer"):
        ema.update(nn.Linear(2, 2))


def flat_model(channels_last: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = build_model(TINY_DEEPLAB)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    assert flatten_(model, "parameters") and flatten_(model, "buffers")
    return model


@pytest.mark.parametrize("channels_last", [False, True])
def test_flattened_model_keeps_values_formats_and_outputs(channels_last: bool) -> None:
    """Flat storage changes where the tensors live, not what the model computes."""
    torch.manual_seed(0)
    plain = build_model(TINY_DEEPLAB)
    if channels_last:
        plain = plain.to(memory_format=torch.channels_last)
    flat = copy.deepcopy(plain)
    assert flatten_(flat, "parameters") and flatten_(flat, "buffers")
    for (name, a), b in zip(plain.state_dict().items(), flat.state_dict().values(), strict=True):
        assert a.stride() == b.stride() and torch.equal(a, b), name
    params = list(flat.parameters())
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1  # one flat tensor
    assert flats_of(params) is not None and flats_of(list(flat.buffers())) is not None
    x = torch.randn(2, 8, 16, 16)
    plain.eval(), flat.eval()
    for key, out in plain(x).items():
        assert torch.equal(out, flat(x)[key]), key


CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_flat_ema_equals_the_per_tensor_ema_over_100_steps(device: str) -> None:
    """The one-kernel update (flat model, flat EMA) against the per-tensor update of an
    unflattened twin: within 1e-6 over 100 steps, skipped steps changing neither."""
    torch.manual_seed(0)
    twin = build_model(TINY_DEEPLAB).to(device)
    model = copy.deepcopy(twin)
    assert flatten_(model, "parameters") and flatten_(model, "buffers")
    ema, reference = ModelEma(model, 0.99, True), ModelEma(twin, 0.99, True)
    assert ema._params.pairs is not None and reference._params.pairs is None
    for step in range(100):
        train_a_little(model, step)
        train_a_little(twin, step)
        applied = torch.tensor(step % 7 != 3, device=device)  # every 7th step skipped
        ema.update(model, applied)
        reference.update(twin, applied)
    assert ema.updates == reference.updates == 100 - len(range(3, 100, 7))
    for (name, a), b in zip(ema.module.state_dict().items(),
                            reference.module.state_dict().values(), strict=True):  # fmt: skip
        assert torch.allclose(a.double(), b.double(), rtol=0, atol=1e-6), name


def aten_ops(fn) -> int:
    """Operators ``fn`` runs, as the profiler records them (each one at least one kernel)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def test_flat_ema_update_runs_the_same_ops_whatever_the_tensor_count() -> None:
    """The point of the flat form: the update's op count does not grow with the model's
    tensors (the per-tensor fallback runs an op or more per tensor)."""
    counts = {}
    for depths in [(1, 1, 1, 1), (2, 2, 3, 2)]:
        cfg = ModelConfig(**{**TINY_DEEPLAB.__dict__, "depths": depths})
        torch.manual_seed(0)
        model = build_model(cfg)
        twin = copy.deepcopy(model)
        assert flatten_(model, "parameters") and flatten_(model, "buffers")
        ema, reference = ModelEma(model, 0.99, True), ModelEma(twin, 0.99, True)
        tensors = len(list(model.parameters())) + len(list(model.buffers()))
        flat = aten_ops(lambda: ema.update(model, torch.tensor(True)))  # noqa: B023
        per_tensor = aten_ops(lambda: reference.update(twin, torch.tensor(True)))  # noqa: B023
        counts[depths] = (tensors, flat, per_tensor)
    (small, flat_small, per_small), (big, flat_big, per_big) = counts.values()
    assert big > small + 20, counts
    assert flat_small == flat_big < small < per_small < per_big, counts


def test_a_model_whose_tensors_were_replaced_falls_back_to_the_per_tensor_update() -> None:
    """``load_state_dict(assign=True)`` replaces the flat views: the EMA notices and stays
    right instead of averaging the stale flat tensor."""
    model = flat_model()
    ema = ModelEma(model, 0.5, warmup=False)
    fresh = build_model(TINY_DEEPLAB).state_dict()
    model.load_state_dict({k: v + 1 if v.is_floating_point() else v for k, v in fresh.items()},
                          assign=True)  # fmt: skip
    assert ema._params.get(list(ema.module.parameters()), list(model.parameters())) is None
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    ema.update(model)
    for name, p in model.named_parameters():
        want = before[name].lerp(p.detach(), 0.5)
        assert torch.allclose(ema.module.state_dict()[name], want), name
