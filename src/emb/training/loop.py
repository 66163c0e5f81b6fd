"""The training loop of one run: ``build_*`` functions set it up, :func:`fit` runs it.

Pure: no CLI, no environment. :func:`run` returns the summary written to ``train.json`` or
raises :class:`Stopped` (every rank stopped on purpose with ``last.pt`` written).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from emb.classes import load_class_map
from emb.io import write_json
from emb.loading.batches import (
    LoaderSpec,
    eval_batches,
    shard_sample_counts,
    shards_for_rank,
    train_batches,
    train_steps_per_epoch,
)
from emb.loading.dequantize import Dequantize
from emb.models import build_model
from emb.prep.manifest import read_manifest
from emb.training import checkpoint
from emb.training.checkpointer import Checkpointer
from emb.training.config import ConfigError, TrainConfig
from emb.training.distributed import any_rank, barrier, wrap_model
from emb.training.ema import ModelEma
from emb.training.loss import HierarchyTargets, MultiHeadLoss, class_weights_from_histogram
from emb.training.run_log import KeyRecord, RunLog
from emb.training.schedule import scaled_lr, warmup_cosine
from emb.training.stop import StopRequest
from emb.training.trainer import Trainer
from emb.training.validator import Position, Validator


class Stopped(Exception):
    """Every rank stopped early on purpose, with ``last.pt`` written."""


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


@dataclass
class Loop:
    """Everything :func:`fit` drives; built once by :func:`run`."""

    cfg: TrainConfig
    plan: Plan
    trainer: Trainer
    position: Position
    validator: Validator
    checkpointer: Checkpointer
    epoch_batches: partial
    keys: KeyRecord
    log: RunLog
    stop: StopRequest
    device: torch.device
    rank: int
    world: int
    train_shards: list[str]


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer, in state-dict order: equal iff bitwise equal."""
    h = hashlib.sha256()
    for key, value in checkpoint.unwrap(model).state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def build_manifest(cfg: TrainConfig) -> dict:
    manifest = read_manifest(Path(cfg.data.manifest))
    if manifest["in_dim"] != cfg.model.in_dim:
        raise ConfigError(
            f"{cfg.data.manifest}: in_dim is {manifest['in_dim']}, "
            f"but model.in_dim is {cfg.model.in_dim}"
        )
    return manifest


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


def build_trainer(
    cfg: TrainConfig, plan: Plan, class_hist: list[int], world: int, device: torch.device
) -> tuple[Trainer, ModelEma | None]:
    """Model (wrapped), EMA, optimizer, schedule, loss and input pipeline, on ``device``."""
    torch.manual_seed(cfg.train.seed)
    plain = build_model(cfg.model).to(device)
    loop = cfg.train
    model = wrap_model(
        plain, world, device, channels_last=loop.channels_last, compile=loop.compile,
        compile_memory_budget=loop.compile_memory_budget,
    )  # fmt: skip
    ema = ModelEma(plain, cfg.ema.decay) if cfg.ema.enabled else None
    opt = torch.optim.AdamW(
        model.parameters(), lr=plan.lr, weight_decay=cfg.optimizer.weight_decay,
        betas=tuple(cfg.optimizer.betas),
    )  # fmt: skip
    sched = warmup_cosine(
        opt, cfg.schedule.warmup_steps, plan.total, plan.lr, cfg.schedule.min_lr,
        cfg.schedule.cooldown_steps,
    )  # fmt: skip
    weights = class_weights_from_histogram(class_hist, cfg.loss.class_weights)
    stats = Path(cfg.data.stats_dir) if cfg.data.normalize and cfg.data.stats_dir else None
    trainer = Trainer(
        model,
        MultiHeadLoss(cfg.loss.weights, cfg.loss.label_smoothing, weights).to(device),
        HierarchyTargets(load_class_map(cfg.data.classes)).to(device),
        Dequantize.from_stats(cfg.data.source, stats).to(device),
        opt,
        sched,
        device,
        precision=loop.precision,
        grad_scaler=loop.uses_grad_scaler,
        grad_clip=loop.grad_clip,
        ema=ema,
        nonfinite_policy=loop.nonfinite_policy,
        max_nonfinite_in_row=loop.max_nonfinite_in_row,
        channels_last=loop.channels_last,
    )
    return trainer, ema


def build_loop(
    cfg: TrainConfig, run_dir: Path, rank: int, world: int, device: torch.device,
    stop: StopRequest,
) -> Loop:  # fmt: skip
    """Everything the loop needs, restored from ``last.pt`` (or ``train.init_from``) if asked."""
    log = RunLog(run_dir, rank, cfg)
    manifest = build_manifest(cfg)
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    plan = build_plan(cfg, train["samples"], world)
    trainer, ema = build_trainer(cfg, plan, train["class_hist"], world, device)
    log.plan(plan, cfg, world, device, trainer)
    position = Position()
    identity = {"world": world, "global_batch": plan.global_batch, "config": cfg.resolved}
    checkpointer = Checkpointer(
        run_dir, rank, trainer, ema, position, identity,
        save_every_epochs=cfg.train.save_every, every_updates=cfg.train.checkpoint_every_updates,
    )  # fmt: skip
    restore(cfg, checkpointer, trainer, position, log)
    keys = KeyRecord(run_dir / "keys" / f"rank{rank}.tsv", cfg.logging.record_keys,
                     (position.epoch, position.batch))  # fmt: skip
    spec = LoaderSpec(
        cfg.data.source, cfg.model.in_dim, plan.batch, cfg.train.num_workers,
        cfg.train.shuffle_buffer, cfg.train.seed,
    )  # fmt: skip
    val_batches = partial(eval_batches, val["shards"], spec, rank, world, shard_sample_counts(val))
    validator = Validator(
        trainer, ema, val_batches, position, checkpointer, log,
        select_best_by=cfg.ema.select_best_by, every_updates=cfg.train.val_every_updates,
        patience=cfg.train.patience, bn_batch_stats=cfg.train.val_bn_batch_stats,
        min_batch=cfg.train.val_min_batch,
    )  # fmt: skip
    epoch_batches = partial(
        train_batches, train["shards"], train["samples"], spec, rank, world,
        shard_samples=shard_sample_counts(train),
    )  # fmt: skip
    return Loop(cfg, plan, trainer, position, validator, checkpointer, epoch_batches, keys, log,
                stop, device, rank, world, train["shards"])  # fmt: skip


def restore(
    cfg: TrainConfig, checkpointer: Checkpointer, trainer: Trainer, position: Position,
    log: RunLog,
) -> None:  # fmt: skip
    for leftover in checkpointer.clean_leftovers():
        log.info(f"removed {leftover.name}, left by a checkpoint write that was killed")
    last = checkpointer.last
    if cfg.train.restart and last.exists():
        checkpointer.resume(last)
        log.resumed(trainer.step)
        log.info(f"resumed from {last} at epoch {position.epoch}, batch {position.batch}")
    elif cfg.train.init_from:
        checkpointer.init_weights(Path(cfg.train.init_from))
        log.info(f"initialized weights from {cfg.train.init_from} (fine-tuning)")


def fit(loop: Loop) -> list[int]:
    """Train until the epochs or updates are done or early stopping says so; returns the
    micro-batches drawn per epoch (as this rank saw them)."""
    plan, trainer, pos, stop = loop.plan, loop.trainer, loop.position, loop.stop
    batches_per_epoch: list[int] = []
    early = False
    while pos.epoch < plan.epochs and trainer.step < plan.total and not early:
        stream = iter(loop.epoch_batches(pos.epoch, start_batch=pos.batch))
        while pos.batch < plan.micro_per_epoch and trainer.step < plan.total:
            tick = time.perf_counter()
            n = min(plan.accumulation, plan.micro_per_epoch - pos.batch)
            group = [next(stream) for _ in range(n)]
            waited = time.perf_counter() - tick
            for i, micro in enumerate(group):  # before the step: a checkpoint of it implies
                loop.keys.record(pos.epoch, pos.batch + i, micro)  # every rank's line is written
            result = trainer.train_step(group)
            pos.batch += len(group)
            seconds = time.perf_counter() - tick
            stop.record_step(seconds)
            loop.log.step(result, trainer, seconds, waited)
            if loop.validator.due_after_step(result) and loop.validator.validate():
                early = True
                break
            loop.checkpointer.after_step(result)
            if any_rank(stop.reason() is not None, loop.device):
                stop_now(loop)
        batches_per_epoch.append(pos.batch)
        if pos.batch >= plan.micro_per_epoch:
            pos.epoch, pos.batch = pos.epoch + 1, 0
            if loop.validator.due_at_epoch_end() and loop.validator.validate():
                early = True
            loop.checkpointer.after_epoch(pos.epoch)
    if early:
        loop.log.info(f"early stop: no {loop.validator.select} gain in {pos.bad} validations")
    loop.validator.finish()
    return batches_per_epoch


def stop_now(loop: Loop) -> None:
    """Save ``last.pt``, wait for every rank, record why, raise :class:`Stopped`."""
    reason = loop.stop.reason() or "another rank asked to stop"
    loop.checkpointer.save("last.pt")
    barrier()  # no rank exits before last.pt is complete
    last, trainer, pos = loop.checkpointer.last, loop.trainer, loop.position
    write_json(
        last.parent / "ranks" / f"rank{loop.rank}.stopped.json",
        {"rank": loop.rank, "step": trainer.step, "loader": [pos.epoch, pos.batch],
         "reason": reason},
    )  # fmt: skip
    loop.log.info(f"stopping at step {trainer.step} ({reason}); saved {last}; run again to resume")
    loop.log.close()
    raise Stopped(reason)


def run(
    cfg: TrainConfig, run_dir: Path, rank: int, world: int, device: torch.device,
    stop: StopRequest | None = None,
) -> dict:  # fmt: skip
    """Train ``cfg``; returns the summary written to ``train.json``. Raises :class:`Stopped`."""
    loop = build_loop(cfg, run_dir, rank, world, device, stop or StopRequest())
    batches_per_epoch = fit(loop)
    loop.log.close()
    loop.keys.close()
    trainer, plan = loop.trainer, loop.plan
    write_json(
        run_dir / "ranks" / f"rank{rank}.json",
        {
            "rank": rank,
            "world": world,
            "shards": shards_for_rank(loop.train_shards, rank, world),
            "batches": batches_per_epoch,
            "digest": parameter_digest(trainer.model),
            "steps": trainer.step,
            "skipped": trainer.skipped,
        },
    )
    return {
        "best_val_miou_l3": loop.position.best,
        "epochs": loop.position.epoch,
        "steps": trainer.step,
        "skipped_steps": trainer.skipped,
        "world": world,
        "global_batch": plan.global_batch,
        "lr": plan.lr,
        "model": cfg.resolved["model"],
    }
