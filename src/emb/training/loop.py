"""The training loop of one run: ``build_*`` functions set it up, :func:`fit` runs it.

Pure: no CLI, no environment. :func:`run` returns the summary written to ``train.json`` or
raises :class:`Stopped` (every rank stopped on purpose with ``last.pt`` written).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from emb.classes import load_class_map
from emb.io import write_json
from emb.loading.batches import LoaderSpec, eval_batches, train_batches
from emb.loading.dequantize import Dequantize
from emb.loading.device_feed import on_device
from emb.loading.shard_manifest import (
    check_validation_scored,
    read_manifest,
    shard_sample_counts,
    shards_for_rank,
)
from emb.models import build_model
from emb.models.runtime import Runtime
from emb.provenance import digest_config, digest_file, digest_stats, provenance
from emb.training import checkpoint_file
from emb.training.checkpoint_policy import Checkpointer
from emb.training.distributed import any_rank, barrier, wrap_model
from emb.training.ema import ModelEma
from emb.training.loss import HierarchyTargets, MultiHeadLoss, class_weights_from_histogram
from emb.training.run_config import ConfigError, TrainConfig
from emb.training.run_log import KeyRecord, RunLog
from emb.training.run_start import begin
from emb.training.schedule import Plan, build_plan, replan, validation_steps, warmup_cosine
from emb.training.stop_request import StopRequest
from emb.training.trainer import Trainer, fused_adamw
from emb.training.validation_policy import Position, Validator

# What a run reads before it builds anything: its shard manifest, checked, and its statistics.


def read_checked_manifest(cfg: TrainConfig, world: int | None = None) -> dict:
    """The run's manifest, checked against the model and with every shard present (before a
    start can set an earlier run aside); with ``world`` (the ranks), also checked to give a
    validation that scores something (:func:`check_validation_scored`)."""
    manifest = read_manifest(Path(cfg.data.manifest))
    if manifest["in_dim"] != cfg.model.in_dim:
        raise ConfigError(
            f"{cfg.data.manifest}: in_dim is {manifest['in_dim']}, "
            f"but model.in_dim is {cfg.model.in_dim}"
        )
    for split in ("train", "val"):
        missing = [s for s in manifest["splits"][split]["shards"] if not Path(s).is_file()]
        if missing:
            raise ValueError(
                f"{cfg.data.manifest}: the {split} split lists {len(missing)} shard(s) that do "
                f"not exist, e.g. {missing[0]}; rebuild the shards (snakemake --forcerun shards)"
            )
    if world is not None:
        check_validation_scored(
            manifest["splits"]["val"], cfg.data.manifest, cfg.train.batch_size,
            cfg.train.val_min_batch, world,
        )  # fmt: skip
    return manifest


def stats_dir(cfg: TrainConfig) -> Path | None:
    """The channel statistics the run normalizes with, or None (no normalization)."""
    return Path(cfg.data.stats_dir) if cfg.data.normalize and cfg.data.stats_dir else None


class Stopped(Exception):
    """Every rank stopped early on purpose, with ``last.pt`` written."""


@dataclass
class Loop:
    """Everything :func:`fit` drives; built once by :func:`run`."""

    cfg: TrainConfig
    plan: Plan
    trainer: Trainer
    position: Position
    validator: Validator
    checkpointer: Checkpointer
    epoch_batches: Callable[..., Iterator[dict]]  # (epoch, start_batch=) -> batches on the device
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
    for key, value in checkpoint_file.unwrap(model).state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def build_config(cfg: TrainConfig, tile_size: int | None, run_dir: Path) -> TrainConfig:
    """``cfg`` as the run records it in its checkpoints: DeepLab's ``model.aspp_rates`` fixed
    for the tiles (derived when null, refused when they would read only padding). The
    precision stays as set: what ran is the runtime's record, beside it in the provenance."""
    if cfg.model.arch != "deeplab" or tile_size is None:
        return cfg
    try:
        model = cfg.model.for_tile(int(tile_size))
    except ValueError as err:
        raise ConfigError(
            f"{run_dir / 'config.yaml'}: model.{err} ({cfg.data.manifest}: tile_size {tile_size})"
        ) from None
    return cfg.with_value("model", "aspp_rates", list(model.aspp_rates))


def build_trainer(
    cfg: TrainConfig, plan: Plan, class_hist: list[int], world: int, runtime: Runtime
) -> tuple[Trainer, ModelEma | None]:
    """Model (prepared by ``runtime``, wrapped), EMA, optimizer, schedule, loss and input
    pipeline, on ``runtime``'s device."""
    torch.manual_seed(cfg.train.seed)
    device = runtime.device
    plain = runtime.prepare(build_model(cfg.model), training=True)
    model = wrap_model(plain, world, runtime)
    ema = ModelEma(plain, cfg.ema.decay, cfg.ema.warmup) if cfg.ema.enabled else None
    # fused where PyTorch has the kernel (CUDA, ROCm, CPU): one kernel for every parameter,
    # and it skips a non-finite step on the device (found_inf), so no step waits for the GPU
    opt = torch.optim.AdamW(
        model.parameters(), lr=plan.lr, weight_decay=cfg.optimizer.weight_decay,
        betas=tuple(cfg.optimizer.betas), fused=fused_adamw(device) or None,
    )  # fmt: skip
    sched = warmup_cosine(
        opt, cfg.schedule.warmup_steps, plan.total, plan.lr, cfg.schedule.min_lr,
        cfg.schedule.cooldown_steps,
    )  # fmt: skip
    weights = class_weights_from_histogram(class_hist, cfg.loss.class_weights)
    stats = stats_dir(cfg)
    trainer = Trainer(
        model,
        MultiHeadLoss(cfg.loss.weights, cfg.loss.label_smoothing, weights).to(device),
        HierarchyTargets(load_class_map(cfg.data.classes)).to(device),
        Dequantize.from_stats(cfg.data.source, stats).to(device),
        opt,
        sched,
        runtime,
        cfg.train,
        ema,
    )
    return trainer, ema


def build_loop(
    cfg: TrainConfig, run_dir: Path, rank: int, world: int, runtime: Runtime,
    stop: StopRequest,
) -> Loop:  # fmt: skip
    """Everything the loop needs, checked, then started as :mod:`emb.training.run_start` decides
    (resumed, fresh or fine-tuned); files are written only after that. ``runtime`` is the
    process's resolved device and numerics (:meth:`Runtime.resolve`, in the stage)."""
    device = runtime.device
    manifest = read_checked_manifest(cfg)
    cfg = build_config(cfg, manifest.get("tile_size"), run_dir)
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    plan = build_plan(cfg, train, world)
    trainer, ema = build_trainer(cfg, plan, train["class_hist"], world, runtime)
    position = Position()
    # the run's identity, in every checkpoint: the tile size travels with the run (predict's
    # windows), the resolved runtime with its provenance (train.json too)
    identity = {
        "world": world, "global_batch": plan.global_batch, "config": cfg.resolved,
        "run": run_dir.name, "tile_size": manifest.get("tile_size"),
        "provenance": provenance(
            config_digest=digest_config(cfg.resolved),
            manifest_digest=digest_file(cfg.data.manifest),
            stats_digest=digest_stats(stats_dir(cfg)), device=device,
        ) | runtime.record(),
    }  # fmt: skip
    checkpointer = Checkpointer(
        run_dir, rank, trainer, ema, position, identity,
        save_every_epochs=cfg.train.save_every, every_updates=cfg.train.checkpoint_every_updates,
        finished=lambda: validator.finished(plan),
    )  # fmt: skip
    start, notes = begin(cfg, run_dir, rank, checkpointer)
    log = RunLog(run_dir, rank, cfg, device)
    log.plan(plan, cfg, world, device, trainer)
    if start.resume is not None:
        log.resumed(trainer.step, trainer.skipped)
        notes += schedule_note(trainer, plan)
    for note in notes:
        log.info(note)
    keys = KeyRecord(run_dir / "keys" / f"rank{rank}.tsv", cfg.logging.record_keys,
                     (position.epoch, position.batch))  # fmt: skip
    spec = LoaderSpec(
        cfg.data.source, cfg.model.in_dim, plan.batch, cfg.train.num_workers,
        cfg.train.shuffle_buffer, cfg.train.seed, tile_size=manifest.get("tile_size"),
        pin_memory=device.type == "cuda",
    )  # fmt: skip

    def val_batches() -> Iterator[dict]:
        return on_device(
            eval_batches(val["shards"], spec, rank, world, shard_sample_counts(val)), device
        )

    stop.validation_steps = validation_steps(val, plan, world)
    validator = Validator(
        trainer, ema, val_batches, position, checkpointer, log, stop,
        select_best_by=cfg.ema.select_best_by, every_updates=cfg.train.val_every_updates,
        patience=cfg.train.patience, bn_batch_stats=cfg.train.val_bn_batch_stats,
        min_batch=cfg.train.val_min_batch,
    )  # fmt: skip

    def epoch_batches(epoch: int, start_batch: int = 0) -> Iterator[dict]:
        return on_device(
            train_batches(train["shards"], train["samples"], spec, rank, world, epoch,
                          start_batch, shard_sample_counts(train)),
            device,
        )  # fmt: skip

    return Loop(cfg, plan, trainer, position, validator, checkpointer, epoch_batches, keys, log,
                stop, device, rank, world, train["shards"])  # fmt: skip


def schedule_note(trainer: Trainer, plan: Plan) -> list[str]:
    """Fit a resumed schedule to this run's length without a jump in the LR (the remaining
    cosine re-planned from the current LR when the length changed); a line saying so."""
    moved = replan(trainer.scheduler, trainer.step, plan.total, trainer.legacy_schedule)
    if moved is None:
        return []
    kept, jump = moved
    return [f"run length changed to {plan.total} optimizer steps: the remaining cosine is "
            f"re-planned from the current lr {kept:.3e} at step {trainer.step} to min_lr "
            f"(the new length alone would have set {jump:.3e})"]  # fmt: skip


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
            loop.log.step(result, trainer, seconds, waited, pos.epoch + 1)
            if loop.validator.due_after_step(result) and loop.validator.validate():
                early = True
                break
            loop.checkpointer.after_step(result)
            # the ranks agree on stopping every stop.check_every steps and before a validation
            # (a host read, which a GPU must not wait for every step; the deadline covers it)
            ahead = loop.validator.due_soon(plan)  # the deadline counts its validation too
            if trainer.step % stop.check_every == 0 or ahead:
                trainer.check_nonfinite()  # a read anyway: raises where the run diverged
                if any_rank(stop.reason(validation=ahead) is not None, loop.device):
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
    reason = loop.stop.reason(validation=loop.validator.due_soon(loop.plan))
    reason = reason or "another rank asked to stop"
    loop.checkpointer.save("last.pt", finished=False)  # a retry resumes it, whatever its state
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
    cfg: TrainConfig, run_dir: Path, rank: int, world: int, runtime: Runtime,
    stop: StopRequest | None = None,
) -> dict:  # fmt: skip
    """Train ``cfg`` with ``runtime``; returns the summary written to ``train.json``. Raises
    :class:`Stopped`."""
    loop = build_loop(cfg, run_dir, rank, world, runtime, stop or StopRequest())
    batches_per_epoch = fit(loop)
    loop.log.close()
    loop.keys.close()
    trainer, plan, cfg = loop.trainer, loop.plan, loop.cfg
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
        "tile_size": loop.checkpointer.identity["tile_size"],
        "provenance": loop.checkpointer.identity["provenance"],
    }
