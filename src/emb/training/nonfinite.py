"""Non-finite steps counted on the device, read by the host only where it waits anyway.

A step cannot ask the host whether its gradient norm was finite without stalling the GPU
queue, so the trainer hands the answer (a 0-d bool tensor, agreed by every rank) to
:meth:`NonfiniteGuard.record`, which updates a few device scalars. :meth:`NonfiniteGuard.read`
brings them to the host at logging steps, stop checks, validations and checkpoints, and raises
:class:`TrainingDiverged` there when the policy's limit was reached: every rank reads the same
values at the same step, so every rank raises together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# the device vector's slots
SKIPPED, IN_ROW, LAST_STEP, LAST_NORM, HIT_STEP, HIT_NORM, HIT_ROW = range(7)


class TrainingDiverged(RuntimeError):
    """Non-finite gradients that the configured policy does not allow to skip."""


@dataclass(frozen=True)
class NonfiniteCounts:
    """The host's copy of the counts, as of one read."""

    skipped: int  # steps skipped in all
    in_row: int  # non-finite steps since the last applied one (counted ones only)
    last_step: int  # the last skipped step (0: none yet)
    last_norm: float  # its gradient norm


class NonfiniteGuard:
    """Device-side counts of skipped steps; the limit is checked when they are read.

    ``policy`` "stop" allows no non-finite step, "skip" allows ``max_in_row - 1`` in a row.
    """

    def __init__(self, device: torch.device, policy: str, max_in_row: int) -> None:
        self.policy, self.max_in_row = policy, max_in_row
        self.limit = 1 if policy == "stop" else max_in_row
        self.state = self._initial(device, 0, 0)

    @staticmethod
    def _initial(device: torch.device, skipped: int, in_row: int) -> torch.Tensor:
        values = [skipped, in_row, 0, math.nan, -1, math.nan, 0]
        return torch.tensor(values, dtype=torch.float64, device=device)

    def load(self, skipped: int, in_row: int) -> None:
        """Counts from a checkpoint (a resume goes on counting)."""
        self.state = self._initial(self.state.device, skipped, in_row)

    @torch.no_grad()
    def record(self, bad: torch.Tensor, counted: torch.Tensor, norm: torch.Tensor, step: int):
        """Step ``step`` was skipped where ``bad``; ``counted`` (a subset of ``bad``) adds to
        the run of non-finite steps (an fp16 overflow above scale 1 is routine and does not)."""
        s = self.state
        in_row = torch.where(counted, s[IN_ROW] + 1, torch.where(bad, s[IN_ROW], 0.0))
        norm = norm.detach().to(torch.float64)
        hit = counted & (in_row >= self.limit) & (s[HIT_STEP] < 0)
        self.state = torch.stack([
            s[SKIPPED] + bad.to(torch.float64),
            in_row,
            torch.where(bad, float(step), s[LAST_STEP]),
            torch.where(bad, norm, s[LAST_NORM]),
            torch.where(hit, float(step), s[HIT_STEP]),
            torch.where(hit, norm, s[HIT_NORM]),
            torch.where(hit, in_row, s[HIT_ROW]),
        ])  # fmt: skip

    def read(self) -> NonfiniteCounts:
        """The counts on the host (waits for the device); raises where the limit was hit."""
        s = self.state.tolist()
        if s[HIT_STEP] >= 0:
            where = f"optimizer step {int(s[HIT_STEP])}: gradient norm {s[HIT_NORM]}, "
            if self.policy == "stop":
                raise TrainingDiverged(where + "train.nonfinite_policy is stop")
            raise TrainingDiverged(
                where + f"{int(s[HIT_ROW])} non-finite steps in a row "
                f"(train.max_nonfinite_in_row = {self.max_in_row}): the run diverged"
            )
        return NonfiniteCounts(int(s[SKIPPED]), int(s[IN_ROW]), int(s[LAST_STEP]), s[LAST_NORM])
