"""Stage: train one run. Launched as ``torchrun [...] -m emb.train --config RUN_DIR/config.yaml``.

``main`` is the glue: it reads torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE) and the
job's deadline (SLURM or ``train.time_limit_s``), installs the SIGUSR1/SIGTERM flag and calls
:func:`run`. Rank 0 alone writes ``history.csv``, TensorBoard logs and checkpoints; every rank
writes ``ranks/rank{r}.json`` (shards read, batches per epoch, a digest of its parameters) so
tests can check DDP from the outside. The declared output ``train.json`` is written last.

Exit codes: 0 done; 2 bad input or config; 3 diverged; 74 disk full (the previous checkpoint
is intact); 75 stopped early with a checkpoint (signal or deadline): running the job again
resumes. Collectives time out after ``train.collective_timeout_s``, so a lost rank fails the
job instead of hanging it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from emb import checkpoint
from emb.checkpoint import CheckpointError
from emb.classes import load_class_map
from emb.config import ConfigError, TrainConfig, load
from emb.data import (
    Dequantize,
    LoaderSpec,
    eval_batches,
    shard_sample_counts,
    shards_for_rank,
    train_batches,
    train_steps_per_epoch,
)
from emb.ema import ModelEma
from emb.io import is_disk_full, write_json
from emb.loss import HierarchyTargets, MultiHeadLoss, class_weights_from_histogram
from emb.models import build_model
from emb.run_log import KeyRecord, RunLog
from emb.schedule import scaled_lr, warmup_cosine
from emb.stop import EXIT_STOPPED, StopRequest, agree_to_stop
from emb.trainer import Trainer, TrainingDiverged

EXIT_CONFIG, EXIT_DIVERGED, EXIT_DISK_FULL = 2, 3, 74  # 74: EX_IOERR


class Stopped(Exception):
    """Every rank stopped early on purpose, with ``last.pt`` written."""


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer, in state-dict order: equal iff bitwise equal."""
    h = hashlib.sha256()
    for key, value in checkpoint.unwrap(model).state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def wrap_model(model: torch.nn.Module, cfg: TrainConfig, world: int, device: torch.device):
    """channels_last, torch.compile (inside DDP, never around it), then DDP."""
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if cfg.train.compile:
        if cfg.train.compile_memory_budget is not None:
            import torch._functorch.config as functorch_config

            functorch_config.activation_memory_budget = cfg.train.compile_memory_budget
        model = torch.compile(model)
    if world > 1:
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    return model


def read_manifest(path: Path) -> dict:
    """The shard manifest, refused with a message naming the file when it is not one."""
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not a JSON shard manifest ({err}); rebuild it") from err
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    missing = [k for k in ("train", "val") if not isinstance(splits, dict) or k not in splits]
    if not isinstance(manifest, dict) or "in_dim" not in manifest or missing:
        raise ConfigError(
            f"{path}: expected a shard manifest with in_dim and splits train and val, "
            f"found keys {sorted(manifest) if isinstance(manifest, dict) else type(manifest)}"
        )
    return manifest


class Position:
    """Where training stands: the loader's (epoch, micro-batch) and the early-stopping state."""

    def __init__(self) -> None:
        self.epoch, self.batch = 0, 0
        self.best, self.bad = -1.0, 0
        self.validated_step = -1


def run(
    cfg: TrainConfig,
    raw: dict,
    run_dir: Path,
    rank: int,
    world: int,
    device: torch.device,
    stop: StopRequest | None = None,
) -> dict:
    """Train ``cfg``; returns the summary written to ``train.json``. Raises :class:`Stopped`."""
    stop = stop or StopRequest()
    log = RunLog(run_dir, rank, cfg, raw)
    manifest = read_manifest(Path(cfg.data.manifest))
    if manifest["in_dim"] != cfg.model.in_dim:
        raise ConfigError(
            f"{cfg.data.manifest}: in_dim is {manifest['in_dim']}, "
            f"but model.in_dim is {cfg.model.in_dim}"
        )
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    stats = Path(cfg.data.stats_dir) if cfg.data.normalize and cfg.data.stats_dir else None
    cmap = load_class_map(cfg.data.classes)
    torch.manual_seed(cfg.train.seed)
    plain = build_model(cfg.model).to(device)
    model = wrap_model(plain, cfg, world, device)
    ema = ModelEma(plain, cfg.ema.decay) if cfg.ema.enabled else None

    batch, accumulation = cfg.train.batch_size, cfg.train.accumulation
    global_batch = batch * accumulation * world
    lr = scaled_lr(cfg.optimizer.lr, cfg.train.lr_scaling, global_batch, cfg.train.reference_batch)
    micro_per_epoch = train_steps_per_epoch(train["samples"], batch, world)
    updates_per_epoch = math.ceil(micro_per_epoch / accumulation)
    total = cfg.train.max_updates or cfg.train.epochs * updates_per_epoch
    opt = torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=cfg.optimizer.weight_decay,
        betas=tuple(cfg.optimizer.betas),
    )  # fmt: skip
    sched = warmup_cosine(
        opt, cfg.schedule.warmup_steps, total, lr, cfg.schedule.min_lr,
        cfg.schedule.cooldown_steps,
    )  # fmt: skip
    weights = class_weights_from_histogram(train["class_hist"], cfg.loss.class_weights)
    trainer = Trainer(
        model,
        MultiHeadLoss(cfg.loss.weights, cfg.loss.label_smoothing, weights).to(device),
        HierarchyTargets(cmap).to(device),
        Dequantize.from_stats(cfg.data.source, stats).to(device),
        opt,
        sched,
        device,
        precision=cfg.train.precision,
        grad_scaler=cfg.train.uses_grad_scaler,
        grad_clip=cfg.train.grad_clip,
        ema=ema,
        nonfinite_policy=cfg.train.nonfinite_policy,
        max_nonfinite_in_row=cfg.train.max_nonfinite_in_row,
        channels_last=cfg.train.channels_last,
    )
    log.info(
        f"world size {world}, batch {batch} per rank x accumulation {accumulation} -> global "
        f"batch {global_batch}; lr {lr:.3g} (optimizer.lr {cfg.optimizer.lr:.3g}, rule "
        f"{cfg.train.lr_scaling}, reference batch {cfg.train.reference_batch}); "
        f"{micro_per_epoch} micro-batches = {updates_per_epoch} optimizer steps per epoch, "
        f"{total} in all; precision {cfg.train.precision} on {device.type}, "
        f"GradScaler {'on' if trainer.scaler else 'off'}"
    )
    if batch == 1:
        log.warn("train.batch_size is 1 per GPU: BatchNorm statistics and throughput suffer")

    pos = Position()
    last = run_dir / "last.pt"
    if rank == 0:
        for leftover in checkpoint.clean_leftovers(run_dir):
            log.info(f"removed {leftover.name}, left by a checkpoint write that was killed")
    if cfg.train.restart and last.exists():
        _resume(last, raw, trainer, pos)
        log.resumed(trainer.step)
        log.info(f"resumed from {last} at epoch {pos.epoch}, batch {pos.batch}")
    elif cfg.train.init_from:
        _init_weights(Path(cfg.train.init_from), raw, trainer)
        log.info(f"initialized weights from {cfg.train.init_from} (fine-tuning)")
    keys = KeyRecord(run_dir / "keys" / f"rank{rank}.tsv", cfg.logging.record_keys,
                     (pos.epoch, pos.batch))  # fmt: skip

    spec = LoaderSpec(
        cfg.data.source, cfg.model.in_dim, batch, cfg.train.num_workers,
        cfg.train.shuffle_buffer, cfg.train.seed,
    )  # fmt: skip
    models = {"raw": trainer.model}
    if ema is not None:
        models = {"ema": ema.module, "raw": trainer.model}
    select = f"val_{cfg.ema.select_best_by if ema is not None else 'raw'}_miou_l3"

    def validate() -> bool:
        """Validate, log, save best/last; True when early stopping says to stop."""
        trainer.average_buffers()
        if ema is not None:
            ema.update_buffers(trainer.model)
        batches = eval_batches(val["shards"], spec, rank, world, shard_sample_counts(val))
        result = trainer.validate(
            batches, models, cfg.train.val_bn_batch_stats, cfg.train.val_min_batch
        )
        pos.validated_step = trainer.step
        improved = result[select] > pos.best
        pos.best, pos.bad = (result[select], 0) if improved else (pos.best, pos.bad + 1)
        result["best_val_miou_l3"] = pos.best
        log.validation(result, trainer, pos.epoch)
        if rank == 0:
            state = _state(trainer, pos, raw, world, global_batch)
            if improved:
                checkpoint.save(run_dir / "best.pt", state)
            checkpoint.save(last, state)
        return pos.bad >= cfg.train.patience

    batches_per_epoch: list[int] = []
    early = False
    epochs = math.inf if cfg.train.max_updates else cfg.train.epochs
    while pos.epoch < epochs and trainer.step < total and not early:
        stream = iter(
            train_batches(
                train["shards"], train["samples"], spec, rank, world, pos.epoch,
                start_batch=pos.batch, shard_samples=shard_sample_counts(train),
            )
        )  # fmt: skip
        while pos.batch < micro_per_epoch and trainer.step < total:
            tick = time.perf_counter()
            group = [next(stream) for _ in range(min(accumulation, micro_per_epoch - pos.batch))]
            waited = time.perf_counter() - tick
            for i, micro in enumerate(group):  # before the step: a checkpoint of it implies
                keys.record(pos.epoch, pos.batch + i, micro)  # every rank's line is written
            result = trainer.train_step(group)
            pos.batch += len(group)
            seconds = time.perf_counter() - tick
            stop.record_step(seconds)
            log.step(result, trainer, seconds, waited)
            every = cfg.train.val_every_updates
            if every and result.applied and trainer.step % every == 0 and validate():
                early = True
                break
            every = cfg.train.checkpoint_every_updates
            if every and result.applied and trainer.step % every == 0 and rank == 0:
                checkpoint.save(last, _state(trainer, pos, raw, world, global_batch))
            if agree_to_stop(stop.reason() is not None, device):
                _stop(stop, trainer, pos, raw, world, global_batch, last, rank, log)
        batches_per_epoch.append(pos.batch)
        if pos.batch >= micro_per_epoch:
            pos.epoch, pos.batch = pos.epoch + 1, 0
            if not cfg.train.val_every_updates and validate():
                early = True
            if cfg.train.save_every and pos.epoch % cfg.train.save_every == 0 and rank == 0:
                state = _state(trainer, pos, raw, world, global_batch)
                checkpoint.save(run_dir / f"epoch_{pos.epoch:04d}.pt", state)
    if early:
        log.info(f"early stop: no {select} gain in {pos.bad} validations")
    if pos.validated_step != trainer.step:
        validate()  # the final weights are validated (and saved) too
    log.close()
    keys.close()
    write_json(
        run_dir / "ranks" / f"rank{rank}.json",
        {
            "rank": rank,
            "world": world,
            "shards": shards_for_rank(train["shards"], rank, world),
            "batches": batches_per_epoch,
            "digest": parameter_digest(trainer.model),
            "steps": trainer.step,
            "skipped": trainer.skipped,
        },
    )
    return {
        "best_val_miou_l3": pos.best,
        "epochs": pos.epoch,
        "steps": trainer.step,
        "skipped_steps": trainer.skipped,
        "world": world,
        "global_batch": global_batch,
        "lr": lr,
        "model": raw["model"],
    }


def _state(trainer: Trainer, pos: Position, raw: dict, world: int, global_batch: int) -> dict:
    """Everything a resume needs, as tensors and plain types (loadable with weights_only)."""
    ema = trainer.ema
    return {
        "format": 2,
        "model": checkpoint.unwrap(trainer.model).state_dict(),
        "ema": ema.module.state_dict() if ema is not None else None,
        "ema_updates": ema.updates if ema is not None else 0,
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict() if trainer.scaler else None,
        "rng": checkpoint.rng_state(),
        "loader": {"epoch": pos.epoch, "batch": pos.batch},  # where the next batch comes from
        "epoch": pos.epoch,
        "step": trainer.step,
        "skipped": trainer.skipped,
        "skipped_in_row": trainer.skipped_in_row,
        "early_stop": {"best": pos.best, "bad": pos.bad},
        "world": world,
        "global_batch": global_batch,
        "config": raw,
        "saved_at": datetime.now().isoformat(timespec="seconds"),
    }


def _resume(path: Path, raw: dict, trainer: Trainer, pos: Position) -> None:
    """Restore everything from ``path``: weights, optimizer, scheduler, EMA, RNG, position."""
    state = checkpoint.load(path)
    checkpoint.check_compatible(state["config"], raw, path)
    if "optimizer" not in state or "loader" not in state:
        raise CheckpointError(f"{path}: holds weights only; it cannot be resumed")
    checkpoint.unwrap(trainer.model).load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.ema is not None:
        if state.get("ema") is None:
            raise CheckpointError(f"{path}: has no EMA weights, but ema.enabled is true")
        trainer.ema.module.load_state_dict(state["ema"])
        trainer.ema.updates = int(state["ema_updates"])
    if trainer.scaler is not None and state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    checkpoint.set_rng_state(state["rng"])
    pos.epoch, pos.batch = state["loader"]["epoch"], state["loader"]["batch"]
    pos.best, pos.bad = state["early_stop"]["best"], state["early_stop"]["bad"]
    trainer.step, trainer.skipped = state["step"], state["skipped"]
    trainer.skipped_in_row = state["skipped_in_row"]


def _init_weights(path: Path, raw: dict, trainer: Trainer) -> None:
    """Weights only (fine-tuning): a fresh optimizer, schedule and position."""
    state = checkpoint.load(path)
    checkpoint.check_compatible(state["config"], raw, path)
    checkpoint.unwrap(trainer.model).load_state_dict(state["model"])
    if trainer.ema is not None:
        trainer.ema.module.load_state_dict(state["model"])


def _stop(stop, trainer, pos, raw, world, global_batch, last, rank, log) -> None:
    reason = stop.reason() or "another rank asked to stop"
    if rank == 0:
        checkpoint.save(last, _state(trainer, pos, raw, world, global_batch))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank exits before last.pt is complete
    write_json(
        last.parent / "ranks" / f"rank{rank}.stopped.json",
        {"rank": rank, "step": trainer.step, "loader": [pos.epoch, pos.batch], "reason": reason},
    )
    log.info(f"stopping at step {trainer.step} ({reason}); saved {last}; run again to resume")
    log.close()
    raise Stopped(reason)


def slurm_end_time(job_id: str | None) -> float | None:
    """The SLURM job's end time (epoch seconds) from ``squeue``, or None when unknown."""
    if not job_id:
        return None
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%e"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
        return datetime.fromisoformat(out).timestamp()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def job_deadline(cfg: TrainConfig, env: dict[str, str], started: float) -> float | None:
    """The earlier of SLURM's end time and ``train.time_limit_s`` after ``started``."""
    candidates = []
    if env.get("SLURM_JOB_END_TIME", "").isdigit():
        candidates.append(float(env["SLURM_JOB_END_TIME"]))
    else:
        end = slurm_end_time(env.get("SLURM_JOB_ID"))
        if end is not None:
            candidates.append(end)
    if cfg.train.time_limit_s:
        candidates.append(started + cfg.train.time_limit_s)
    return min(candidates) if candidates else None


def main(argv: list[str] | None = None) -> None:
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="resolved run config.yaml")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    rank, world = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    local = int(env.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    code = 0
    stop = StopRequest()
    stop.install()  # before the process group: a signal during set-up is not lost
    try:
        cfg, raw = load(args.config)
        if world > 1:
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                timeout=timedelta(seconds=cfg.train.collective_timeout_s),
            )
        if device.type == "cpu" and cfg.train.precision != "fp32":
            raw["train"]["precision"] = "fp32"  # CPU autocast is slower than fp32 here
            cfg = TrainConfig.from_dict(raw, str(args.config))
        stop.deadline, stop.margin_s = job_deadline(cfg, env, started), cfg.train.stop_margin_s
        summary = run(cfg, raw, args.config.parent, rank, world, device, stop)
        if rank == 0:
            write_json(args.config.parent / "train.json", summary)
    except Stopped:
        code = EXIT_STOPPED
    except TrainingDiverged as err:
        print(f"error: {args.config}: {err}", file=sys.stderr)
        code = EXIT_DIVERGED
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        code = EXIT_CONFIG
    except OSError as err:
        if not is_disk_full(err):
            raise
        print(
            f"error: disk full: cannot write {err.filename} ({err.strerror}); the previous "
            "checkpoint is intact: free space and run the job again to resume",
            file=sys.stderr,
        )
        code = EXIT_DISK_FULL
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if code == EXIT_STOPPED and world > 1:
        # torchrun SIGTERMs the ranks still alive once one rank has exited non-zero; a rank in
        # interpreter shutdown has lost its SIGTERM handler and would die with -15, not 75.
        # Everything is written and closed by now: leave without the shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
