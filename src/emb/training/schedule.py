"""Learning-rate schedule: linear warmup -> cosine -> optional linear cooldown, per optimizer step.

The scheduler is stepped once per optimizer step (never per micro-batch), so gradient
accumulation does not stretch or shrink the schedule, and ``lr_factor`` is its closed form.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(
    step: int, warmup_steps: int, total_steps: int, min_ratio: float, cooldown_steps: int = 0
) -> float:
    """Multiplier of the base LR for the optimizer step that follows ``step`` completed steps.

    Cosine from 1 to ``min_ratio`` over ``warmup_steps .. total_steps``; with a cooldown, the
    last ``cooldown_steps`` steps leave the cosine and fall linearly to ``min_ratio``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)

    def cosine(s: int) -> float:
        progress = min(1.0, (s - warmup_steps) / decay_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    cooldown_start = max(warmup_steps, total_steps - cooldown_steps)
    if cooldown_steps == 0 or step < cooldown_start:
        return cosine(step)
    span = max(1, total_steps - cooldown_start)
    progress = min(1.0, (step - cooldown_start) / span)
    return cosine(cooldown_start) + (min_ratio - cosine(cooldown_start)) * progress


def warmup_cosine(
    optimizer: Optimizer,
    warmup_steps: int,
    total_steps: int,
    base_lr: float,
    min_lr: float,
    cooldown_steps: int = 0,
) -> LambdaLR:
    """A scheduler to be stepped once per optimizer step; its state dict is plain data."""
    ratio = min(1.0, min_lr / base_lr)
    return LambdaLR(
        optimizer,
        lambda step: lr_factor(step, warmup_steps, total_steps, ratio, cooldown_steps),
    )


def scaled_lr(lr: float, rule: str, global_batch: int, reference_batch: int) -> float:
    """``lr`` tuned at ``reference_batch``, scaled to ``global_batch`` by ``rule``."""
    ratio = global_batch / reference_batch
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    if rule == "none":
        return lr
    raise ValueError(f"train.lr_scaling: expected none, linear or sqrt, got {rule!r}")
