"""Stage: train one run. Launched as ``torchrun [...] -m emb.train --config RUN_DIR/config.yaml``.

Reads torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE), builds the pieces and runs the
epoch loop. Rank 0 alone writes ``history.csv``, TensorBoard logs and checkpoints; every rank
writes ``ranks/rank{r}.json`` (shards read, batches per epoch, a digest of its parameters) so
tests can check DDP from the outside. The declared output ``train.json`` is written last.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

from emb import checkpoint
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
from emb.io import write_json
from emb.loss import HierarchyTargets, MultiHeadLoss
from emb.models import build_model
from emb.schedule import warmup_cosine
from emb.trainer import Trainer


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer, in state-dict order: equal iff bitwise equal."""
    h = hashlib.sha256()
    for key, value in checkpoint.unwrap(model).state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _history_rows(path: Path, before_epoch: int) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as fh:
        return [row for row in csv.DictReader(fh) if int(row["epoch"]) < before_epoch]


def _write_history(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def run(
    cfg: TrainConfig, raw: dict, run_dir: Path, rank: int, world: int, device: torch.device
) -> dict:
    """Train ``cfg``; returns the summary written to ``train.json``."""
    log = print if rank == 0 else (lambda _msg: None)
    manifest = json.loads(Path(cfg.data.manifest).read_text())
    if manifest["in_dim"] != cfg.model.in_dim:
        raise ConfigError(
            f"{cfg.data.manifest}: in_dim is {manifest['in_dim']}, "
            f"but model.in_dim is {cfg.model.in_dim}"
        )
    stats = Path(cfg.data.stats_dir) if cfg.data.normalize and cfg.data.stats_dir else None
    prepare = Dequantize.from_stats(cfg.data.source, stats).to(device)
    cmap = load_class_map(cfg.data.classes)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model).to(device)
    if world > 1:
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    steps = train_steps_per_epoch(train["samples"], cfg.train.batch_size, world)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optimizer.lr,
        weight_decay=cfg.optimizer.weight_decay,
        betas=tuple(cfg.optimizer.betas),
    )
    sched = warmup_cosine(
        opt,
        cfg.schedule.warmup_steps,
        steps * cfg.train.epochs,
        cfg.optimizer.lr,
        cfg.schedule.min_lr,
    )
    trainer = Trainer(
        model,
        MultiHeadLoss(cfg.loss.weights, cfg.loss.label_smoothing),
        HierarchyTargets(cmap).to(device),
        prepare,
        opt,
        sched,
        device,
        cfg.train.precision,
        cfg.train.grad_clip,
        cfg.train.log_every,
        log,
    )
    log(
        f"world size {world}, batch {cfg.train.batch_size} per rank, global batch "
        f"{cfg.train.batch_size * world}, {steps} steps per epoch, "
        f"lr {cfg.optimizer.lr} (no scaling rule)"
    )

    start_epoch, start_batch, best, bad_epochs = 0, 0, -1.0, 0
    last = run_dir / "last.pt"
    if cfg.train.restart and last.exists():
        state = checkpoint.load(last)
        checkpoint.unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start_epoch, start_batch = state["loader"]["epoch"], state["loader"]["batch"]
        best, bad_epochs, trainer.step = state["best_miou"], state["bad_epochs"], state["step"]
        log(f"resumed from {last} at epoch {start_epoch}, batch {start_batch}")

    spec = LoaderSpec(
        cfg.data.source,
        cfg.model.in_dim,
        cfg.train.batch_size,
        cfg.train.num_workers,
        cfg.train.shuffle_buffer,
        cfg.train.seed,
    )
    history = _history_rows(run_dir / "history.csv", start_epoch) if rank == 0 else []
    writer = SummaryWriter(run_dir / "tb") if rank == 0 else None
    batches_per_epoch = []
    epoch = start_epoch
    for epoch in range(start_epoch, cfg.train.epochs):
        result = trainer.train_epoch(
            train_batches(
                train["shards"],
                train["samples"],
                spec,
                rank,
                world,
                epoch,
                start_batch=start_batch if epoch == start_epoch else 0,
                shard_samples=shard_sample_counts(train),
            )
        )
        batches_per_epoch.append(result["batches"])
        result.update(
            trainer.validate(
                eval_batches(val["shards"], spec, rank, world, shard_sample_counts(val))
            )
        )
        result.update(epoch=epoch, step=trainer.step, lr=sched.get_last_lr()[0])
        improved = result["val_miou_l3"] > best
        best, bad_epochs = (result["val_miou_l3"], 0) if improved else (best, bad_epochs + 1)
        if rank == 0:
            log(
                f"epoch {epoch} train_loss {result['train_loss']:.4f} "
                f"val_loss {result['val_loss']:.4f} "
                + " ".join(
                    f"{m}_{lv} {result[f'val_{m}_{lv}']:.3f}"
                    for lv in ("l1", "l2", "l3")
                    for m in ("miou", "f1", "oa")
                )
            )
            history.append(result)
            _write_history(run_dir / "history.csv", history)
            for key, value in result.items():
                writer.add_scalar(key, value, trainer.step)
            state = {
                "model": checkpoint.unwrap(model).state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "epoch": epoch,
                "loader": {"epoch": epoch + 1, "batch": 0},  # where the next batch comes from
                "step": trainer.step,
                "best_miou": best,
                "bad_epochs": bad_epochs,
                "config": raw,
            }
            if improved:
                checkpoint.save(run_dir / "best.pt", state)
            checkpoint.save(last, state)
        if bad_epochs >= cfg.train.patience:
            log(f"early stop at epoch {epoch}: no val mIoU L3 gain in {bad_epochs} epochs")
            break
    if writer:
        writer.close()
    mine = shards_for_rank(train["shards"], rank, world)
    write_json(
        run_dir / "ranks" / f"rank{rank}.json",
        {
            "rank": rank,
            "world": world,
            "shards": mine,
            "batches": batches_per_epoch,
            "digest": parameter_digest(model),
            "steps": trainer.step,
        },
    )
    return {
        "best_val_miou_l3": best,
        "epochs": epoch + 1,
        "steps": trainer.step,
        "world": world,
        "global_batch": cfg.train.batch_size * world,
        "model": asdict(cfg.model),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="resolved run config.yaml")
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        cfg, raw = load(args.config)
        summary = run(cfg, raw, args.config.parent, rank, world, device)
        if rank == 0:
            write_json(args.config.parent / "train.json", summary)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
