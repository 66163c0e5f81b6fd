"""bench/gpu.py part (a): the training step against a bare bf16 loop, per standard run.

For the four standard runs at their recipe batch (SegFormer 32, DeepLab 64 per GPU, 256 px,
AEF 64 bands, TESSERA 128): ``Trainer.train_step`` (EMA included) and a bare loop (bf16
autocast forward, loss, backward, fused AdamW where the device has it) on the same model and
batch, each in eager and channels_last, and each under ``torch.compile``. The trainer is built
as the loop builds it (channels_last, flat parameters and buffers, EMA on) and fed as the loop
feeds it: host batches in pinned memory copied one step ahead (emb.loading.device_feed). Figures:
ms per step and samples/s (medians of interleaved blocks, so every contender sees the same
machine), TFLOP/s from ``torch.utils.flop_counter.FlopCounterMode``, share of the device's
dense bf16 peak (table below or ``--peak``), peak memory. On CUDA the trainer step also runs
under ``torch.cuda.set_sync_debug_mode("error")`` (pass/fail: any host read fails it).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_loop import RUNS, TINY
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from emb.classes import N_L3, load_class_map
from emb.loading.dequantize import Dequantize
from emb.loading.device_feed import on_device
from emb.models import ModelConfig, build_model
from emb.models.runtime import Runtime
from emb.training.distributed import wrap_model
from emb.training.ema import ModelEma
from emb.training.loss import HierarchyTargets, MultiHeadLoss
from emb.training.run_config import LoopConfig
from emb.training.schedule import warmup_cosine
from emb.training.trainer import Trainer, fused_adamw

REPO = Path(__file__).resolve().parents[1]
# Dense bf16 TFLOP/s (vendor data sheets, without sparsity), matched by a substring of the
# device name; --peak overrides. An MI250X is two GCDs: the figure is one GCD's.
PEAKS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "MI250X": 191.5, "MI300X": 1307.0}
WEIGHTS = {"l1": 0.1, "l2": 0.3, "l3": 1.0}


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    """The device's dense bf16 peak from PEAKS by name, or ``override``; None if unknown."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAKS.items() if k in name), None)


def compact_batch(source: str, bands: int, n: int, size: int, device: torch.device) -> dict:
    """A batch as the loader yields it (int8 AEF / int8 TESSERA with scales, uint8 labels)."""
    g = torch.Generator().manual_seed(0)
    batch = {
        "emb": torch.randint(-127, 128, (n, bands, size, size), generator=g, dtype=torch.int8),
        "label": torch.randint(0, N_L3, (n, size, size), generator=g).to(torch.uint8),
    }
    if source == "tessera":
        batch["scale"] = torch.rand((n, size, size), generator=g).to(torch.float16) + 0.01
    return {k: v.to(device) for k, v in batch.items()}


def make_model(arch: str, bands: int, size: int, tiny: bool, device: torch.device) -> nn.Module:
    extra = TINY if tiny else {}
    cfg = ModelConfig(arch=arch, in_dim=bands, input_norm=bands == 64, **extra).for_tile(size)
    torch.manual_seed(0)
    return build_model(cfg).to(device)


def optimizer_for(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    fused = fused_adamw(device)  # as the loop builds it: one kernel, skips on the device
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=fused or None)


def bare_step(
    model: nn.Module, opt: torch.optim.Optimizer, prepare: Dequantize, targets, batch: dict,
    device: torch.device, precision: str, memory_format: torch.memory_format,
) -> Callable[[], None]:  # fmt: skip
    """The plain loop's step: dequantize, autocast forward, loss, backward, clip, AdamW."""
    loss_fn = MultiHeadLoss(WEIGHTS, 0.05).to(device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def step() -> None:
        x, y = prepare(batch)
        x = x.contiguous(memory_format=memory_format)
        t = targets(y)
        with torch.autocast(device.type, dtype=dtype, enabled=precision == "bf16"):
            logits = model(x)
        loss, _ = loss_fn(logits, t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def trainer_step(
    arch: str, bands: int, size: int, tiny: bool, prepare: Dequantize, targets, batch: dict,
    device: torch.device, precision: str, channels_last: bool, compile: bool, used: dict,
) -> Callable[[], None]:  # fmt: skip
    """``Trainer.train_step`` as emb.training.loop builds and feeds it: the model prepared by
    its runtime (channels_last, flat tensors unless compiled), EMA on, grad clip 1.0, host
    batches in pinned memory (on a GPU) copied one step ahead."""
    runtime = Runtime(device, precision, channels_last, compile, None)
    plain = runtime.prepare(make_model(arch, bands, size, tiny, device), training=True)
    model = wrap_model(plain, 1, runtime)
    opt = optimizer_for(model, device)
    sched = warmup_cosine(opt, 500, 10_000, 1e-4, 1e-6, 0)
    trainer = Trainer(
        model, MultiHeadLoss(WEIGHTS, 0.05).to(device), targets, prepare, opt, sched, runtime,
        LoopConfig(precision=precision), ModelEma(plain, 0.9999, warmup=True),
    )  # fmt: skip
    used[f"trainer {'cl' if channels_last else 'eager'}{' compiled' if compile else ''}"] = (
        trainer.model, trainer.loss_fn, trainer.targets, trainer.dequantize, trainer.ema.module,
        trainer.saved_buffers,
    )  # fmt: skip
    if device.type == "meta":  # built to check devices only (tests/bench), never stepped
        return lambda: trainer.train_step([batch])
    host = {k: v.cpu() for k, v in batch.items()}
    if device.type == "cuda":
        host = {k: v.pin_memory() for k, v in host.items()}
    feed = on_device(itertools.repeat(host), device)
    return lambda: trainer.train_step([next(feed)])


def off_device(device: torch.device, used: dict) -> list[str]:
    """Every module's parameters and buffers, and every tensor, of what a contender uses that
    is not on ``device`` (a class map left on the CPU crashed part (a) on CUDA): names."""
    wrong = []
    for owner, things in used.items():
        for i, thing in enumerate(things):
            if isinstance(thing, nn.Module):
                tensors = [*thing.named_parameters(), *thing.named_buffers()]
            elif isinstance(thing, torch.Tensor):
                tensors = [(f"tensor {i}", thing)]
            else:
                tensors = [(f"{i}.{k}", t) for k, t in enumerate(thing)]
            name = type(thing).__name__
            wrong += [f"{owner}: {name} {n} on {t.device}" for n, t in tensors
                      if t.device.type != device.type]  # fmt: skip
    return wrong


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(
    contenders: dict[str, Callable[[], None]], device: torch.device, blocks: int, steps: int
) -> dict[str, float]:
    """Median seconds per step of each contender over ``blocks`` interleaved blocks."""
    for fn in contenders.values():  # warm-up (cuDNN autotune, compile, allocator)
        for _ in range(2):
            fn()
    sync(device)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(blocks):
        for name, fn in contenders.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            sync(device)
            times[name].append((time.perf_counter() - start) / steps)
    return {k: statistics.median(v) for k, v in times.items()}


def step_flops(step: Callable[[], None]) -> int:
    """FLOPs of one step as FlopCounterMode counts them (forward and backward)."""
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter.get_total_flops()


def sync_debug_passes(step: Callable[[], None], device: torch.device) -> bool | None:
    """Whether ``step`` runs with no host-device synchronisation (CUDA only; else None)."""
    if device.type != "cuda":
        return None
    step()  # the first step may read once (lazy state)
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return True
    except RuntimeError:
        return False
    finally:
        torch.cuda.set_sync_debug_mode(0)


def build_contenders(
    run: str, args: argparse.Namespace, device: torch.device
) -> tuple[dict[str, Callable[[], None]], dict, int]:
    """Part (a)'s contenders for ``run`` on ``device``, what each uses (for
    :func:`off_device`) and the batch size; nothing run yet, so ``meta`` works too."""
    arch, bands, batch_size = RUNS[run]
    size = 32 if args.tiny else 256
    if args.tiny:
        batch_size = 2
    source = run.split("_")[0]
    precision = "bf16" if device.type == "cuda" else "fp32"
    prepare = Dequantize(source).to(device)
    targets = HierarchyTargets(load_class_map(REPO / "config/classes.csv")).to(device)
    batch = compact_batch(source, bands, batch_size, size, device)
    contenders: dict[str, Callable[[], None]] = {}
    used: dict = {"batch": tuple(batch.values())}
    compiled = not args.no_compile and not (args.tiny and run != args.runs[0])  # CI: once
    for fmt, memory_format in (("eager", torch.contiguous_format), ("cl", torch.channels_last)):
        model = make_model(arch, bands, size, args.tiny, device).to(memory_format=memory_format)
        opt = optimizer_for(model, device)
        contenders[f"bare/{fmt}"] = bare_step(
            model, opt, prepare, targets, batch, device, precision, memory_format
        )
        used[f"bare {fmt}"] = (model, prepare, targets)
        contenders[f"trainer/{fmt}"] = trainer_step(
            arch, bands, size, args.tiny, prepare, targets, batch, device, precision,
            fmt == "cl", False, used,
        )  # fmt: skip
    if compiled:
        if not args.quick:  # --quick: the trainer's compile figure only (it decides the default)
            model = make_model(arch, bands, size, args.tiny, device)
            contenders["bare/compile"] = bare_step(
                torch.compile(model), optimizer_for(model, device), prepare, targets, batch,
                device, precision, torch.contiguous_format,
            )  # fmt: skip
        contenders["trainer/compile"] = trainer_step(
            arch, bands, size, args.tiny, prepare, targets, batch, device, precision,
            False, True, used,
        )  # fmt: skip
    return contenders, used, batch_size


def bench_run(run: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Rows for one run: each contender's ms, samples/s, TFLOP/s, share of peak, memory."""
    contenders, used, batch_size = build_contenders(run, args, device)
    wrong = off_device(device, used)
    if wrong:
        raise RuntimeError(f"{run}: left off {device}: " + "; ".join(wrong))
    size = 32 if args.tiny else 256
    flops = step_flops(contenders["bare/eager"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = interleaved(contenders, device, args.blocks, args.steps)
    peak = peak_tflops(device, args.peak)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    passes = sync_debug_passes(contenders["trainer/eager"], device)
    rows = []
    for name, s in seconds.items():
        tflops = flops / s / 1e12
        rows.append({
            "run": run, "step": name, "batch": batch_size, "px": size, "ms": s * 1e3,
            "samples_s": batch_size / s, "tflops": tflops,
            "peak_share": tflops / peak if peak else None,
            "vs_bare_eager": s / seconds["bare/eager"],
            "peak_mem_gib": memory,
            "sync_free": passes if name == "trainer/eager" else None,
        })  # fmt: skip
    return rows


def print_steps(rows: list[dict]) -> None:
    """Part (a)'s table."""
    print(f"{'run':18s} {'step':15s} {'ms':>8s} {'samples/s':>10s} {'TFLOP/s':>8s} "
          f"{'of peak':>8s} {'x bare':>7s} {'GiB':>6s} sync-free")  # fmt: skip
    for r in rows:
        share = f"{r['peak_share']:.1%}" if r["peak_share"] else "-"
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] else "-"
        free = {True: "pass", False: "FAIL", None: ""}[r["sync_free"]]
        figures = f"{r['ms']:8.2f} {r['samples_s']:10.1f} {r['tflops']:8.3f} {share:>8s}"
        print(
            f"{r['run']:18s} {r['step']:15s} {figures} {r['vs_bare_eager']:7.2f} {mem:>6s} {free}"
        )
