"""Training-step benchmark: ``Trainer.train_step`` against a bare PyTorch loop, side by side.

Both get the same model (copies of one initialisation), the same compact in-memory batch and
the same work per step: de-quantize, forward, multi-head loss, backward, clip, AdamW, schedule.
The trainer adds its guards (buffer snapshot, non-finite check, per-head loss logging) and,
in the ``_ema`` figure, its EMA. Rounds alternate between the contenders so both see the same
machine state; the ratio of medians is reported.

- trainer_step_ratio: trainer step time / bare loop step time (goal <= 1.05 on CPU)
- trainer_step_ratio_ema: the same with EMA on (the bare loop has none; informational)

Usage: ``python bench/train.py [--quick] [--json PATH] [--arch segformer|deeplab]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from emb.classes import load_class_map
from emb.data import Dequantize
from emb.ema import ModelEma
from emb.loss import HierarchyTargets, MultiHeadLoss
from emb.models import ModelConfig, build_model
from emb.schedule import warmup_cosine
from emb.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = {"l1": 0.1, "l2": 0.3, "l3": 1.0}


def compact_batch(n: int, tile: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "emb": torch.randint(-127, 128, (n, 64, tile, tile), generator=g, dtype=torch.int8),
        "label": torch.randint(0, 61, (n, tile, tile), generator=g).to(torch.uint8),
    }


def optimizer_and_schedule(model: nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    return opt, warmup_cosine(opt, 10, 10_000, 3e-4, 1e-6)


def bare_loop(model: nn.Module, batch: dict, cmap, steps: int) -> float:
    """nanoGPT-style: the fewest lines that do the same work. Returns seconds per step."""
    opt, sched = optimizer_and_schedule(model)
    loss_fn, targets_of, prepare = MultiHeadLoss(WEIGHTS), HierarchyTargets(cmap), Dequantize("aef")
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        x, y = prepare(batch)
        loss, _ = loss_fn(model(x), targets_of(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return (time.perf_counter() - start) / steps


def trainer_loop(model: nn.Module, batch: dict, cmap, steps: int, ema: bool) -> float:
    opt, sched = optimizer_and_schedule(model)
    trainer = Trainer(
        model, MultiHeadLoss(WEIGHTS), HierarchyTargets(cmap), Dequantize("aef"), opt, sched,
        torch.device("cpu"), ema=ModelEma(model, 0.999) if ema else None,
    )  # fmt: skip
    start = time.perf_counter()
    for _ in range(steps):
        result = trainer.train_step([batch])
        assert result.applied
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--arch", default="segformer", choices=["segformer", "deeplab"])
    args = parser.parse_args()
    rounds, steps = (2, 3) if args.quick else (7, 10)
    torch.manual_seed(0)
    cfg = ModelConfig(args.arch, 64, widths=(32, 64, 128, 256), depths=(1, 1, 2, 1),
                      decoder_dim=64, aspp_rates=(1, 2, 3), input_norm=True)  # fmt: skip
    base = build_model(cfg)
    batch = compact_batch(8, 64)
    cmap = load_class_map(REPO / "config" / "classes.csv")
    times: dict[str, list[float]] = {"bare": [], "trainer": [], "trainer_ema": []}
    bare_loop(copy.deepcopy(base), batch, cmap, 2)  # warm-up: allocator, threads
    for _ in range(rounds):
        times["bare"].append(bare_loop(copy.deepcopy(base), batch, cmap, steps))
        times["trainer"].append(trainer_loop(copy.deepcopy(base), batch, cmap, steps, False))
        times["trainer_ema"].append(trainer_loop(copy.deepcopy(base), batch, cmap, steps, True))
    median = {k: statistics.median(v) for k, v in times.items()}
    figures = {
        "arch": args.arch,
        "threads": torch.get_num_threads(),
        "bare_step_ms": median["bare"] * 1e3,
        "trainer_step_ms": median["trainer"] * 1e3,
        "trainer_step_ratio": median["trainer"] / median["bare"],
        "trainer_step_ratio_ema": median["trainer_ema"] / median["bare"],
    }
    for name, value in figures.items():
        goal = "  goal <= 1.05" if name == "trainer_step_ratio" else ""
        print(
            f"{name:26s} {value:10.3f}{goal}"
            if isinstance(value, float)
            else f"{name:26s} {value:>10}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
