"""When to validate and what follows: metrics of every weight set, early stopping, checkpoints.

Validation runs on the plain model, never on its DDP wrapper: DDP's forward broadcasts
BatchNorm buffers, a collective that a rank without validation batches would never join.
Every collective of a validation (buffer averaging, metric sums) is joined by every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from emb.loading.shard_manifest import ValidationTooSmall
from emb.training.checkpoint_file import unwrap
from emb.training.checkpoint_policy import Checkpointer
from emb.training.ema import ModelEma
from emb.training.run_log import RunLog
from emb.training.stop_request import StopRequest
from emb.training.trainer import StepResult, Trainer

if TYPE_CHECKING:
    from emb.training.schedule import Plan


@dataclass
class Position:
    """Where training stands: the loader's (epoch, micro-batch) and the early-stopping state."""

    epoch: int = 0
    batch: int = 0
    best: float = -1.0
    bad: int = 0
    validated_step: int = -1

    def state_dict(self) -> dict[str, Any]:
        return {
            "loader": {"epoch": self.epoch, "batch": self.batch},  # where the next batch is
            "epoch": self.epoch,
            "early_stop": {"best": self.best, "bad": self.bad},
            "validated_step": self.validated_step,  # a resume does not validate it again
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch = state["loader"]["epoch"], state["loader"]["batch"]
        self.best, self.bad = state["early_stop"]["best"], state["early_stop"]["bad"]
        self.validated_step = int(state.get("validated_step", -1))


class Validator:
    """Validates every ``every_updates`` optimizer steps, or at every epoch end when None."""

    def __init__(
        self,
        trainer: Trainer,
        ema: ModelEma | None,
        batches: Callable[[], Iterable],
        position: Position,
        checkpointer: Checkpointer,
        log: RunLog,
        stop: StopRequest,
        *,
        select_best_by: str,
        every_updates: int | None,
        patience: int,
        bn_batch_stats: bool,
        min_batch: int,
    ) -> None:
        self.trainer, self.ema, self.batches = trainer, ema, batches
        self.position, self.checkpointer, self.log = position, checkpointer, log
        self.stop = stop  # told how long a validation takes, for the deadline
        self.every_updates, self.patience = every_updates, patience
        self.bn_batch_stats, self.min_batch = bn_batch_stats, min_batch
        self.models = {"raw": unwrap(trainer.model)}
        if ema is not None:
            self.models = {"ema": ema.module, "raw": unwrap(trainer.model)}
        self.select = f"val_{select_best_by if ema is not None else 'raw'}_miou_l3"

    def due_after_step(self, result: StepResult) -> bool:
        every = self.every_updates
        return bool(every and self.trainer.step % every == 0)

    def due_at_epoch_end(self) -> bool:
        return not self.every_updates

    def due_soon(self, plan: Plan) -> bool:
        """A validation comes before, or right after, the next optimizer step: a stop check
        then budgets its time too, so it cannot run past the deadline."""
        step, left = self.trainer.step, plan.micro_per_epoch - self.position.batch
        if step + 1 >= plan.total:
            return True  # the final validation
        if self.every_updates:
            return (step + 1) % self.every_updates == 0
        return left <= plan.accumulation  # the epoch ends with the next step (or has ended)

    def finished(self, plan: Plan) -> bool:
        """Nothing left to train (updates, epochs or patience spent) and that state validated."""
        trainer, pos = self.trainer, self.position
        done = trainer.step >= plan.total or pos.epoch >= plan.epochs or pos.bad >= self.patience
        return done and pos.validated_step == trainer.step

    def validate(self) -> bool:
        """Validate, log, save best/last; True when early stopping says to stop."""
        trainer, pos = self.trainer, self.position
        started = time.perf_counter()
        trainer.average_buffers()
        if self.ema is not None:
            self.ema.update_buffers(trainer.model)
        result = trainer.validate(self.batches(), self.models, self.bn_batch_stats, self.min_batch)
        if not result["val_samples"]:  # summed over ranks: every rank raises alike
            raise ValidationTooSmall(
                f"validation at optimizer step {trainer.step} scored no sample (every batch "
                f"held fewer than train.val_min_batch {self.min_batch} samples, or the val "
                "split is empty): the run cannot choose a best model; give the val split more "
                "samples per rank or lower train.val_min_batch"
            )
        seconds = time.perf_counter() - started
        self.stop.record_validation(seconds)
        pos.validated_step = trainer.step
        improved = result[self.select] > pos.best
        pos.best, pos.bad = (result[self.select], 0) if improved else (pos.best, pos.bad + 1)
        result["best_val_miou_l3"] = pos.best
        self.log.validation(result, trainer, pos.epoch, seconds)
        self.checkpointer.after_validation(improved)
        return pos.bad >= self.patience

    def finish(self) -> None:
        """The final weights are validated (and saved) too."""
        if self.position.validated_step != self.trainer.step:
            self.validate()
