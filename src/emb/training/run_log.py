"""What a training run tells people: console lines, ``history.csv``, TensorBoard, wandb.

Only rank 0 writes; the other ranks' calls join the collectives and write nothing. Console
lines start with a time stamp; losses are printed with 4 significant digits (never a fixed 3
decimals that shows a diverging run as 0.000) and NaN as nan. The cadence is the seeds': a
brief line every ``logging.log_every`` steps (step, loss, lr, epoch), a detailed one every
``logging.detail_every`` (per-head losses, gradient norm, samples/s, data wait, GPU memory),
and one line per validation with its duration. Every train loss written (console,
TensorBoard, wandb, ``history.csv``) is the mean over ranks, not rank 0's alone.
"""

from __future__ import annotations

import csv
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from emb.io import atomic_path
from emb.training.distributed import all_reduce_tensor
from emb.training.loss import LEVELS
from emb.training.lr_scaling import lr_warnings, reference_batch

if TYPE_CHECKING:
    from emb.training.nonfinite import NonfiniteCounts
    from emb.training.run_config import TrainConfig
    from emb.training.schedule import Plan
    from emb.training.trainer import StepResult, Trainer


_NAN = float("nan")


class RunLog:
    """Rank 0's log of one run; train losses are averaged between validations."""

    def __init__(
        self, run_dir: Path, rank: int, cfg: TrainConfig, device: torch.device | None = None
    ) -> None:
        self.run_dir, self.active = run_dir, rank == 0
        self.device = device or torch.device("cpu")  # where the ranks' sums are reduced
        self.log_every, self.detail_every = cfg.logging.log_every, cfg.logging.detail_every
        self.history_path = run_dir / "history.csv"
        self.history: list[dict] = _read_history(self.history_path) if self.active else []
        self._reset_window()
        # applied steps, loss, l1, l2, l3, grad norm: since the last line, since validation
        self._sums = torch.zeros(2, 6, dtype=torch.float64, device=self.device)
        self._skipped_seen = 0
        self.writer = self.wandb = None
        if not self.active:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(run_dir / "tb")
        if cfg.logging.wandb:
            import wandb  # optional: pip install wandb; offline mode needs no network

            self.wandb = wandb.init(
                project=cfg.logging.wandb_project,
                mode=cfg.logging.wandb_mode,
                dir=str(run_dir),
                name=run_dir.name,
                config=cfg.resolved,
            )

    def _warn_skips(self, counts: NonfiniteCounts) -> None:
        """One line for the skips since the last line, naming the last one."""
        new, self._skipped_seen = counts.skipped - self._skipped_seen, counts.skipped
        if new > 0:
            more = f"; {new} since the last line" if new > 1 else ""
            self.warn(
                f"step {counts.last_step} skipped: gradient norm {counts.last_norm} "
                f"(skipped {counts.skipped} in all, {counts.in_row} in a row{more})"
            )

    def _reset_window(self) -> None:
        self._window = {"steps": 0, "seconds": 0.0, "wait": 0.0, "samples": 0, "pixels": 0}

    def info(self, message: str) -> None:
        if self.active:
            print(f"{_now()} {message}", flush=True)

    def warn(self, message: str) -> None:
        if self.active:
            print(f"{_now()} warning: {message}", file=sys.stderr, flush=True)

    def plan(self, plan: Plan, cfg: TrainConfig, world: int, device, trainer: Trainer) -> None:
        """The batch, learning-rate and step arithmetic of this run, in one line."""
        loop = cfg.train
        self.info(
            f"world size {world}, batch {plan.batch} per rank x accumulation {plan.accumulation} "
            f"-> global batch {plan.global_batch}; lr {plan.lr:.3g} (optimizer.lr "
            f"{cfg.optimizer.lr:.3g}, rule {loop.lr_scaling}, reference batch "
            f"{reference_batch(cfg)}); {plan.micro_per_epoch} micro-batches = "
            f"{plan.updates_per_epoch} optimizer steps per epoch, {plan.total} in all; precision "
            f"{trainer.precision} on {device.type}, GradScaler {'on' if trainer.scaler else 'off'}"
        )
        for line in lr_warnings(cfg, world):
            self.warn(line)
        if plan.batch == 1:
            self.warn("train.batch_size is 1 per GPU: BatchNorm statistics and throughput suffer")

    def resumed(self, step: int, skipped: int = 0) -> None:
        """Forget history rows written after the checkpoint we resume from (and warn only of
        skips after it)."""
        self._skipped_seen = skipped
        self.history = [row for row in self.history if int(float(row["step"])) <= step]

    def step(
        self, result: StepResult, trainer: Trainer, seconds: float, waited: float, epoch: int = 0
    ) -> None:
        """Count one step (on the device: no host read); on a logging step (every rank reaches
        the same ones) read the sums since the last line, average them over ranks and write
        the brief or the detailed line, with any skips since the last line."""
        w = self._window
        w["steps"] += 1
        w["seconds"] += seconds
        w["wait"] += waited
        w["samples"] += result.samples
        w["pixels"] += result.pixels
        values = torch.stack([torch.ones_like(result.loss), result.loss,
                              *(result.parts[lv] for lv in LEVELS), result.grad_norm])  # fmt: skip
        self._sums += torch.where(result.finite, values.to(torch.float64), 0.0)
        detailed = trainer.step % self.detail_every == 0
        if trainer.step % self.log_every and not detailed:
            return
        counts = trainer.check_nonfinite()
        self._warn_skips(counts)
        window = torch.tensor([w["samples"], w["pixels"], 1.0], dtype=torch.float64)
        totals = all_reduce_tensor(torch.cat([self._sums[0], window.to(self._sums.device)]))
        n, loss, *parts, norm, samples, pixels, _ranks = totals.tolist()
        self._sums[0].zero_()
        loss, parts, norm = (loss / n, [p / n for p in parts], norm / n) if n else (_NAN,) * 3
        parts = parts if n else [_NAN] * len(LEVELS)
        if not self.active:
            if detailed:
                self._reset_window()
            return
        lr = trainer.scheduler.get_last_lr()[0]
        skipped = f" skipped {counts.skipped}" if counts.skipped else ""
        line = f"step {trainer.step} loss {loss:.4g} lr {lr:.3e} epoch {epoch}"
        heads = dict(zip(LEVELS, parts, strict=True))
        scalars = {"train/loss": loss, "train/lr": lr,
                   **{f"train/loss_{lv}": v for lv, v in heads.items()}}  # fmt: skip
        if detailed:
            elapsed = max(w["seconds"], 1e-9)
            per_head = " ".join(f"{lv} {v:.4g}" for lv, v in heads.items())
            memory = ""
            if torch.cuda.is_available():
                memory = f" gpu_mem {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
            line += (
                f" | {per_head} grad_norm {norm:.3g} samples/s "
                f"{samples / elapsed:.1f} pixels/s {pixels / elapsed:.3g} data_wait "
                f"{w['wait'] / elapsed:.1%}{memory}"
            )
            scalars.update({
                "train/grad_norm": norm, "train/samples_per_s": samples / elapsed,
                "train/data_wait": w["wait"] / elapsed, "train/skipped": counts.skipped,
            })  # fmt: skip
            self._reset_window()
        self.info(line + skipped)
        self._scalars(scalars, trainer.step)

    def validation(
        self, result: dict, trainer: Trainer, epoch: int, seconds: float | None = None
    ) -> None:
        """One row of ``history.csv`` and one line, with the validation's duration; the train
        losses since the last validation are averaged over every rank's steps."""
        sums = all_reduce_tensor(self._sums[1, :5].clone()).tolist()
        self._sums[1].zero_()
        n = max(sums[0], 1)
        row = {
            "epoch": epoch,
            "step": trainer.step,
            "lr": trainer.scheduler.get_last_lr()[0],
            "train_loss": sums[1] / n,
            **{f"train_loss_{lv}": v / n for lv, v in zip(LEVELS, sums[2:], strict=True)},
            "skipped_steps": trainer.skipped,
            **({"val_seconds": round(seconds, 3)} if seconds is not None else {}),
            **result,
        }
        if not self.active:
            return
        took = f" [{seconds:.1f}s]" if seconds is not None else ""
        self.info(
            f"validation epoch {epoch} step {trainer.step} train_loss {row['train_loss']:.4g} "
            f"val_loss {result['val_loss']:.4g} "
            + " ".join(
                f"{m}_{lv} {result[f'val_{m}_{lv}']:.4f}"
                for lv in LEVELS
                for m in ("miou", "f1", "oa")
            )
            + took
        )
        self.history.append(row)
        _write_history(self.history_path, self.history)
        self._scalars({f"val/{k[4:]}": v for k, v in result.items() if k.startswith("val_")},
                      trainer.step)  # fmt: skip
        self._scalars({"train/loss_since_validation": row["train_loss"]}, trainer.step)

    def _scalars(self, scalars: dict[str, float], step: int) -> None:
        if self.writer:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.writer:
            self.writer.close()
            self.writer = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def _now() -> str:
    """The time stamp of a log line (a SLURM log of a day-long run must say when)."""
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def _read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _write_history(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


class KeyRecord:
    """One rank's record of the sample keys it trained on (``logging.record_keys``).

    ``keys/rank{r}.tsv`` holds one line per micro-batch: ``epoch<TAB>batch<TAB>key,key,...``,
    written and flushed before its step. A run resumed at loader position ``start`` keeps the
    lines before it and rewrites the rest, so a killed-and-resumed run leaves the same file as
    an uninterrupted one. Off: every call does nothing.
    """

    def __init__(self, path: Path, enabled: bool, start: tuple[int, int] = (0, 0)) -> None:
        self.path, self.fh = path, None
        if not enabled:
            return
        kept = []
        if start != (0, 0) and path.exists():
            for line in path.read_text().splitlines(keepends=True):
                epoch, batch, *_ = line.split("\t")
                if line.endswith("\n") and (int(epoch), int(batch)) < start:
                    kept.append(line)
        with atomic_path(path) as tmp:
            tmp.write_text("".join(kept))
        self.fh = open(path, "a")  # noqa: SIM115 - closed in close()

    def record(self, epoch: int, batch: int, micro_batch: dict) -> None:
        """Record ``micro_batch["__key__"]`` (the loader's sample keys) at (epoch, batch)."""
        if self.fh is not None:
            self.fh.write(f"{epoch}\t{batch}\t{','.join(micro_batch['__key__'])}\n")
            self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
