"""A run's arithmetic: batch sizes, learning rate and step counts, from the config, the data
and the world size (logged in one line by :meth:`emb.training.run_log.RunLog.plan`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from emb.loading.batches import (
    rank_samples,
    shard_sample_counts,
    shards_for_rank,
    train_steps_per_epoch,
)
from emb.training.config import REFERENCE_BATCH, TrainConfig
from emb.training.schedule import scaled_lr

# The lowest LR the seeds' guide reports diverging (DeepLab v3+ at 5e-4 gave NaN within the
# first epoch); none is reported for SegFormer.
DIVERGENT_LR = {"deeplab": 5e-4}


def reference_batch(cfg: TrainConfig) -> int:
    """``train.reference_batch``, or the architecture's when it is null."""
    return cfg.train.reference_batch or REFERENCE_BATCH[cfg.model.arch]


def lr_warnings(cfg: TrainConfig, world: int) -> list[str]:
    """A line when scaling ``optimizer.lr`` to this run's global batch gives an LR at or above
    the one the guides report diverging for the architecture (an LR set by hand is the
    user's choice; a scaled one may surprise)."""
    loop = cfg.train
    divergent = DIVERGENT_LR.get(cfg.model.arch)
    global_batch = loop.batch_size * loop.accumulation * world
    ref = reference_batch(cfg)
    lr = scaled_lr(cfg.optimizer.lr, loop.lr_scaling, global_batch, ref)
    if divergent is None or lr <= cfg.optimizer.lr or lr < divergent:
        return []
    return [
        f"{cfg.model.arch}: train.lr_scaling {loop.lr_scaling} scales optimizer.lr "
        f"{cfg.optimizer.lr:.3g} to {lr:.3g} (global batch {global_batch} = {world} ranks x "
        f"batch_size {loop.batch_size} x accumulation {loop.accumulation}, reference batch "
        f"{ref}); the seeds saw {cfg.model.arch} diverge at {divergent:.3g}: lower "
        "optimizer.lr, or use lr_scaling sqrt or none"
    ]


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
