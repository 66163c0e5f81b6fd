"""A training step that does not log never reads a tensor to the host (issue 31).

On a GPU every such read (``item``, ``float``, ``bool``, ``tolist``, ...) waits for the queued
kernels, so the CPU cannot run ahead of the GPU. Here, on the CPU, the real loop (a DeepLab
with BatchNorm, EMA on, augmentation on) runs with those methods counting their calls in the
main thread, and every step that neither logs, checks the stop request, validates nor ends an
epoch must have made none. Which steps those are is computed here from the cadence, not taken
from the loop's own bookkeeping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from conftest import TinyDemo
from training_runs import resolve_config

from emb.training.config import load
from emb.training.loop import build_loop, fit
from emb.training.stop import StopRequest

# numpy() is left out: it refuses a device tensor, so code calling it holds host data already
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu")
LOG_EVERY, CHECK_EVERY, STEPS = 5, 10, 42


class ReadCounter:
    """Counts host reads of tensors made by the main thread (loader threads read their own
    host data; only the training thread's reads can stall a GPU queue)."""

    def __init__(self) -> None:
        self.count = 0
        self.main = threading.get_ident()

    @contextmanager
    def installed(self) -> Iterator[ReadCounter]:
        originals = {name: getattr(torch.Tensor, name) for name in READS}

        def counting(name: str):
            original = originals[name]

            def read(tensor, *args, **kwargs):
                if threading.get_ident() == self.main:
                    self.count += 1
                return original(tensor, *args, **kwargs)

            return read

        try:
            for name in READS:
                setattr(torch.Tensor, name, counting(name))
            yield self
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)


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
    loop = build_loop(load(config), run_dir, 0, 1, torch.device("cpu"),
                      StopRequest(check_every=CHECK_EVERY))  # fmt: skip
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_quiet_steps_pass_cuda_sync_debug_mode_error(tiny_demo: TinyDemo, tmp_path) -> None:
    """On a GPU, PyTorch itself refuses any synchronising call over the quiet steps."""
    run_dir = tmp_path / "run"
    config = resolve_config(
        tiny_demo, run_dir, "train.max_updates=100", "logging.log_every=50", "ema.enabled=true",
        "train.precision=bf16", arch="deeplab",
    )  # fmt: skip
    loop = build_loop(load(config), run_dir, 0, 1, torch.device("cuda"), StopRequest())
    stream = iter(loop.epoch_batches(0, start_batch=0))
    batches = [next(stream) for _ in range(4)]
    loop.trainer.train_step([batches[0]])  # the first step allocates and picks kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[1:]:
            result = loop.trainer.train_step([batch])
            loop.log.step(result, loop.trainer, 0.1, 0.0, 1)  # steps 2-4: no line due
    finally:
        torch.cuda.set_sync_debug_mode("default")
    loop.log.close()
    assert loop.trainer.step == 4 and loop.trainer.skipped == 0
