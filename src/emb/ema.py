"""Exponential moving average of a model: parameters averaged, buffers copied.

Copying buffers matters: an EMA that averaged parameters but kept its initial BatchNorm
running statistics validated as a broken model in the seeds' runs. The decay warms up as
``min(decay, (1 + n) / (10 + n))`` so short runs are not dominated by the initial weights.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from emb.checkpoint import unwrap


class ModelEma(nn.Module):
    """A frozen copy of a model that follows it by ``shadow = d * shadow + (1 - d) * model``."""

    def __init__(self, model: nn.Module, decay: float = 0.999) -> None:
        super().__init__()
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
