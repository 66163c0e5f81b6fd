"""A training step that does not log never reads a tensor to the host (issue 31).

On a GPU every such read (``item``, ``float``, ``bool``, ``tolist``, ...) waits for the queued
kernels, so the CPU cannot run ahead of the GPU. Here, on the CPU, the real loop (a DeepLab
with BatchNorm, EMA on, augmentation on) runs with every read counted in the main thread
(:class:`ReadCounter`: the methods and functions that return host values, and the operator
below them that reads a scalar), and every step that neither logs, checks the stop request,
validates nor ends an epoch must have made none. Which steps those are is computed here from
the cadence, not taken from the loop's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from conftest import TinyDemo
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from training_runs import cpu_runtime, resolve_config

from emb.models.runtime import Host, Runtime
from emb.training.loop import build_loop, fit
from emb.training.run_config import load
from emb.training.stop_request import StopRequest

# Every way a tensor's values reach Python: methods and functions that return host values
# (seen by a TorchFunctionMode: every Tensor method and torch function, whatever spells it),
# and, below them, the one operator that reads a device scalar (a TorchDispatchMode), so a
# read through a path not listed here still counts. numpy() and __array__ are left out: they
# refuse a device tensor, so code calling them holds host data already (augmentation codes).
READS = frozenset({
    "item", "tolist", "__bool__", "__float__", "__int__", "__index__", "__complex__",
    "__format__", "__repr__", "__str__", "cpu", "equal", "allclose", "is_nonzero",
})  # fmt: skip
SCALAR_READS = ("aten._local_scalar_dense", "aten.equal", "aten.is_nonzero")
LOG_EVERY, CHECK_EVERY, STEPS = 5, 10, 42


class _Functions(TorchFunctionMode):
    def __init__(self, counter: ReadCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READS:
            self.counter.count += 1
        return func(*args, **(kwargs or {}))


class _Operators(TorchDispatchMode):
    def __init__(self, counter: ReadCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(SCALAR_READS):
            self.counter.count += 1
        return func(*args, **(kwargs or {}))


class ReadCounter:
    """Counts host reads of tensors made by the main thread (modes are per thread: loader
    threads read their own host data; only the training thread's reads can stall a GPU)."""

    def __init__(self) -> None:
        self.count = 0

    @contextmanager
    def installed(self) -> Iterator[ReadCounter]:
        with _Functions(self), _Operators(self):
            yield self


def event_steps(total: int, micro_per_epoch: int, accumulation: int) -> set[int]:
    """Steps after which the loop may read: log lines, stop checks, epoch ends (validation,
    checkpoints) and the last two (the final validation is due)."""
    per_epoch = -(-micro_per_epoch // accumulation)
    steps = {k for k in range(1, total + 1) if k % LOG_EVERY == 0 or k % CHECK_EVERY == 0}
    steps |= {k for k in range(1, total + 1) if k % per_epoch in (0, per_epoch - 1)}
    return steps | {total - 1, total}


@pytest.mark.parametrize("arch", ["deeplab"])
def test_steps_that_do_not_log_make_no_host_read(tiny_demo: TinyDemo, tmp_path, arch) -> None:
    run_dir = tmp_path / "run"
    config = resolve_config(
        tiny_demo, run_dir, f"train.max_updates={STEPS}", "train.epochs=100",
        f"logging.log_every={LOG_EVERY}", f"logging.detail_every={2 * LOG_EVERY}",
        "train.val_every_updates=null", "ema.enabled=true", "train.patience=1000", arch=arch,
    )  # fmt: skip
    cfg = load(config)
    loop = build_loop(cfg, run_dir, 0, 1, cpu_runtime(cfg), StopRequest(check_every=CHECK_EVERY))
    counter, reads = ReadCounter(), {}
    step = loop.trainer.train_step

    def counted_step(micro_batches):
        reads[loop.trainer.step + 1] = counter.count  # at entry: reads before this step
        return step(micro_batches)

    loop.trainer.train_step = counted_step
    with counter.installed():
        fit(loop)
    loop.log.close()
    steps = sorted(reads)
    assert steps == list(range(1, STEPS + 1))
    per_step = {k: reads[k + 1] - reads[k] for k in steps[:-1]}  # step k, its logging, next batch
    plan = loop.plan
    quiet = [k for k in per_step if k not in event_steps(STEPS, plan.micro_per_epoch,
                                                         plan.accumulation)]  # fmt: skip
    assert len(quiet) >= STEPS // 3, (quiet, plan)  # the check has steps to check
    assert {k: per_step[k] for k in quiet if per_step[k]} == {}, "host reads on quiet steps"
    logged = [k for k in per_step if k % LOG_EVERY == 0]
    assert all(per_step[k] > 0 for k in logged)  # the counter sees the reads logging makes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_quiet_steps_pass_cuda_sync_debug_mode_error(tiny_demo: TinyDemo, tmp_path) -> None:
    """On a GPU, PyTorch itself refuses any synchronising call over the quiet steps."""
    run_dir = tmp_path / "run"
    config = resolve_config(
        tiny_demo, run_dir, "train.max_updates=100", "logging.log_every=50", "ema.enabled=true",
        "train.precision=bf16", arch="deeplab",
    )  # fmt: skip
    cfg = load(config)
    cuda = Runtime.resolve(cfg.train, cfg.model.arch, Host(gpus=1, local_rank=0), training=True)
    loop = build_loop(cfg, run_dir, 0, 1, cuda, StopRequest())
    stream = iter(loop.epoch_batches(0, start_batch=0))  # pinned batches, copied one ahead
    loop.trainer.train_step([next(stream)])  # the first step allocates and picks kernels
    next(stream)  # the pinned pool's first buffers (page-locking is a synchronising call)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # the loader's hand-over and the copy ahead run under the mode too
            result = loop.trainer.train_step([next(stream)])
            loop.log.step(result, loop.trainer, 0.1, 0.0, 1)  # steps 2-4: no line due
    finally:
        torch.cuda.set_sync_debug_mode("default")
    loop.log.close()
    assert loop.trainer.step == 4 and loop.trainer.skipped == 0
