"""A run's arithmetic: batch sizes, learning rate and step counts, from the config, the data
and the world size (logged in one line by :meth:`emb.training.run_log.RunLog.plan`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from emb.loading.batches import shard_sample_counts, shards_for_rank, train_steps_per_epoch
from emb.training.config import TrainConfig
from emb.training.schedule import scaled_lr


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


def build_plan(cfg: TrainConfig, train_samples: int, world: int) -> Plan:
    loop = cfg.train
    global_batch = loop.batch_size * loop.accumulation * world
    lr = scaled_lr(cfg.optimizer.lr, loop.lr_scaling, global_batch, loop.reference_batch)
    micro = train_steps_per_epoch(train_samples, loop.batch_size, world)
    updates = math.ceil(micro / loop.accumulation)
    return Plan(
        loop.batch_size, loop.accumulation, global_batch, lr, micro, updates,
        total=loop.max_updates or loop.epochs * updates,
        epochs=math.inf if loop.max_updates else loop.epochs,
    )  # fmt: skip
