"""What a training checkpoint holds and when one is written; resuming and fine-tuning from one.

A checkpoint is the union of its parts' ``state_dict()``s (the trainer: weights, optimizer,
schedule, scaler, counters; the EMA; the loop position: loader and early stopping) plus the
RNG state, the run's identity (config, world size, global batch) and ``finished``: true only
when the run had nothing left to do (its last validation done), so that a rerun of a finished
run starts over instead of resuming it (:mod:`emb.training.run_start`). Only rank 0 writes; every
write goes through :func:`emb.training.checkpoint_file.save` (atomic, with a sha256 sidecar).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from emb.training import checkpoint_file
from emb.training.checkpoint_file import CheckpointError
from emb.training.ema import ModelEma
from emb.training.trainer import StepResult, Trainer

FORMAT = 2


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Checkpointer:
    """Rank 0's checkpoints of one run: ``last.pt``, ``best.pt`` and ``epoch_NNNN.pt``."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        trainer: Trainer,
        ema: ModelEma | None,
        position: Stateful,
        identity: dict[str, Any],
        *,
        save_every_epochs: int,
        every_updates: int,
        finished: Callable[[], bool] = lambda: False,
    ) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.trainer, self.ema, self.position = trainer, ema, position
        self.identity = identity  # {"world", "global_batch", "config", "run", "provenance"}
        self.save_every_epochs, self.every_updates = save_every_epochs, every_updates
        self.finished = finished  # nothing left to train and the final state validated
        self.last = run_dir / "last.pt"

    def state(self, finished: bool | None = None) -> dict[str, Any]:
        """Everything a resume needs, as tensors and plain types (loadable with weights_only)."""
        ema = self.ema.state_dict() if self.ema is not None else {"ema": None, "ema_updates": 0}
        return {
            "format": FORMAT,
            **self.trainer.state_dict(),
            **ema,
            **self.position.state_dict(),
            "rng": checkpoint_file.rng_state(),
            **self.identity,
            "finished": self.finished() if finished is None else finished,
            "saved_at": datetime.now().isoformat(timespec="seconds"),
        }

    def save(self, *names: str, finished: bool | None = None) -> None:
        """Write the current state under each of ``names`` (rank 0 only); ``finished`` False
        for a stop's save, which a retry must resume whatever the state."""
        if self.rank != 0 or not names:
            return
        state = self.state(finished)
        for name in names:
            checkpoint_file.save(self.run_dir / name, state)

    def after_step(self, result: StepResult) -> None:
        every = self.every_updates
        if every and self.trainer.step % every == 0:
            self.save("last.pt")

    def after_validation(self, improved: bool) -> None:
        self.save(*(["best.pt"] if improved else []), "last.pt")

    def after_epoch(self, epoch: int) -> None:
        every = self.save_every_epochs
        if every and epoch % every == 0:
            self.save(f"epoch_{epoch:04d}.pt")

    def clean_leftovers(self) -> list[Path]:
        """Temporary files of writes that a killed process left (rank 0 removes them)."""
        return checkpoint_file.clean_leftovers(self.run_dir) if self.rank == 0 else []

    def resume(self, path: Path, state: dict[str, Any]) -> None:
        """Restore everything from ``state`` (read from ``path``): weights, optimizer, schedule,
        EMA, RNG, position; refused when a key that changes the math, or the precision the
        runtime resolved, differs."""
        if "optimizer" not in state or "loader" not in state or "config" not in state:
            raise CheckpointError(f"{path}: holds weights only; it cannot be resumed")
        checkpoint_file.check_resumable(
            state, self.identity["config"], self.identity["global_batch"],
            self.trainer.precision, path,
        )  # fmt: skip
        self.trainer.load_state_dict(state)
        if self.ema is not None:
            if state.get("ema") is None:
                raise CheckpointError(f"{path}: has no EMA weights, but ema.enabled is true")
            self.ema.load_state_dict(state)
        checkpoint_file.set_rng_state(state["rng"])
        self.position.load_state_dict(state)

    def init_weights(self, path: Path) -> str:
        """Weights only (fine-tuning): the weight set ``path`` stands for (its run's
        ``ema.select_best_by``, as evaluation takes it), a fresh optimizer, schedule and
        position. Returns the name of the set."""
        state = checkpoint_file.load(path)
        if "config" not in state:
            raise CheckpointError(f"{path}: has no 'config' (not written by emb.training)")
        checkpoint_file.check_compatible(state["config"], self.identity["config"], path)
        chosen = checkpoint_file.selected_weights(state)
        weights = state["ema"] if chosen == "ema" else state["model"]
        checkpoint_file.unwrap(self.trainer.model).load_state_dict(weights)
        if self.ema is not None:
            self.ema.module.load_state_dict(weights)
        return chosen
