"""The EMA update and the non-finite guard, flat against per tensor (issue 39 item 2).

For each standard run's full model (SegFormer / DeepLab at 256 px, AEF 64 bands, TESSERA 128):
one optimizer step's bookkeeping besides the step itself, i.e. the guard's save of the
BatchNorm buffers, its restore (``torch.where`` on the step's finite flag) and the EMA's update
(parameters lerped, buffers copied), timed side by side (medians of interleaved blocks) in
two forms: the model's tensors in one flat tensor per dtype (:mod:`emb.models.flat_tensors`,
what the loop builds) and as separate tensors (``_foreach`` ops, the form before). Also the
operators each form runs (the profiler's count: on a GPU each is at least one kernel launch,
which is what the per-tensor form paid for: 9-10% of an H100 step). Usage:
``python bench/ema.py [--device cuda|cpu] [--blocks N] [--reps N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gpu_loop import RUNS

from emb.models import ModelConfig, build_model
from emb.models.flat_tensors import flats_of, flatten_
from emb.training.ema import ModelEma


def bookkeeping(model: torch.nn.Module, ema: ModelEma, device: torch.device):
    """The per-step work of the guard and the EMA, as the Trainer does it."""
    buffers = list(model.buffers())
    guarded = flats_of(buffers) or buffers
    saved = [b.clone() for b in guarded]
    finite = torch.tensor(True, device=device)

    def step() -> None:
        if guarded:
            torch._foreach_copy_(saved, guarded)
        for buffer, kept in zip(guarded, saved, strict=True):
            buffer.copy_(torch.where(finite, buffer, kept))
        ema.update(model, finite)

    return step, len(guarded)


def ops(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def timed(fns: dict, device: torch.device, blocks: int, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(blocks):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / reps)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cuda", "cpu"), default=default)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}")
    print(f"{'run':18s} {'tensors':>7s} {'ops flat':>8s} {'ops each':>8s} "
          f"{'ms flat':>8s} {'ms each':>8s} {'each/flat':>9s}")  # fmt: skip
    for run, (arch, bands, _) in RUNS.items():
        cfg = ModelConfig(arch=arch, in_dim=bands, input_norm=bands == 64).for_tile(256)
        torch.manual_seed(0)
        each = build_model(cfg).to(device)
        flat = build_model(cfg).to(device)
        flat.load_state_dict(each.state_dict())
        flatten_(flat, "parameters")
        flatten_(flat, "buffers")
        fns, counts = {}, {}
        for label, model in (("flat", flat), ("each", each)):
            fns[label], _ = bookkeeping(model, ModelEma(model, 0.9999, warmup=True), device)
            counts[label] = ops(fns[label])
        seconds = timed(fns, device, args.blocks, args.reps)
        tensors = len(list(each.parameters())) + len(list(each.buffers()))
        print(f"{run:18s} {tensors:7d} {counts['flat']:8d} {counts['each']:8d} "
              f"{seconds['flat'] * 1e3:8.2f} {seconds['each'] * 1e3:8.2f} "
              f"{seconds['each'] / seconds['flat']:9.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
