"""Learning-rate schedule: linear warmup then cosine decay to ``min_lr``, per optimizer step."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the base LR after ``step`` optimizer steps (closed form, testable)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: Optimizer, warmup_steps: int, total_steps: int, base_lr: float, min_lr: float
) -> LambdaLR:
    """A scheduler to be stepped once per optimizer step."""
    ratio = min_lr / base_lr
    return LambdaLR(optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, ratio))
