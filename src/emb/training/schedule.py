"""A run's schedule: its arithmetic (batch sizes, learning rate, steps per epoch and in all, from
the config, the data and the world size: :func:`build_plan`) and the learning rate over it,
linear warmup -> cosine -> optional linear cooldown, per optimizer step.

The scheduler is stepped once per optimizer step (never per micro-batch), so gradient
accumulation does not stretch or shrink the schedule, and ``lr_factor`` is its closed form.

A resume may change the run's length (``train.epochs``, ``train.max_updates``), and the
cosine's length comes from it. Rather than jump to the LR the new length gives at the resume
step (SegFormer at step 5,000 of 10k resumed as 20k: 1.63e-4 -> 2.62e-4), :meth:`Schedule.
replan` re-plans the remaining cosine from the current LR to ``min_lr`` over the steps left
(an *anchor*: the step and factor it starts from). The anchor is saved in the checkpoint with
the rest of the schedule, so later resumes with the same length continue it bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from emb.loading.batches import rank_samples, train_steps_per_epoch
from emb.loading.shard_manifest import shard_sample_counts, shards_for_rank
from emb.training.lr_scaling import reference_batch, scaled_lr
from emb.training.run_config import TrainConfig


def lr_factor(
    step: int,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float,
    cooldown_steps: int,
    anchor: tuple[int, float] | None = None,
) -> float:
    """Multiplier of the base LR for the optimizer step that follows ``step`` completed steps.

    Cosine from 1 to ``min_ratio`` over ``warmup_steps .. total_steps``; with a cooldown, the
    last ``cooldown_steps`` steps leave the cosine and fall linearly to ``min_ratio``. An
    ``anchor`` (step, factor) re-plans: the cosine runs from ``factor`` at that step instead.
    """
    start, top = anchor if anchor is not None else (warmup_steps, 1.0)
    if step < warmup_steps and anchor is None:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - start)

    def cosine(s: int) -> float:
        progress = min(1.0, (s - start) / decay_steps)
        return min_ratio + (top - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    cooldown_start = max(start, total_steps - cooldown_steps)
    if cooldown_steps == 0 or step < cooldown_start:
        return cosine(step)
    span = max(1, total_steps - cooldown_start)
    progress = min(1.0, (step - cooldown_start) / span)
    return cosine(cooldown_start) + (min_ratio - cosine(cooldown_start)) * progress


class Schedule:
    """:func:`lr_factor` as a callable object: ``LambdaLR`` saves its attributes (plain data)
    in the scheduler's state dict and restores them on load, anchor and length included."""

    def __init__(
        self, warmup_steps: int, total_steps: int, min_ratio: float, cooldown_steps: int
    ) -> None:
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.min_ratio, self.cooldown_steps = min_ratio, cooldown_steps
        self.anchor: list | None = None  # [step, factor] once re-planned

    def __call__(self, step: int) -> float:
        anchor = (int(self.anchor[0]), float(self.anchor[1])) if self.anchor else None
        return lr_factor(
            step, self.warmup_steps, self.total_steps, self.min_ratio, self.cooldown_steps, anchor
        )

    def replan(self, step: int, total_steps: int, factor: float | None = None) -> bool:
        """Make the schedule ``total_steps`` long from ``step`` on, continuing from the factor
        it has there (or ``factor``: the one a checkpoint without a saved schedule ran at).
        Returns True when the remaining cosine was re-planned from an anchor; within the
        warmup only the length changes (the warmup does not depend on it)."""
        current = self(step) if factor is None else factor
        if total_steps == self.total_steps and math.isclose(current, self(step), rel_tol=1e-9):
            return False
        self.total_steps = total_steps
        if self.anchor is None and step < self.warmup_steps:
            return False
        self.anchor = [int(step), float(current)]
        return True


def warmup_cosine(
    optimizer: Optimizer,
    warmup_steps: int,
    total_steps: int,
    base_lr: float,
    min_lr: float,
    cooldown_steps: int,
) -> LambdaLR:
    """A scheduler to be stepped once per optimizer step; its state dict is plain data."""
    ratio = min(1.0, min_lr / base_lr)
    return LambdaLR(optimizer, Schedule(warmup_steps, total_steps, ratio, cooldown_steps))


def replan(
    scheduler: LambdaLR, step: int, total_steps: int, legacy: bool = False
) -> tuple[float, float] | None:
    """After a resume at ``step``: keep the LR there and fit the rest of the schedule to
    ``total_steps``. Returns (the LR kept, the LR the plain new length would have jumped to)
    when re-planned, else None. ``legacy``: the checkpoint predates saved schedules; its LR
    is the optimizer's (the one its next step would have used)."""
    schedule: Schedule = scheduler.lr_lambdas[0]
    base = scheduler.base_lrs[0]
    saved = scheduler.optimizer.param_groups[0]["lr"] / base if legacy else None
    jump = base * lr_factor(step, schedule.warmup_steps, total_steps, schedule.min_ratio,
                            schedule.cooldown_steps)  # fmt: skip
    if not schedule.replan(step, total_steps, saved):
        return None
    return base * schedule(step), jump


# The plan: a run's arithmetic (batch sizes, learning rate, step counts); the learning rate
# scaled to the global batch by emb.training.lr_scaling (torch-free: the parse warns with it).


@dataclass(frozen=True)
class Plan:
    """Batch sizes, learning rate and step counts, from the config, the data and the world."""

    batch: int
    accumulation: int
    global_batch: int
    lr: float
    micro_per_epoch: int
    updates_per_epoch: int
    total: int
    epochs: float  # math.inf when train.max_updates bounds the run


def validation_steps(val: dict, plan: Plan, world: int) -> float:
    """About how many optimizer steps a validation costs (batches of the busiest rank), for
    the deadline until one was timed."""
    counts = shard_sample_counts(val)
    per_rank = [sum(counts[s] for s in shards_for_rank(val["shards"], r, world))
                for r in range(world)]  # fmt: skip
    return max(math.ceil(n / plan.batch) for n in per_rank) / plan.accumulation


def build_plan(cfg: TrainConfig, train: dict, world: int) -> Plan:
    """The plan of a run on the manifest's ``train`` split (its shards and their samples)."""
    loop = cfg.train
    global_batch = loop.batch_size * loop.accumulation * world
    lr = scaled_lr(cfg.optimizer.lr, loop.lr_scaling, global_batch, reference_batch(cfg))
    per_rank = rank_samples(shard_sample_counts(train), train["shards"], world)
    micro = train_steps_per_epoch(per_rank, loop.batch_size)
    updates = math.ceil(micro / loop.accumulation)
    return Plan(
        loop.batch_size, loop.accumulation, global_batch, lr, micro, updates,
        total=loop.max_updates or loop.epochs * updates,
        epochs=math.inf if loop.max_updates else loop.epochs,
    )  # fmt: skip
