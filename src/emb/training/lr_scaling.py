"""The learning rate scaled to a run's global batch (``train.lr_scaling`` from the reference
batch) and the warning when the scaled LR reaches one the guides saw diverge. Plain arithmetic
on the config, without torch: the workflow warns at parse time (:mod:`emb.workflow.parsed_runs`),
the run's log again at its start (:mod:`emb.training.run_log`)."""

from __future__ import annotations

import math

from emb.training.run_config import REFERENCE_BATCH, TrainConfig


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
