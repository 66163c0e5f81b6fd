"""The training step and its guards, in one process: accumulation, schedule, EMA, precision,
non-finite gradients, BatchNorm guards, checkpoint safety and the stop request."""

from __future__ import annotations

import copy
import os
import pickle
import signal
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import REPO
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from emb.classes import N_L1, N_L2, N_L3
from emb.loading.dequantize import Dequantize
from emb.models import ModelConfig, build_model
from emb.models.runtime import Runtime
from emb.training import checkpoint_file
from emb.training.ema import ModelEma
from emb.training.loss import HierarchyTargets, MultiHeadLoss, class_weights_from_histogram
from emb.training.run_config import ConfigError, LoopConfig
from emb.training.schedule import lr_factor, warmup_cosine
from emb.training.stop_request import StopRequest
from emb.training.train_config import resolve
from emb.training.trainer import Trainer, TrainingDiverged

WEIGHTS = {"l1": 0.1, "l2": 0.3, "l3": 1.0}
TINY_DEEPLAB = ModelConfig(
    arch="deeplab", in_dim=64, widths=(8, 8, 16, 16), depths=(1, 1, 1, 1), decoder_dim=8,
    aspp_rates=(1, 2),
)  # fmt: skip


class GroupNormNet(nn.Module):
    """A model without batch statistics: per-sample results do not depend on the batch."""

    def __init__(self, in_dim: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_dim, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.GELU()
        )
        self.heads = nn.ModuleDict(
            {k: nn.Conv2d(16, n, 1) for k, n in (("l1", N_L1), ("l2", N_L2), ("l3", N_L3))}
        )

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.body(x)
        return {k: head(h) for k, head in self.heads.items()}


def compact_batch(n: int, seed: int, size: int = 8, labelled: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randint(-127, 128, (n, 64, size, size), generator=g, dtype=torch.int8)
    label = torch.randint(0, N_L3, (n, size, size), generator=g).to(torch.uint8)
    if not labelled:
        label[:, : size // 2] = 255
    return {"emb": emb, "label": label}


def make_trainer(model: nn.Module, class_map, lr: float = 1e-2, total: int = 50, **kw) -> Trainer:
    # fused, as the loop builds it: the step skips on the device (an unfused one asks the host)
    optimizer = kw.pop("optimizer", partial(torch.optim.AdamW, fused=True))
    opt = optimizer(model.parameters(), lr=lr)
    sched = warmup_cosine(opt, 3, total, lr, 1e-4, kw.pop("cooldown", 0))
    runtime = Runtime(torch.device("cpu"), kw.pop("precision", "fp32"), False, False, None)
    ema = kw.pop("ema", None)  # the rest: train: settings, the schema's defaults where not given
    return Trainer(
        model, MultiHeadLoss(WEIGHTS, 0.05), HierarchyTargets(class_map), Dequantize("aef"),
        opt, sched, runtime, LoopConfig(precision=runtime.precision, **kw), ema,
    )  # fmt: skip


def state_of(trainer: Trainer) -> list[torch.Tensor]:
    tensors = [t.clone() for t in trainer.model.state_dict().values()]
    if trainer.ema is not None:
        tensors += [t.clone() for t in trainer.ema.module.state_dict().values()]
    return tensors


def test_gradient_accumulation_4x8_equals_one_batch_of_32(class_map) -> None:
    torch.manual_seed(0)
    model = GroupNormNet()
    # SGD: the update is linear in the gradient (Adam's first step is about sign(g), which
    # turns rounding noise in near-zero gradients into full-size differences).
    one = make_trainer(copy.deepcopy(model), class_map, optimizer=torch.optim.SGD)
    four = make_trainer(model, class_map, optimizer=torch.optim.SGD)
    big = compact_batch(32, seed=1)
    micro = [{k: v[i : i + 8] for k, v in big.items()} for i in range(0, 32, 8)]
    r1, r4 = one.train_step([big]), four.train_step(micro)
    assert r1.applied and r4.applied and one.step == four.step == 1
    assert float(r1.grad_norm) == pytest.approx(float(r4.grad_norm), rel=1e-5)
    for a, b in zip(one.model.parameters(), four.model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert one.scheduler.get_last_lr() == four.scheduler.get_last_lr()


def test_lr_equals_the_closed_form_at_every_step_across_a_resume(class_map, tmp_path) -> None:
    torch.manual_seed(0)
    total, warmup, base, floor, cooldown = 20, 3, 1e-2, 1e-4, 5
    trainer = make_trainer(GroupNormNet(), class_map, base, total, cooldown=cooldown)
    seen = []
    for i in range(9):
        seen.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.train_step([compact_batch(2, seed=i)])
    checkpoint_file.save(
        tmp_path / "last.pt",
        {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
         "scheduler": trainer.scheduler.state_dict()},
    )  # fmt: skip
    state = checkpoint_file.load(tmp_path / "last.pt")
    resumed = make_trainer(GroupNormNet(), class_map, base, total, cooldown=cooldown)
    resumed.model.load_state_dict(state["model"])
    resumed.optimizer.load_state_dict(state["optimizer"])
    resumed.scheduler.load_state_dict(state["scheduler"])
    for i in range(9, total):
        seen.append(resumed.optimizer.param_groups[0]["lr"])
        resumed.train_step([compact_batch(2, seed=i)])
    expected = [base * lr_factor(s, warmup, total, floor / base, cooldown) for s in range(total)]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert seen[-1] == pytest.approx(floor + (expected[-cooldown] - floor) / cooldown, rel=1e-9)


def test_cooldown_falls_linearly_to_min_lr_from_the_cosine() -> None:
    f = [lr_factor(s, 2, 12, 0.01, 4) for s in range(13)]
    assert f[12] == pytest.approx(0.01)
    steps = [f[i] - f[i + 1] for i in range(8, 12)]
    assert steps == pytest.approx([steps[0]] * 4)  # linear
    assert f[:8] == [lr_factor(s, 2, 12, 0.01, 0) for s in range(8)]  # cosine before


def test_ema_buffers_equal_model_buffers_and_parameters_lag(class_map) -> None:
    torch.manual_seed(0)
    model = build_model(TINY_DEEPLAB)
    trainer = make_trainer(model, class_map, ema=ModelEma(model, decay=0.9, warmup=True))
    for i in range(4):
        trainer.train_step([compact_batch(4, seed=i, size=16)])
    buffers = dict(model.named_buffers())
    assert any(k.endswith("running_mean") for k in buffers)
    for key, value in trainer.ema.module.named_buffers():
        assert torch.equal(value, buffers[key]), key
    params = dict(model.named_parameters())
    assert any(not torch.equal(v, params[k]) for k, v in trainer.ema.module.named_parameters())
    assert trainer.ema.updates == 4


@pytest.mark.parametrize("clip", [0.01, 1e9])
def test_gradient_clipping_bounds_the_update_to_grad_clip(class_map, clip: float) -> None:
    """SGD moves the weights by lr x the gradient: by lr x grad_clip when the gradient's norm
    (reported before clipping) is larger, by lr x that norm when it is not."""
    torch.manual_seed(0)
    model = GroupNormNet()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = make_trainer(model, class_map, lr=1.0, optimizer=torch.optim.SGD, grad_clip=clip)
    lr = trainer.optimizer.param_groups[0]["lr"]
    result = trainer.train_step([compact_batch(4, seed=1)])
    after = list(model.parameters())
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(after, before, strict=True)])
    assert result.applied and 0.01 < result.grad_norm < 1e9
    assert float(moved.norm()) == pytest.approx(lr * min(clip, float(result.grad_norm)), rel=1e-4)


def test_bf16_has_no_grad_scaler_and_fp16_has_one(class_map) -> None:
    assert make_trainer(GroupNormNet(), class_map, precision="bf16").scaler is None
    assert make_trainer(GroupNormNet(), class_map, precision="fp32").scaler is None
    fp16 = make_trainer(GroupNormNet(), class_map, precision="fp16", grad_scaler=True)
    assert isinstance(fp16.scaler, torch.amp.GradScaler)
    with pytest.raises(ValueError, match="bf16"):
        make_trainer(GroupNormNet(), class_map, precision="bf16", grad_scaler=True)
    # unset: the runtime's rule (tests/models/test_runtime.py) gives fp16 one; a setting is
    # passed to it, so false turns it off
    assert isinstance(make_trainer(GroupNormNet(), class_map, precision="fp16").scaler,
                      torch.amp.GradScaler)  # fmt: skip
    assert make_trainer(GroupNormNet(), class_map, precision="fp16", grad_scaler=False).scaler \
        is None  # fmt: skip


def test_an_fp16_config_on_a_cpu_runs_fp32_without_a_grad_scaler(class_map) -> None:
    """The GradScaler follows the runtime's precision (a CPU runs fp32), not the config's."""
    model = GroupNormNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model, MultiHeadLoss(WEIGHTS, 0.05), HierarchyTargets(class_map), Dequantize("aef"), opt,
        warmup_cosine(opt, 1, 10, 0.1, 0.01, 0),
        Runtime(torch.device("cpu"), "fp32", False, False, None),
        LoopConfig(precision="fp16"), None,
    )  # fmt: skip
    assert trainer.scaler is None and trainer.precision == "fp32"


def test_config_asking_grad_scaler_with_bf16_is_refused() -> None:
    with pytest.raises(ConfigError, match="grad_scaler.*bf16"):
        LoopConfig(precision="bf16", grad_scaler=True)
    files = [REPO / "config/train/defaults.yaml", REPO / "config/train/aef_segformer.yaml"]
    schema = REPO / "workflow/schemas/train.schema.yaml"
    with pytest.raises(ConfigError, match="aef_segformer.yaml.*grad_scaler: true is refused"):
        resolve(files, ["train.grad_scaler=true", "data.manifest=m.json"], schema)
    fp16 = resolve(files, ["train.grad_scaler=true", "train.precision=fp16", "data.manifest=m"],
                   schema)  # fmt: skip
    assert fp16["train"]["grad_scaler"] is True


def test_bf16_step_trains_without_scaler(class_map) -> None:
    torch.manual_seed(0)
    trainer = make_trainer(GroupNormNet(), class_map, precision="bf16")
    before = [p.clone() for p in trainer.model.parameters()]
    result = trainer.train_step([compact_batch(2, seed=0)])
    assert result.applied and trainer.skipped == 0
    after = trainer.model.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def poisoned_batch(n: int = 4, size: int = 16) -> dict:
    """A batch whose input holds Inf (as a corrupt float raster would): the loss is NaN."""
    batch = compact_batch(n, seed=9, size=size)
    batch["emb"][0, 0, 0, 0] = 127
    return batch


class PoisonOnce(nn.Module):
    """Inject Inf into the input of the wrapped model whenever ``armed`` is set."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.armed = inner, False

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.armed:
            x = x.clone()
            x[0, :, 0, 0] = float("inf")
        return self.inner(x)


def test_nonfinite_step_leaves_weights_bn_buffers_and_ema_untouched(class_map) -> None:
    torch.manual_seed(0)
    model = PoisonOnce(build_model(TINY_DEEPLAB))
    trainer = make_trainer(model, class_map, ema=ModelEma(model, decay=0.9, warmup=True))
    trainer.train_step([compact_batch(4, seed=0, size=16)])
    before, opt_before = state_of(trainer), copy.deepcopy(trainer.optimizer.state_dict())
    model.armed = True
    result = trainer.train_step([poisoned_batch()])
    assert not result.applied and trainer.skipped == 1
    assert trainer.step == 2 and trainer.ema.updates == 1  # a step of the schedule, not the EMA's
    after = state_of(trainer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert trainer.optimizer.state_dict()["state"][0]["step"] == opt_before["state"][0]["step"]
    model.armed = False
    assert trainer.train_step([compact_batch(4, seed=1, size=16)]).applied
    assert trainer.skipped_in_row == 0 and trainer.skipped == 1


def test_nonfinite_policy_stop_and_too_many_in_a_row_raise(class_map) -> None:
    model = PoisonOnce(GroupNormNet())
    model.armed = True
    strict = make_trainer(model, class_map, nonfinite_policy="stop")
    strict.train_step([compact_batch(2, seed=0)])
    with pytest.raises(TrainingDiverged, match="optimizer step 1: .*nonfinite_policy is stop"):
        strict.state_dict()  # a diverged run is never saved
    lenient = make_trainer(model, class_map, max_nonfinite_in_row=3)
    lenient.train_step([compact_batch(2, seed=0)])
    lenient.train_step([compact_batch(2, seed=1)])
    assert lenient.check_nonfinite().in_row == 2  # two in a row are allowed
    lenient.train_step([compact_batch(2, seed=2)])
    model.armed = False
    lenient.train_step([compact_batch(2, seed=3)])  # decided on the device: read later ...
    with pytest.raises(TrainingDiverged, match="optimizer step 3: .*3 non-finite steps in a row"):
        lenient.check_nonfinite()  # ... and the run still stops, naming the step


def test_validation_with_bn_batch_stats_leaves_running_stats_unchanged(class_map) -> None:
    torch.manual_seed(0)
    model = build_model(TINY_DEEPLAB)
    trainer = make_trainer(model, class_map)
    trainer.train_step([compact_batch(4, seed=0, size=16)])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = [compact_batch(3, seed=5, size=16), compact_batch(1, seed=6, size=16)]
    out = trainer.validate(batches, {"raw": model}, bn_batch_stats=True, min_batch=2)
    assert out["val_samples"] == 3  # the batch of 1 was skipped
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not model.training and all(
        m.track_running_stats for m in model.modules() if isinstance(m, nn.BatchNorm2d)
    )


def test_validation_refuses_a_model_with_nan_in_bn_statistics(class_map) -> None:
    model = build_model(TINY_DEEPLAB)
    next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d)).running_var[0] = float("nan")
    trainer = make_trainer(model, class_map)
    with pytest.raises(TrainingDiverged, match="running_var"):
        trainer.validate([compact_batch(2, seed=0, size=16)], {"raw": model},
                         bn_batch_stats=False, min_batch=1)  # fmt: skip


def test_class_weights_are_inverse_frequency_with_mean_one_over_present_classes() -> None:
    hist = [100, 0, 25, 400] + [0] * (N_L3 - 4)
    w = class_weights_from_histogram(hist, "inverse")
    present = torch.tensor(hist) > 0
    assert w[~present].eq(0).all() and w[present].mean().item() == pytest.approx(1.0)
    assert w[2] / w[0] == pytest.approx(4.0) and w[0] / w[3] == pytest.approx(4.0)
    sq = class_weights_from_histogram(hist, "sqrt_inverse")
    assert sq[2] / sq[0] == pytest.approx(2.0)
    assert class_weights_from_histogram(hist, "none") is None


def test_weighted_l3_loss_equals_torch_weighted_mean(class_map) -> None:
    torch.manual_seed(0)
    weights = torch.rand(N_L3) + 0.1
    logits = {k: torch.randn(2, n, 6, 6) for k, n in (("l1", 2), ("l2", 7), ("l3", N_L3))}
    y = torch.randint(0, N_L3, (2, 6, 6))
    y[0, 0] = 255
    targets = HierarchyTargets(class_map)(y)
    _, parts = MultiHeadLoss(WEIGHTS, 0.0, weights)(logits, targets)
    expected = F.cross_entropy(logits["l3"], y, weight=weights, ignore_index=255)
    assert parts["l3"].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.fixture
def single_rank_group(tmp_path: Path):
    """A real (gloo, world size 1) process group, so DistributedDataParallel can wrap."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    yield
    dist.destroy_process_group()


def test_prefixes_are_stripped_in_every_wrap_order(single_rank_group, tmp_path) -> None:
    plain = GroupNormNet()
    keys = set(plain.state_dict())
    wrappings = {
        "ddp": DistributedDataParallel(plain),
        "compile": torch.compile(plain),
        "ddp(compile)": DistributedDataParallel(torch.compile(plain)),
        "compile(ddp)": torch.compile(DistributedDataParallel(plain)),
        "compile(ddp(compile))": torch.compile(DistributedDataParallel(torch.compile(plain))),
    }
    for name, wrapped in wrappings.items():
        raw_keys = set(wrapped.state_dict())
        assert raw_keys != keys, f"{name}: the wrapper added no prefix, the test proves nothing"
        assert set(checkpoint_file.strip_prefixes(wrapped.state_dict())) == keys, name
        assert checkpoint_file.unwrap(wrapped) is plain, name
        checkpoint_file.save(tmp_path / f"{name}.pt", {"model": wrapped.state_dict()})
        loaded = checkpoint_file.load(tmp_path / f"{name}.pt")
        GroupNormNet().load_state_dict(loaded["model"])  # strict: every key matches


class Payload:
    """Pickles into a call of os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_checkpoint_is_rejected_and_its_payload_never_runs(tmp_path) -> None:
    marker, path = tmp_path / "pwned", tmp_path / "last.pt"
    torch.save({"model": {}, "x": Payload(marker)}, path)  # torch.save pickles the object
    with pytest.raises(checkpoint_file.CheckpointError, match=str(path)):
        checkpoint_file.load(path)
    assert not marker.exists()
    with open(tmp_path / "plain.pt", "wb") as fh:
        pickle.dump(Payload(marker), fh)
    with pytest.raises(checkpoint_file.CheckpointError, match="not a loadable emb checkpoint"):
        checkpoint_file.load(tmp_path / "plain.pt")
    assert not marker.exists()


def test_incompatible_checkpoint_is_refused_naming_the_keys(tmp_path) -> None:
    saved = {"model": {"arch": "segformer", "in_dim": 64}, "data": {"source": "aef"}}
    now = {"model": {"arch": "segformer", "in_dim": 128}, "data": {"source": "tessera"}}
    with pytest.raises(checkpoint_file.CheckpointError) as err:
        checkpoint_file.check_compatible(saved, now, tmp_path / "last.pt")
    message = str(err.value)
    assert "model.in_dim: checkpoint 64, config 128" in message
    assert "data.source: checkpoint 'aef', config 'tessera'" in message
    assert "last.pt" in message
    checkpoint_file.check_compatible(saved, {**saved, "train": {"epochs": 3}}, tmp_path / "x.pt")


def test_checkpoint_state_loads_with_weights_only_including_rng(tmp_path) -> None:
    state = {"model": GroupNormNet().state_dict(), "rng": checkpoint_file.rng_state(),
             "config": {"model": {"widths": [1, 2]}, "train": {"precision": "bf16"}}}  # fmt: skip
    checkpoint_file.save(tmp_path / "a.pt", state)
    loaded = checkpoint_file.load(tmp_path / "a.pt")
    first, later = torch.rand(3), torch.rand(3)  # the draws right after the saved state
    assert not torch.equal(first, later)
    checkpoint_file.set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(3), first)


def test_leftover_temporary_checkpoints_are_cleaned(tmp_path) -> None:
    (tmp_path / ".last.pt.tmp-123").write_bytes(b"partial")
    (tmp_path / "last.pt").write_bytes(b"good")
    removed = checkpoint_file.clean_leftovers(tmp_path)
    assert [p.name for p in removed] == [".last.pt.tmp-123"]
    assert (tmp_path / "last.pt").read_bytes() == b"good"


def test_stop_request_from_a_signal_and_from_a_deadline() -> None:
    stop = StopRequest()
    previous = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        stop.install()
        assert stop.reason() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.reason() == "signal SIGUSR1"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    timed = StopRequest(deadline=1000.0, margin_s=10.0, check_every=1)
    timed.record_step(5.0)
    assert timed.reason(now=980.0) is None  # 980 + 5 <= 990
    assert "deadline" in timed.reason(now=986.0)  # 986 + 5 > 990


def test_the_deadline_budgets_the_validation_that_follows_the_next_step() -> None:
    stop = StopRequest(deadline=1000.0, margin_s=10.0, check_every=1)
    stop.record_step(5.0)
    stop.validation_steps = 4  # before one is timed: about 4 steps (from the split's size)
    assert stop.reason(now=970.0) is None  # no validation ahead: 970 + 5 <= 990
    assert "validation 20.0 s" in stop.reason(now=970.0, validation=True)  # 970 + 5 + 20 > 990
    stop.record_validation(2.0)  # timed: the longest validation so far counts
    assert stop.reason(now=980.0, validation=True) is None  # 980 + 5 + 2 <= 990
    assert "deadline in 16 s" in stop.reason(now=984.0, validation=True)  # 984 + 5 + 2 > 990


def test_the_deadline_covers_the_steps_until_the_next_check() -> None:
    """The ranks agree on stopping every ``check_every`` steps: a check must stop when the
    steps up to the next one would pass the deadline, not only the next step."""
    stop = StopRequest(deadline=1000.0, margin_s=10.0, check_every=20)
    stop.record_step(1.0)
    assert stop.reason(now=960.0) is None  # 960 + 20 x 1 <= 990
    assert "20 steps of 1.00 s to the next check" in stop.reason(now=975.0)  # 975 + 20 > 990
