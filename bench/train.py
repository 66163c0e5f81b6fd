"""Training-step benchmark: ``Trainer.train_step`` against a bare PyTorch loop, side by side.

Every contender gets its own copy of one initialisation, the same compact in-memory batch and
the same work per step: de-quantize, forward, multi-head loss, backward, clip, AdamW, schedule.
The trainer adds its guards (buffer snapshot and restore, non-finite flag agreed across ranks
and counted, per-head losses kept on the device) and, in the ``_ema`` figure, its EMA. Both
use the fused AdamW, as the loop does.

Method: the contenders live side by side for the whole run and take single steps in a freshly
shuffled order each round, so slow drift of this noisy machine (other jobs, frequency, heap
growth) hits all of them alike. Timing whole blocks of steps one contender after the other made
the same loop differ from itself by 5-12% with position; ``control_ratio`` (a second copy of the
bare loop against the first) shows the noise floor left in each run.

- trainer_step_ratio: trainer step time / bare loop step time (goal <= 1.05 on CPU)
- trainer_step_ratio_ema: the same with EMA on (the bare loop has none; goal <= 1.05)
- control_ratio: bare loop copy / bare loop (ideal 1.0; the run's noise floor)
- ema_update_ms, ema_loop_update_ms: the fused EMA update (``ModelEma.update``, one
  ``_foreach_lerp_`` and one ``_foreach_copy_``) and the per-tensor loop it replaced, timed
  side by side on the same model (best of many): what EMA itself adds to a step

Usage: ``python bench/train.py [--quick] [--json PATH] [--arch segformer|deeplab]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from emb.classes import ClassMap, load_class_map
from emb.loading.dequantize import Dequantize
from emb.models import ModelConfig, build_model
from emb.models.runtime import Runtime
from emb.training.ema import ModelEma
from emb.training.loss import HierarchyTargets, MultiHeadLoss
from emb.training.run_config import LoopConfig
from emb.training.schedule import warmup_cosine
from emb.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = {"l1": 0.1, "l2": 0.3, "l3": 1.0}
Step = Callable[[], None]


def compact_batch(n: int, tile: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "emb": torch.randint(-127, 128, (n, 64, tile, tile), generator=g, dtype=torch.int8),
        "label": torch.randint(0, 61, (n, tile, tile), generator=g).to(torch.uint8),
    }


def optimizer_and_schedule(model: nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
    return opt, warmup_cosine(opt, 10, 10_000, 3e-4, 1e-6, 0)


def bare_step(model: nn.Module, batch: dict, cmap: ClassMap) -> Step:
    """nanoGPT-style: the fewest lines that do the same work."""
    opt, sched = optimizer_and_schedule(model)
    loss_fn, targets_of, prepare = (
        MultiHeadLoss(WEIGHTS, 0.05),
        HierarchyTargets(cmap),
        Dequantize("aef"),
    )
    model.train()

    def step() -> None:
        x, y = prepare(batch)
        loss, _ = loss_fn(model(x), targets_of(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    return step


def trainer_step(model: nn.Module, batch: dict, cmap: ClassMap, ema: bool) -> Step:
    opt, sched = optimizer_and_schedule(model)
    trainer = Trainer(
        model, MultiHeadLoss(WEIGHTS, 0.05), HierarchyTargets(cmap), Dequantize("aef"), opt, sched,
        Runtime(torch.device("cpu"), "fp32", False, False, None), LoopConfig(precision="fp32"),
        ModelEma(model, 0.999, warmup=True) if ema else None,
    )  # fmt: skip

    def step() -> None:
        trainer.train_step([batch])  # no read of the result: the loop reads at log lines

    return step


def ema_update_times(model: nn.Module, repeats: int = 200) -> dict[str, float]:
    """Best seconds of the fused EMA update and of the per-tensor loop it replaced."""
    fused, looped = ModelEma(model, 0.999, True), ModelEma(model, 0.999, True)

    @torch.no_grad()
    def loop() -> None:
        d = looped.current_decay()
        for shadow, value in zip(looped.module.parameters(), model.parameters(), strict=True):
            shadow.lerp_(value.detach(), 1.0 - d)
        for shadow, value in zip(looped.module.buffers(), model.buffers(), strict=True):
            shadow.copy_(value)

    best = {"fused": float("inf"), "loop": float("inf")}
    for _ in range(repeats):
        for name, fn in (("fused", lambda: fused.update(model)), ("loop", loop)):
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def time_interleaved(steps: dict[str, Step], rounds: int, seed: int = 0) -> dict[str, float]:
    """Median seconds per step of each contender, one step each per round in shuffled order."""
    for step in steps.values():
        for _ in range(3):  # warm-up: optimizer state, allocator, threads
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    order, rng = list(steps), random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--arch", default="segformer", choices=["segformer", "deeplab"])
    args = parser.parse_args()
    rounds = 8 if args.quick else 80
    torch.manual_seed(0)
    cfg = ModelConfig(args.arch, 64, widths=(32, 64, 128, 256), depths=(1, 1, 2, 1),
                      decoder_dim=64, aspp_rates=(1, 2, 3), input_norm=True)  # fmt: skip
    base = build_model(cfg)
    batch = compact_batch(8, 64)
    cmap = load_class_map(REPO / "config" / "classes.csv")
    median = time_interleaved(
        {
            "bare": bare_step(copy.deepcopy(base), batch, cmap),
            "bare_control": bare_step(copy.deepcopy(base), batch, cmap),
            "trainer": trainer_step(copy.deepcopy(base), batch, cmap, ema=False),
            "trainer_ema": trainer_step(copy.deepcopy(base), batch, cmap, ema=True),
        },
        rounds,
    )
    ema = ema_update_times(base)
    figures = {
        "arch": args.arch,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "bare_step_ms": median["bare"] * 1e3,
        "trainer_step_ms": median["trainer"] * 1e3,
        "trainer_step_ratio": median["trainer"] / median["bare"],
        "trainer_step_ratio_ema": median["trainer_ema"] / median["bare"],
        "control_ratio": median["bare_control"] / median["bare"],
        "ema_update_ms": ema["fused"] * 1e3,
        "ema_loop_update_ms": ema["loop"] * 1e3,
    }
    for name, value in figures.items():
        goal = "  goal <= 1.05" if name.startswith("trainer_step_ratio") else ""
        print(
            f"{name:26s} {value:10.3f}{goal}"
            if isinstance(value, float)
            else f"{name:26s} {value:>10}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
