"""Exponential moving average of a model: parameters averaged, buffers copied.

Copying buffers matters: an EMA that averaged parameters but kept its initial BatchNorm
running statistics validated as a broken model in the seeds' runs. The decay warms up as
``min(decay, (1 + n) / (10 + n))`` so short runs are not dominated by the initial weights.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from emb.training.checkpoint import unwrap


class ModelEma:
    """A frozen copy of a model that follows it by ``shadow = d * shadow + (1 - d) * model``."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.module = copy.deepcopy(unwrap(model)).eval()
        self.module.requires_grad_(False)
        self.decay = decay
        self.updates = 0

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Call after each optimizer step that changed ``model``."""
        d = self.current_decay()
        source = unwrap(model)
        for shadow, value in zip(self.module.parameters(), source.parameters(), strict=True):
            shadow.lerp_(value.detach(), 1.0 - d)
        for shadow, value in zip(self.module.buffers(), source.buffers(), strict=True):
            shadow.copy_(value)
        self.updates += 1

    @torch.no_grad()
    def update_buffers(self, model: nn.Module) -> None:
        """Copy buffers only: after BatchNorm statistics were averaged over ranks."""
        for shadow, value in zip(self.module.buffers(), unwrap(model).buffers(), strict=True):
            shadow.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        """The averaged weights and the update count, under checkpoint keys."""
        return {"ema": self.module.state_dict(), "ema_updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["ema"])
        self.updates = int(state["ema_updates"])
